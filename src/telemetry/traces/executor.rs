//! The span of each executor call made inside a traced call, from a decorator of the executor
//! seam (beside the call metrics, [`crate::metrics::executor`]).
//!
//! A client span named `executor <operation>` (`executor file.read`) with the attributes
//! `executor.operation` (the helper's wire word) and `executor.outcome` (`ok`, the helper's
//! stable error code, or `transport_error`, which also marks the span as an error). Opening a
//! supervisor session is the span `executor supervisor.session`. Nothing of the request (paths,
//! contents, command text) and nothing of the target but the environment id is recorded.

use std::sync::Arc;

use tracing::Instrument as _;

use crate::child_span;
use crate::executor::protocol::{ExecutorEnvelope, ExecutorRequest, Operation};
use crate::executor::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, SupervisorSession,
    SupervisorTarget, TransportError,
};

/// `transport`, with every call made inside a traced call in its own span.
pub fn traced(transport: Arc<dyn ExecutorTransport>) -> Arc<dyn ExecutorTransport> {
    Arc::new(TracedTransport { inner: transport })
}

/// An executor transport whose calls are traced.
struct TracedTransport {
    inner: Arc<dyn ExecutorTransport>,
}

/// The operation's wire word, `unknown` outside the vocabulary.
pub fn operation_word(operation: &Operation) -> &str {
    match operation {
        Operation::Unknown(_) => "unknown",
        known => known.as_str(),
    }
}

fn outcome(answer: &Result<ExecutorEnvelope, TransportError>) -> &str {
    match answer {
        Ok(ExecutorEnvelope {
            error: Some(error), ..
        }) => error.code.as_str(),
        Ok(_) => "ok",
        Err(_) => "transport_error",
    }
}

fn call_span(operation: &str, environment: &str) -> tracing::Span {
    child_span!(
        "executor",
        otel.name = %format_args!("executor {operation}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        executor.operation = operation,
        executor.outcome = tracing::field::Empty,
        environment = environment,
    )
}

impl ExecutorTransport for TracedTransport {
    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        let span = call_span("supervisor.session", &target.executor.environment);
        Box::pin(
            async move {
                let session = self.inner.supervisor(target).await;
                let word = if session.is_ok() {
                    "ok"
                } else {
                    "transport_error"
                };
                tracing::Span::current().record("executor.outcome", word);
                if session.is_err() {
                    tracing::Span::current().record("otel.status_code", "error");
                }
                session
            }
            .instrument(span),
        )
    }

    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.traced_call(target, None, request, cancel)
    }

    fn execute_operation<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: &'a str,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.traced_call(target, Some(operation_id), request, cancel)
    }
}

impl TracedTransport {
    /// One call, journaled under `operation_id` when given, in its span.
    fn traced_call<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: Option<&'a str>,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        let span = call_span(operation_word(&request.operation), &target.environment);
        Box::pin(
            async move {
                let answer = match operation_id {
                    Some(id) => {
                        self.inner
                            .execute_operation(target, id, request, cancel)
                            .await
                    }
                    None => self.inner.execute(target, request, cancel).await,
                };
                let current = tracing::Span::current();
                current.record("executor.outcome", outcome(&answer));
                if answer.is_err() {
                    current.record("otel.status_code", "error");
                }
                answer
            }
            .instrument(span),
        )
    }
}
