//! RPC metrics of the execution service, recorded by a tower layer around it:
//! `execution_provider_rpc_requests_total{method, code}` and
//! `execution_provider_rpc_duration_seconds{method}`.
//!
//! The method label is a method the service declares (read from the file descriptor set),
//! or `unknown` for any other path a client sends. The code is the gRPC status of the
//! response head (tonic answers every handler error trailers-only, so it is there); a head
//! without one is a unary success whose `OK` follows in the trailers.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use prost::Message as _;
use tonic::server::NamedService;

use super::latency_histogram;
use crate::api::FILE_DESCRIPTOR_SET;
use crate::runtime::clock::Clock;

/// The method label of a path outside the service.
pub const UNKNOWN_METHOD: &str = "unknown";

/// Labels of a finished call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The RPC method, e.g. `StartCommand`.
    pub method: String,
    /// The gRPC status code, e.g. `Ok`, `ResourceExhausted`.
    pub code: String,
}

/// Labels of a call's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The RPC method.
    pub method: String,
}

/// The RPC counters and histograms, and what the layer needs to record them.
#[derive(Clone)]
pub struct RpcMetrics {
    requests: Family<CallLabels, Counter>,
    duration: Family<MethodLabels, Histogram>,
    methods: Arc<BTreeSet<String>>,
    service: &'static str,
    clock: Arc<dyn Clock>,
}

impl RpcMetrics {
    /// Registers the RPC metrics in `registry`.
    pub fn register(registry: &mut Registry, clock: Arc<dyn Clock>) -> Self {
        let requests = Family::<CallLabels, Counter>::default();
        let duration = Family::<MethodLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "rpc_requests",
            "Finished RPCs of the execution service by method and gRPC code",
            requests.clone(),
        );
        registry.register(
            "rpc_duration_seconds",
            "Latency of RPCs of the execution service by method",
            duration.clone(),
        );
        let service = crate::api::SERVICE_NAME;
        Self {
            requests,
            duration,
            methods: Arc::new(service_methods(service)),
            service,
            clock,
        }
    }

    /// The method label of a request path: bounded to the service's own methods.
    pub fn method_label(&self, path: &str) -> String {
        path.strip_prefix('/')
            .and_then(|p| p.strip_prefix(self.service))
            .and_then(|p| p.strip_prefix('/'))
            .filter(|m| self.methods.contains(*m))
            .unwrap_or(UNKNOWN_METHOD)
            .to_owned()
    }

    fn record(&self, method: String, code: tonic::Code, started: tokio::time::Instant) {
        let seconds = self.clock.monotonic().duration_since(started).as_secs_f64();
        self.duration
            .get_or_create(&MethodLabels {
                method: method.clone(),
            })
            .observe(seconds);
        self.requests
            .get_or_create(&CallLabels {
                method,
                code: format!("{code:?}"),
            })
            .inc();
    }
}

/// The method names `service` declares in the embedded file descriptor set.
fn service_methods(service: &str) -> BTreeSet<String> {
    let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET)
        .expect("the embedded file descriptor set decodes");
    set.file
        .iter()
        .flat_map(|file| {
            let package = file.package().to_owned();
            file.service
                .iter()
                .filter(move |s| format!("{package}.{}", s.name()) == service)
                .flat_map(|s| s.method.iter().map(|m| m.name().to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The gRPC code of a response head; none means a unary success (`OK` in the trailers).
pub(crate) fn response_code(headers: &http::HeaderMap) -> tonic::Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

/// The tower layer that records [`RpcMetrics`] around a gRPC service.
#[derive(Clone)]
pub struct RpcMetricsLayer(RpcMetrics);

impl RpcMetricsLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: RpcMetrics) -> Self {
        Self(metrics)
    }
}

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = Recorded<S>;

    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A gRPC service whose calls are counted and timed.
#[derive(Clone)]
pub struct Recorded<S> {
    inner: S,
    metrics: RpcMetrics,
}

impl<S: NamedService> NamedService for Recorded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> tower::Service<http::Request<B>> for Recorded<S>
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
        let method = self.metrics.method_label(request.uri().path());
        let started = self.metrics.clock.monotonic();
        let metrics = self.metrics.clone();
        let call = self.inner.call(request);
        Box::pin(async move {
            let answered = call.await;
            if let Ok(response) = &answered {
                metrics.record(method, response_code(response.headers()), started);
            }
            answered
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_the_services_own_and_anything_else_is_unknown() {
        let mut registry = Registry::default();
        let rpc = RpcMetrics::register(&mut registry, Arc::new(crate::runtime::SystemClock));
        let base = format!("/{}", rpc.service);
        assert_eq!(
            rpc.method_label(&format!("{base}/StartCommand")),
            "StartCommand"
        );
        assert_eq!(
            rpc.method_label(&format!("{base}/NoSuchCall")),
            UNKNOWN_METHOD
        );
        assert_eq!(
            rpc.method_label("/other.Service/StartCommand"),
            UNKNOWN_METHOD
        );
        assert!(rpc.methods.len() >= 20, "{:?}", rpc.methods);
    }

    #[test]
    fn the_code_comes_from_the_head_and_defaults_to_ok() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(response_code(&headers), tonic::Code::Ok);
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        assert_eq!(response_code(&headers), tonic::Code::ResourceExhausted);
    }
}
