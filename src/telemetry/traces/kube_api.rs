//! The span of each Kubernetes API request made inside a traced call, from a tower layer on the
//! transport of the `kube::Client` (beside the request metrics, [`crate::metrics::kube_api`]).
//!
//! A client span named `<verb> <resource>` (`update executionenvironments/status`), with the
//! attributes `k8s.verb`, `k8s.resource` and `http.response.status_code` (absent when no
//! response came, and then an error). The verb and resource are classified as the metrics
//! classify them: never an object's name or namespace. The span ends at the response head.
//!
//! The client queues requests for a worker task, which runs this layer inside the caller's
//! span; a request made outside any span (the reconciler's watches and passes) has none.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::Instrument as _;

use super::TARGET;
use crate::metrics::kube_api::classify;

/// The tower layer that traces Kubernetes API requests.
#[derive(Clone, Copy, Debug, Default)]
pub struct KubeApiTraceLayer;

impl<S> tower::Layer<S> for KubeApiTraceLayer {
    type Service = TracedRequests<S>;

    fn layer(&self, inner: S) -> TracedRequests<S> {
        TracedRequests { inner }
    }
}

/// A Kubernetes client transport whose requests each run in their own span.
#[derive(Clone)]
pub struct TracedRequests<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for TracedRequests<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Outside a traced call there is nothing to be a child of.
        if tracing::Span::current().is_none() {
            return Box::pin(self.inner.call(request));
        }
        let labels = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let span = tracing::info_span!(
            target: TARGET,
            "kube.request",
            otel.name = %format_args!("{} {}", labels.verb, labels.resource),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            k8s.verb = %labels.verb,
            k8s.resource = %labels.resource,
            http.response.status_code = tracing::field::Empty,
        );
        let call = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        let recorded = span.clone();
        Box::pin(
            async move {
                let answered = call.await;
                match &answered {
                    Ok(response) => {
                        let status = response.status();
                        recorded.record("http.response.status_code", i64::from(status.as_u16()));
                        if status.is_server_error() {
                            recorded.record("otel.status_code", "error");
                        }
                    }
                    Err(_) => {
                        recorded.record("otel.status_code", "error");
                    }
                }
                answered
            }
            .instrument(span),
        )
    }
}
