//! Executor calls, recorded by a decorator of the executor seam ([`ExecutorTransport`]):
//! `execution_provider_executor_calls_total{operation, outcome}` and
//! `execution_provider_executor_call_duration_seconds{operation}`.
//!
//! The operation is the helper's wire word (`file.read`, `command.start`, ...); the outcome
//! is `ok`, the helper's stable error code (`not_found`, `version_mismatch`, ...) or
//! `transport_error` when no structured answer came.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::latency_histogram;
use crate::executor::protocol::{ExecutorEnvelope, ExecutorRequest, Operation};
use crate::executor::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, SupervisorSession,
    SupervisorTarget, TransportError,
};
use crate::runtime::clock::Clock;

/// Labels of a finished executor call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The helper operation.
    pub operation: String,
    /// `ok`, the helper's error code, or `transport_error`.
    pub outcome: String,
}

/// Labels of an executor call's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The helper operation.
    pub operation: String,
}

/// The executor call counters and histograms.
#[derive(Clone)]
pub struct ExecutorMetrics {
    calls: Family<CallLabels, Counter>,
    duration: Family<OperationLabels, Histogram>,
    clock: Arc<dyn Clock>,
}

impl ExecutorMetrics {
    /// Registers the executor call metrics in `registry`.
    pub fn register(registry: &mut Registry, clock: Arc<dyn Clock>) -> Self {
        let calls = Family::<CallLabels, Counter>::default();
        let duration = Family::<OperationLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "executor_calls",
            "Helper calls in executors by operation and outcome",
            calls.clone(),
        );
        registry.register(
            "executor_call_duration_seconds",
            "Latency of helper calls in executors by operation",
            duration.clone(),
        );
        Self {
            calls,
            duration,
            clock,
        }
    }

    /// `transport`, with every call recorded here.
    pub fn wrap(&self, transport: Arc<dyn ExecutorTransport>) -> Arc<dyn ExecutorTransport> {
        Arc::new(MeteredTransport {
            inner: transport,
            metrics: self.clone(),
        })
    }
}

/// The operation label: the wire word of an operation of the vocabulary, `unknown` otherwise.
fn operation_label(operation: &Operation) -> String {
    match operation {
        Operation::Unknown(_) => "unknown".to_owned(),
        known => known.as_str().to_owned(),
    }
}

fn outcome_label(answer: &Result<ExecutorEnvelope, TransportError>) -> &'static str {
    match answer {
        Ok(ExecutorEnvelope {
            error: Some(error), ..
        }) => error.code.as_str(),
        Ok(_) => "ok",
        Err(_) => "transport_error",
    }
}

/// An executor transport whose calls are counted and timed.
struct MeteredTransport {
    inner: Arc<dyn ExecutorTransport>,
    metrics: ExecutorMetrics,
}

impl ExecutorTransport for MeteredTransport {
    /// Sessions are not metered; they must reach the inner transport (the trait's default
    /// would answer "unsupported").
    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        self.inner.supervisor(target)
    }

    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.metered(target, None, request, cancel)
    }

    fn execute_operation<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: &'a str,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.metered(target, Some(operation_id), request, cancel)
    }
}

impl MeteredTransport {
    /// One call, journaled under `operation_id` when given, counted and timed.
    fn metered<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: Option<&'a str>,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(async move {
            let operation = operation_label(&request.operation);
            let started = self.metrics.clock.monotonic();
            let answer = match operation_id {
                Some(id) => {
                    self.inner
                        .execute_operation(target, id, request, cancel)
                        .await
                }
                None => self.inner.execute(target, request, cancel).await,
            };
            let seconds = self
                .metrics
                .clock
                .monotonic()
                .duration_since(started)
                .as_secs_f64();
            self.metrics
                .duration
                .get_or_create(&OperationLabels {
                    operation: operation.clone(),
                })
                .observe(seconds);
            self.metrics
                .calls
                .get_or_create(&CallLabels {
                    operation,
                    outcome: outcome_label(&answer).to_owned(),
                })
                .inc();
            answer
        })
    }
}
