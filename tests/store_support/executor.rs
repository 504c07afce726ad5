//! The scripted executor of the store tests: answers as the test says and records calls.

use std::sync::Mutex;
use std::time::Duration;

use execution_provider::executor::protocol::{
    CommandState, CommandStatus, ExecutorEnvelope, ExecutorError, ExecutorRequest, ExecutorResponse,
};
use execution_provider::executor::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, TransportError,
};

/// What the scripted executor does with the next call.
#[derive(Debug, Clone)]
pub enum Script {
    /// Answer with an empty success.
    Succeed,
    /// Fail the stream (an uncertain outcome).
    Break,
    /// Wait until the cancel signal fires, then fail the stream.
    WaitForCancel,
    /// Take this long (tokio time), then succeed.
    Sleep(Duration),
    /// Refuse with a typed helper error.
    Refuse(execution_provider::executor::ErrorCode),
    /// Answer a command with this receipt and output.
    Command {
        receipt: &'static str,
        output: usize,
    },
}

/// An executor whose answers the test scripts; it records every call.
#[derive(Debug, Default)]
pub struct ScriptedExecutor {
    pub calls: Mutex<Vec<ExecutorRequest>>,
    pub script: Mutex<Vec<Script>>,
    pub cancelled: Mutex<usize>,
}

impl ScriptedExecutor {
    pub fn push(&self, step: Script) {
        self.script.lock().expect("script").push(step);
    }

    pub fn call_count(&self) -> usize {
        self.calls.lock().expect("calls").len()
    }
}

impl ExecutorTransport for ScriptedExecutor {
    fn execute<'a>(
        &'a self,
        _target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.calls.lock().expect("calls").push(request);
        let step = {
            let mut script = self.script.lock().expect("script");
            if script.is_empty() {
                Script::Succeed
            } else {
                script.remove(0)
            }
        };
        Box::pin(async move {
            match step {
                Script::Succeed => Ok(ExecutorEnvelope::response(ExecutorResponse::default())),
                Script::Break => Err(TransportError::stream("injected")),
                Script::Sleep(d) => {
                    tokio::time::sleep(d).await;
                    Ok(ExecutorEnvelope::response(ExecutorResponse::default()))
                }
                Script::Refuse(code) => Ok(ExecutorEnvelope::error(ExecutorError {
                    code,
                    message: "refused".to_owned(),
                    retryable: false,
                })),
                Script::Command { receipt, output } => {
                    let command = CommandStatus {
                        command_id: "cmd".to_owned(),
                        state: CommandState::Succeeded,
                        exit_code: 0,
                        stdout: vec![b'x'; output],
                        stderr: Vec::new(),
                        next_offset: 0,
                        truncated: false,
                        terminal_receipt: receipt.to_owned(),
                    };
                    Ok(ExecutorEnvelope::response(ExecutorResponse {
                        command: Some(command),
                        ..ExecutorResponse::default()
                    }))
                }
                Script::WaitForCancel => {
                    cancel.cancelled().await;
                    *self.cancelled.lock().expect("cancelled") += 1;
                    Err(TransportError::stream("cancelled"))
                }
            }
        })
    }
}
