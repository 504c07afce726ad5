//! The executor seam: how the provider runs one helper request in an environment's executor.
//!
//! Production runs `execution-helper` through `pods/exec`, `dev` runs it as a local process
//! ([`super::local::LocalTransport`]) and the simulator runs the helper logic in memory. All of
//! them implement [`ExecutorTransport`], which is dyn-compatible so the provider holds an
//! `Arc<dyn ExecutorTransport>`.

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::protocol::{
    DecodeError, ErrorCode, ExecutorEnvelope, ExecutorRequest, MAX_JSON_BODY, decode_strict,
};
use super::supervisor_client::SupervisorConnection;

/// A boxed, sendable future, so that the trait stays dyn-compatible.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a request runs: the executor Pod of one environment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExecutorTarget {
    /// The provider namespace the Pod lives in.
    pub namespace: String,
    /// The executor Pod.
    pub pod_name: String,
    /// The environment (the `ExecutionEnvironment` name); the local transport keys the workspace
    /// directory by it.
    pub environment: String,
}

/// The executor Pod whose supervisor a session is opened with: the target plus the Pod's UID,
/// which the per-Pod secret is derived with (docs/commands.md §4.2).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SupervisorTarget {
    /// The executor Pod.
    pub executor: ExecutorTarget,
    /// The Pod's UID as the status records it (`status.pod.uid`).
    pub pod_uid: String,
}

/// The reading half of a supervisor session's byte stream (a Unix socket, a relay session).
pub type SessionReader = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a supervisor session's byte stream.
pub type SessionWriter = Box<dyn AsyncWrite + Send + Unpin>;
/// An authenticated connection to one environment's supervisor, enrolled with its secret:
/// every request is tagged and every reply verified by [`SupervisorConnection`].
pub type SupervisorSession = SupervisorConnection<SessionReader, SessionWriter>;

/// Runs helper requests in executors.
///
/// Contract for every implementation:
/// * the request is encoded with [`encode_request`]: over [`MAX_JSON_BODY`] gives
///   [`TransportError::RequestTooLarge`] and nothing is sent;
/// * the helper's answer is decoded with [`decode_envelope`], so an `Ok` envelope has exactly one
///   of `response` and `error` set;
/// * for `command.start`, firing `cancel` closes the helper's stdin (the helper's cancel signal)
///   and the call still waits for the helper's answer, which then says `cancelled`;
/// * dropping the returned future abandons the call: the helper's stdin is closed and the helper
///   process or stream is torn down.
pub trait ExecutorTransport: Send + Sync + 'static {
    /// Runs one helper request in the executor of `target` and returns its decoded envelope.
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>>;

    /// [`ExecutorTransport::execute`] under the store's `operation_id`: a transport whose
    /// calls run through the executor's supervisor has it journal the call under that id
    /// (running, then its outcome and receipt), so that the reconciler can ask after it when
    /// the call's holder is gone. The default runs the call unjournaled; the supervisor then
    /// knows nothing of it and the reconciler fences, as for any executor that cannot answer.
    fn execute_operation<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: &'a str,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        let _ = operation_id;
        self.execute(target, request, cancel)
    }

    /// Opens an authenticated session with the supervisor of `target`'s executor
    /// (docs/commands.md §4): connected, the hello read, and enrolled with the Pod's secret
    /// when the supervisor was not yet. Nothing is started by opening a session.
    ///
    /// Errors: [`TransportError::Unsupported`] when this executor has no supervisor (the
    /// default); [`TransportError::InvalidTarget`] for a target it cannot name; anything else
    /// (unreachable, refused enrollment, a forged answer) is [`TransportError::StreamFailed`].
    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        let _ = target;
        Box::pin(async { Err(TransportError::Unsupported) })
    }
}

/// Why a helper call gave no structured answer.
///
/// Only [`TransportError::RequestTooLarge`] is controlled (nothing was sent). Every other
/// variant is uncontrolled: the request may or may not have taken effect, so the store fences.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The encoded request is over [`MAX_JSON_BODY`]; nothing was sent.
    #[error("executor request exceeds limit")]
    RequestTooLarge {
        /// The encoded size.
        bytes: usize,
    },
    /// The target does not name a usable executor; nothing was sent.
    #[error("invalid executor target: {reason}")]
    InvalidTarget {
        /// What is wrong with it.
        reason: String,
    },
    /// The stream (exec session or local process) failed, overflowed or timed out.
    #[error("executor stream failed: {reason}")]
    StreamFailed {
        /// What failed.
        reason: String,
    },
    /// The helper's stdout was not exactly one valid envelope.
    #[error("invalid executor response: {reason}")]
    InvalidResponse {
        /// What was wrong.
        reason: String,
    },
    /// The envelope had neither a response nor an error.
    #[error("executor returned no result")]
    NoResult,
    /// This executor has no supervisor, so it cannot run supervised (detached, streamed,
    /// interactive) commands; nothing was sent.
    #[error("supervised commands are not supported by this executor")]
    Unsupported,
}

impl TransportError {
    /// A stream failure with `reason`.
    pub fn stream(reason: impl Into<String>) -> Self {
        TransportError::StreamFailed {
            reason: reason.into(),
        }
    }

    /// The wire code of a controlled error; `None` for uncontrolled ones.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            TransportError::RequestTooLarge { .. } => Some(ErrorCode::ResourceExhausted),
            TransportError::Unsupported => Some(ErrorCode::InvalidArgument),
            _ => None,
        }
    }

    /// True when the request may have taken effect without a structured answer, so the caller
    /// must fence.
    pub fn is_uncontrolled(&self) -> bool {
        self.code().is_none()
    }
}

/// Encodes a request for the helper, refusing anything over [`MAX_JSON_BODY`].
pub fn encode_request(request: &ExecutorRequest) -> Result<Vec<u8>, TransportError> {
    let bytes = serde_json::to_vec(request).expect("an ExecutorRequest always encodes as JSON");
    if bytes.len() > MAX_JSON_BODY {
        return Err(TransportError::RequestTooLarge { bytes: bytes.len() });
    }
    Ok(bytes)
}

/// Decodes the helper's stdout strictly as one envelope with exactly one of `response` and
/// `error` set.
pub fn decode_envelope(stdout: &[u8]) -> Result<ExecutorEnvelope, TransportError> {
    let envelope: ExecutorEnvelope =
        decode_strict(stdout).map_err(|e| TransportError::InvalidResponse {
            reason: match e {
                DecodeError::Json(m) => m,
                DecodeError::NotOneValue => "more than one JSON value".to_owned(),
            },
        })?;
    match (&envelope.response, &envelope.error) {
        (Some(_), Some(_)) => Err(TransportError::InvalidResponse {
            reason: "both response and error set".to_owned(),
        }),
        (None, None) => Err(TransportError::NoResult),
        _ => Ok(envelope),
    }
}

/// The caller's side of a command cancellation: [`CancelHandle::cancel`] fires every
/// [`CancelSignal`] made from it. Dropping the handle does not cancel.
#[derive(Debug)]
pub struct CancelHandle {
    sender: watch::Sender<bool>,
}

impl CancelHandle {
    /// A handle and its signal.
    pub fn new() -> (CancelHandle, CancelSignal) {
        let (sender, receiver) = watch::channel(false);
        (
            CancelHandle { sender },
            CancelSignal {
                receiver: Some(receiver),
            },
        )
    }

    /// Fires the signal.
    pub fn cancel(&self) {
        self.sender.send_replace(true);
    }
}

/// Tells a transport that the caller wants a running command cancelled.
#[derive(Clone, Debug)]
pub struct CancelSignal {
    receiver: Option<watch::Receiver<bool>>,
}

impl CancelSignal {
    /// A signal that never fires.
    pub fn never() -> Self {
        CancelSignal { receiver: None }
    }

    /// True once the handle has cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.receiver.as_ref().is_some_and(|r| *r.borrow())
    }

    /// Completes when the handle cancels; never completes otherwise.
    pub async fn cancelled(&self) {
        if let Some(receiver) = &self.receiver {
            let mut receiver = receiver.clone();
            if receiver.wait_for(|cancelled| *cancelled).await.is_ok() {
                return;
            }
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::protocol::{ExecutorError, ExecutorResponse, Operation};

    #[test]
    fn an_arc_dyn_transport_is_possible() {
        struct Refuse;
        impl ExecutorTransport for Refuse {
            fn execute<'a>(
                &'a self,
                _target: &'a ExecutorTarget,
                _request: ExecutorRequest,
                _cancel: CancelSignal,
            ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
                Box::pin(async { Err(TransportError::NoResult) })
            }
        }
        let transport: std::sync::Arc<dyn ExecutorTransport> = std::sync::Arc::new(Refuse);
        let target = ExecutorTarget {
            namespace: "ns".into(),
            pod_name: "executor-1".into(),
            environment: "exec-1".into(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = runtime.block_on(transport.execute(
            &target,
            ExecutorRequest::new(Operation::FileStat),
            CancelSignal::never(),
        ));
        assert_eq!(result, Err(TransportError::NoResult));
    }

    #[test]
    fn an_oversize_request_is_refused_before_sending_as_resource_exhausted() {
        let mut request = ExecutorRequest::at(Operation::FileCreate, "big");
        request.data = vec![0; MAX_JSON_BODY];
        let err = encode_request(&request).unwrap_err();
        assert!(matches!(err, TransportError::RequestTooLarge { .. }));
        assert_eq!(err.code(), Some(ErrorCode::ResourceExhausted));
        assert!(!err.is_uncontrolled());
    }

    #[test]
    fn envelopes_with_both_or_neither_outcome_are_uncontrolled() {
        let both = serde_json::to_vec(&ExecutorEnvelope {
            response: Some(ExecutorResponse::default()),
            error: Some(ExecutorError::new(ErrorCode::Internal, "x")),
        })
        .unwrap();
        let err = decode_envelope(&both).unwrap_err();
        assert!(matches!(err, TransportError::InvalidResponse { .. }));
        assert!(err.is_uncontrolled());
        assert_eq!(
            decode_envelope(b"{}").unwrap_err(),
            TransportError::NoResult
        );
        assert!(matches!(
            decode_envelope(b"{\"response\":{}}\n{\"response\":{}}"),
            Err(TransportError::InvalidResponse { .. })
        ));
        assert!(decode_envelope(b"{\"response\":{}}\n").is_ok());
    }

    #[test]
    fn a_cancel_signal_fires_only_when_cancelled() {
        let (handle, signal) = CancelHandle::new();
        assert!(!signal.is_cancelled());
        handle.cancel();
        assert!(signal.is_cancelled());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(signal.cancelled());
        assert!(!CancelSignal::never().is_cancelled());
    }
}
