//! The span of each RPC of the execution service, made by a tower layer around it: the root
//! of the call's trace, or a child of the caller's span when the call's gRPC metadata carries
//! W3C trace context (`traceparent`, `tracestate`).
//!
//! The span is named `<service>/<method>` (a server span); its attributes are `rpc.system`
//! (`grpc`), `rpc.service`, `rpc.method` (a method the service declares, or `unknown`, as the
//! metrics name it) and `rpc.grpc.status_code`, the code of the response head (a head without
//! one is a unary success). Codes that mean the server failed (`UNKNOWN`, `DEADLINE_EXCEEDED`,
//! `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`) mark the span as an error; a refusal
//! of the caller's request does not. Nothing of the request's message is read. A streaming
//! call's span ends when its response head is sent.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::server::NamedService;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::TARGET;
use crate::metrics::RpcMetrics;
use crate::metrics::rpc::response_code;

/// gRPC metadata (the request's HTTP/2 headers) as a carrier of W3C trace context.
pub struct MetadataExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// The trace context a request's metadata carries (empty when it carries none or a malformed
/// one).
pub fn remote_context(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(headers))
}

/// Whether `code` means the server failed rather than refused (OpenTelemetry's gRPC rules).
pub fn is_server_error(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unimplemented
            | tonic::Code::Internal
            | tonic::Code::Unavailable
            | tonic::Code::DataLoss
    )
}

/// The tower layer that opens a span for every call of a gRPC service.
#[derive(Clone)]
pub struct RpcTraceLayer {
    methods: RpcMetrics,
}

impl RpcTraceLayer {
    /// A layer naming methods as `methods` does (bounded to the service's own).
    pub fn new(methods: RpcMetrics) -> Self {
        Self { methods }
    }
}

impl<S> tower::Layer<S> for RpcTraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced {
            inner,
            methods: self.methods.clone(),
        }
    }
}

/// A gRPC service whose calls each run in their own span.
#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
    methods: RpcMetrics,
}

impl<S: NamedService> NamedService for Traced<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> tower::Service<http::Request<B>> for Traced<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.methods.method_label(request.uri().path());
        let service = crate::api::SERVICE_NAME;
        let span = tracing::info_span!(
            target: TARGET,
            "rpc",
            otel.name = %format_args!("{service}/{method}"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = %method,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        if span.is_disabled() {
            return Box::pin(self.inner.call(request));
        }
        // A parent the layer cannot take (a malformed header gives an empty context) leaves the
        // span a root; that is never a reason to refuse the call.
        let _ = span.set_parent(remote_context(request.headers()));
        let call = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        let recorded = span.clone();
        Box::pin(
            async move {
                let answered = call.await;
                if let Ok(response) = &answered {
                    let code = response_code(response.headers());
                    recorded.record("rpc.grpc.status_code", code as i32);
                    if is_server_error(code) {
                        recorded.record("otel.status_code", "error");
                    }
                }
                answered
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    #[test]
    fn the_parent_comes_from_traceparent_and_tracestate() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        headers.insert("tracestate", http::HeaderValue::from_static("vendor=v1"));
        let cx = remote_context(&headers);
        let parent = cx.span().span_context().clone();
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(parent.trace_state().get("vendor"), Some("v1"));
    }

    #[test]
    fn a_missing_or_malformed_traceparent_gives_no_parent() {
        assert!(!remote_context(&http::HeaderMap::new()).has_active_span());
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", http::HeaderValue::from_static("00-zz-01"));
        assert!(!remote_context(&headers).has_active_span());
    }

    #[test]
    fn only_failures_of_the_server_are_errors() {
        assert!(is_server_error(tonic::Code::Internal));
        assert!(is_server_error(tonic::Code::Unavailable));
        assert!(!is_server_error(tonic::Code::Ok));
        assert!(!is_server_error(tonic::Code::PermissionDenied));
        assert!(!is_server_error(tonic::Code::InvalidArgument));
    }
}
