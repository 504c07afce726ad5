//! The simulator's executor node: the helper's file and command contract on an in-memory
//! workspace per environment, behind the production `ExecutorTransport` seam. It records every
//! side effect it performs (so the checker can prove "executed at most once") and, when the
//! seed says so, crashes mid-command: the effect may have happened but no answer comes back,
//! which the store must treat as an unknown outcome and fence.
//!
//! Commands end at once unless a hand-driven race sets a command time; a command that runs for
//! a while can be cancelled (the caller's cancel signal in process, the caller closing its
//! side of the connection on a node, as the helper reads EOF on stdin): it stops without its
//! effect and answers `cancelled` (exit code -1), like the helper killing its process group.
//! Such commands leave `started`, `ran` or `cancelled` lines in the trace.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use execution_provider::executor::protocol::{
    CommandState, CommandStatus, ExecutorEnvelope, ExecutorRequest, ExecutorResponse,
    MAX_COMMAND_BYTES, Operation, decode_strict, terminal_receipt,
};
use execution_provider::executor::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, TransportError,
};
use execution_provider::helper::error::HelperError;
use execution_provider::helper::{
    FRAME_TOO_LARGE_MESSAGE, PROVIDER_ONLY_MESSAGE, UNSUPPORTED_MESSAGE, check_bounds,
    effective_limit,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::memfs::{MemFs, resolve};
use crate::supervision::CommandLedger;
use crate::trace::Trace;

pub use crate::memfs::WORKSPACE_ROOT;

/// One side effect the executor performed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Effect {
    /// The environment.
    pub environment: String,
    /// The operation.
    pub operation: String,
    /// The path or command id it acted on.
    pub subject: String,
}

#[derive(Default)]
struct State {
    workspaces: BTreeMap<String, MemFs>,
    effects: Vec<Effect>,
    commands_seen: BTreeSet<String>,
    duplicate_commands: Vec<String>,
    cancelled: Vec<Effect>,
}

/// The trace actor of the executor called in process.
const IN_PROCESS: &str = "executor";

/// The in-memory executor shared by every replica (it stands for the executor Pods).
#[derive(Clone)]
pub struct MemExecutor {
    state: Arc<Mutex<State>>,
    faults: Arc<Mutex<(StdRng, f64)>>,
    latency: Duration,
    /// How long a command runs before it ends (zero: at once; set by hand-driven races).
    command_time: Arc<Mutex<Duration>>,
    /// Where commands that run for a while are traced (set with the first command time).
    trace: Arc<Mutex<Option<Trace>>>,
    /// The lives of the commands the node's supervisors started.
    commands: CommandLedger,
}

impl MemExecutor {
    /// An executor that crashes mid-command with probability `crash_rate`, with faults drawn
    /// from `seed`, answering after `latency`.
    pub fn new(seed: u64, crash_rate: f64, latency: Duration) -> Self {
        Self {
            state: Arc::default(),
            faults: Arc::new(Mutex::new((StdRng::seed_from_u64(seed), crash_rate))),
            latency,
            command_time: Arc::default(),
            trace: Arc::default(),
            commands: CommandLedger::default(),
        }
    }

    /// The lives of the commands the node's supervisors started (shared by every clone).
    pub fn commands(&self) -> CommandLedger {
        self.commands.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("executor state lock poisoned")
    }

    /// Every side effect performed so far, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// The commands stopped by a cancel before their effect, in order (the subject is the
    /// command id).
    pub fn cancelled(&self) -> Vec<Effect> {
        self.lock().cancelled.clone()
    }

    /// Command ids the executor was asked to run more than once.
    pub fn duplicate_commands(&self) -> Vec<String> {
        self.lock().duplicate_commands.clone()
    }

    /// Sets the crash probability (0 stops executor faults, for the liveness phase).
    pub fn set_crash_rate(&self, rate: f64) {
        self.faults.lock().expect("fault lock poisoned").1 = rate;
    }

    fn crashes(&self) -> bool {
        let mut faults = self.faults.lock().expect("fault lock poisoned");
        let rate = faults.1;
        rate > 0.0 && faults.0.random_bool(rate.min(1.0))
    }

    /// Makes every command started from now on run for `time` (in simulated time) before it
    /// takes effect and ends; zero (the default) ends commands at once.
    pub fn set_command_time(&self, time: Duration) {
        *self
            .command_time
            .lock()
            .expect("command time lock poisoned") = time;
    }

    /// Traces the commands that run for a while (`started`, `ran`, `cancelled` lines) into
    /// `trace` from now on.
    pub fn trace_commands(&self, trace: Trace) {
        *self.trace.lock().expect("trace lock poisoned") = Some(trace);
    }

    fn note(&self, actor: &str, event: &str, environment: &str, request: &ExecutorRequest) {
        if let Some(trace) = self.trace.lock().expect("trace lock poisoned").as_ref() {
            let id = &request.command_id;
            trace.record(actor, format!("{event} command {id} on {environment}"));
        }
    }

    /// How long the command in this raw request frame runs before it ends: `None` when it is
    /// not a valid command or commands end at once (so the default adds no timer at all).
    pub fn command_time(&self, frame: &[u8]) -> Option<Duration> {
        let request = decode_strict::<ExecutorRequest>(frame).ok()?;
        self.run_time(&request)
    }

    /// [`MemExecutor::command_time`] of a decoded request: an invalid command is refused at
    /// once, as the helper does before it starts anything.
    fn run_time(&self, request: &ExecutorRequest) -> Option<Duration> {
        let time = *self
            .command_time
            .lock()
            .expect("command time lock poisoned");
        let runs = request.operation == Operation::CommandStart
            && check_bounds(request).is_ok()
            && validate_command(request).is_ok();
        (runs && !time.is_zero()).then_some(time)
    }

    /// Runs the command in this raw request frame on behalf of `actor` (a node host), which
    /// calls it when the command's time is up: like [`MemExecutor::serve_frame`], traced.
    pub fn finish_frame(
        &self,
        actor: &str,
        environment: &str,
        frame: &[u8],
    ) -> Option<ExecutorEnvelope> {
        if let Ok(request) = decode_strict::<ExecutorRequest>(frame) {
            self.note(actor, "ran", environment, &request);
        }
        self.serve_frame(environment, frame)
    }

    /// Notes that `actor` started the command in this raw request frame (one that runs for a
    /// while: see [`MemExecutor::command_time`]).
    pub fn start_frame(&self, actor: &str, environment: &str, frame: &[u8]) {
        if let Ok(request) = decode_strict::<ExecutorRequest>(frame) {
            self.note(actor, "started", environment, &request);
        }
    }

    /// Stops the running command of this raw request frame because its caller cancelled:
    /// no effect, the answer `cancelled`. The frame is one [`MemExecutor::command_time`]
    /// gave a time for.
    pub fn cancel_frame(&self, actor: &str, environment: &str, frame: &[u8]) -> ExecutorEnvelope {
        match decode_strict::<ExecutorRequest>(frame) {
            Ok(request) => self.cancel(actor, environment, &request),
            Err(_) => self.apply_frame(environment, frame),
        }
    }

    /// Stops a running command: the id counts as run (a second start is a duplicate, since a
    /// real command may have done part of its work), nothing else changes, and the answer is
    /// `cancelled` with exit code -1 and no output, as the helper reports a killed command.
    fn cancel(
        &self,
        actor: &str,
        environment: &str,
        request: &ExecutorRequest,
    ) -> ExecutorEnvelope {
        self.note(actor, "cancelled", environment, request);
        let mut state = self.lock();
        if !state.commands_seen.insert(request.command_id.clone()) {
            state.duplicate_commands.push(request.command_id.clone());
        }
        state.cancelled.push(Effect {
            environment: environment.to_owned(),
            operation: request.operation.as_str().to_owned(),
            subject: request.command_id.clone(),
        });
        let id = &request.command_id;
        ExecutorEnvelope::response(ExecutorResponse {
            command: Some(CommandStatus {
                command_id: id.clone(),
                state: CommandState::Cancelled,
                exit_code: -1,
                terminal_receipt: terminal_receipt(id, b"", b""),
                stdout: Vec::new(),
                stderr: Vec::new(),
                next_offset: 0,
                truncated: false,
            }),
            ..ExecutorResponse::default()
        })
    }

    /// How long the executor takes to answer.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// What a hosted node does with one raw request frame: runs it like
    /// [`MemExecutor::apply_frame`], and when the seed says so crashes mid-command after the
    /// effect (`None`: the answer is lost).
    pub fn serve_frame(&self, environment: &str, frame: &[u8]) -> Option<ExecutorEnvelope> {
        let is_command = decode_strict::<ExecutorRequest>(frame)
            .is_ok_and(|request| request.operation == Operation::CommandStart);
        let envelope = self.apply_frame(environment, frame);
        if is_command && self.crashes() {
            return None;
        }
        Some(envelope)
    }

    /// Runs one raw request frame (as the helper reads it from stdin) in `environment`.
    pub fn apply_frame(&self, environment: &str, frame: &[u8]) -> ExecutorEnvelope {
        let decoded = if frame.len() > execution_provider::executor::protocol::MAX_JSON_BODY {
            Err(HelperError::ResourceExhausted(FRAME_TOO_LARGE_MESSAGE))
        } else {
            decode_strict::<ExecutorRequest>(frame)
                .map_err(|e| HelperError::InvalidArgument(e.to_string()))
        };
        match decoded {
            Ok(request) => self.apply(environment, &request),
            Err(error) => ExecutorEnvelope::error(error.to_wire()),
        }
    }

    /// Runs one request in `environment`'s workspace.
    pub fn apply(&self, environment: &str, request: &ExecutorRequest) -> ExecutorEnvelope {
        match self.perform(environment, request) {
            Ok(response) => ExecutorEnvelope::response(response),
            Err(error) => ExecutorEnvelope::error(error.to_wire()),
        }
    }

    fn perform(
        &self,
        environment: &str,
        request: &ExecutorRequest,
    ) -> Result<ExecutorResponse, HelperError> {
        check_bounds(request)?;
        let mut state = self.lock();
        let state = &mut *state;
        let fs = state.workspaces.entry(environment.to_owned()).or_default();
        let path = || resolve(&request.path);
        let destination = || resolve(&request.destination);
        let mut effect = None;
        let result = match &request.operation {
            Operation::FileRead => fs.read(&path()?),
            Operation::FileStat => fs.stat(&path()?),
            Operation::FileList => fs.list(&path()?, effective_limit(request.limit)),
            Operation::FileResolveAuthority => Ok(fs.resolve_authority(&path()?)),
            Operation::FileCreate => {
                let p = path()?;
                effect = Some(p.clone());
                fs.create(&p, &request.data)
            }
            Operation::FileReplace => {
                let p = path()?;
                effect = Some(p.clone());
                fs.replace(&p, &request.data, &request.version)
            }
            Operation::FileRemove => {
                let p = path()?;
                effect = Some(p.clone());
                fs.remove(&p)
            }
            Operation::FileRename | Operation::FileCopy => {
                let (from, to) = (path()?, destination()?);
                effect = Some(to.clone());
                fs.transfer(&from, &to, request.operation == Operation::FileCopy)
            }
            Operation::CommandStart => {
                validate_command(request)?;
                if !state.commands_seen.insert(request.command_id.clone()) {
                    state.duplicate_commands.push(request.command_id.clone());
                }
                effect = Some(request.command_id.clone());
                Ok(run_script(&request.command_id, &request.command))
            }
            Operation::FileGlob | Operation::FileGrep | Operation::Unknown(_) => {
                Err(HelperError::InvalidArgument(UNSUPPORTED_MESSAGE.to_owned()))
            }
            _ => Err(HelperError::InvalidArgument(
                PROVIDER_ONLY_MESSAGE.to_owned(),
            )),
        };
        if let (Ok(_), Some(subject)) = (&result, effect) {
            state.effects.push(Effect {
                environment: environment.to_owned(),
                operation: request.operation.as_str().to_owned(),
                subject,
            });
        }
        result
    }
}

fn validate_command(request: &ExecutorRequest) -> Result<(), HelperError> {
    if request.command_id.is_empty() {
        return Err(HelperError::InvalidArgument(
            "command_id is required".to_owned(),
        ));
    }
    if request.command.is_empty() || request.command.len() > MAX_COMMAND_BYTES {
        return Err(HelperError::InvalidArgument(format!(
            "command must be 1 to {MAX_COMMAND_BYTES} bytes"
        )));
    }
    Ok(())
}

/// A tiny shell: `echo WORDS` prints them, `exit N` exits with N, `true` succeeds; anything
/// else is "command not found" (127), as `/bin/sh` would say.
fn run_script(command_id: &str, script: &str) -> ExecutorResponse {
    let (stdout, stderr, exit_code) = match script.split_once(' ').unwrap_or((script, "")) {
        ("echo", words) => (format!("{words}\n").into_bytes(), Vec::new(), 0),
        ("exit", code) => (Vec::new(), Vec::new(), code.trim().parse().unwrap_or(2)),
        ("true", _) => (Vec::new(), Vec::new(), 0),
        (name, _) => (
            Vec::new(),
            format!("sh: {name}: not found\n").into_bytes(),
            127,
        ),
    };
    let state = if exit_code == 0 {
        CommandState::Succeeded
    } else {
        CommandState::Failed
    };
    ExecutorResponse {
        command: Some(CommandStatus {
            command_id: command_id.to_owned(),
            state,
            exit_code,
            terminal_receipt: terminal_receipt(command_id, &stdout, &stderr),
            stdout,
            stderr,
            next_offset: 0,
            truncated: false,
        }),
        ..ExecutorResponse::default()
    }
}

impl ExecutorTransport for MemExecutor {
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        // Firing `cancel` stops a command that runs for a while (the helper's stdin closing);
        // one that ends at once has ended before anyone could cancel it.
        Box::pin(async move {
            execution_provider::executor::transport::encode_request(&request)?;
            tokio::time::sleep(self.latency).await;
            let environment = &target.environment;
            if let Some(time) = self.run_time(&request) {
                self.note(IN_PROCESS, "started", environment, &request);
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => {
                        return Ok(self.cancel(IN_PROCESS, environment, &request));
                    }
                    () = tokio::time::sleep(time) => {
                        self.note(IN_PROCESS, "ran", environment, &request);
                    }
                }
            }
            let envelope = self.apply(environment, &request);
            if request.operation == Operation::CommandStart && self.crashes() {
                return Err(TransportError::stream("executor crashed mid-command"));
            }
            Ok(envelope)
        })
    }
}

/// The simulated node agent reports a deleted executor Pod terminated at once, as it always
/// did: the simulator models no processes beyond the calls themselves (a command runs inside
/// its call), so there is nothing for it to end. It does not model `dev`'s proof.
impl execution_provider::executor::environment_end::EnvironmentProcesses for MemExecutor {
    fn end<'a>(
        &'a self,
        _environment: &'a str,
    ) -> BoxFuture<'a, Result<(), execution_provider::executor::environment_end::ProcessesRemain>>
    {
        Box::pin(async { Ok(()) })
    }
}
