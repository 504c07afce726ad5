//! Kubernetes API requests of the provider, recorded by a tower layer on the transport of the
//! `kube::Client` (one seam for every call site): `execution_provider_kube_api_requests_total
//! {verb, resource, code}` and `execution_provider_kube_api_request_duration_seconds{verb,
//! resource}`. This is the cost model of the design, live.
//!
//! The verb is the Kubernetes verb of the request (`get`, `list`, `watch`, `create`, `update`,
//! `patch`, `delete`, `deletecollection`), the resource its plural with any subresource
//! (`executionenvironments/status`, `pods/exec`), never an object's name or namespace; the
//! code is the HTTP status, or `error` when no response came. Discovery and version requests
//! are `discovery`; any path this parser does not understand is `other`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::latency_histogram;
use crate::runtime::clock::Clock;

/// Labels of a finished API request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The Kubernetes verb.
    pub verb: String,
    /// The resource (plural), with its subresource after a `/`.
    pub resource: String,
    /// The HTTP status code, or `error`.
    pub code: String,
}

/// Labels of an API request's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// The Kubernetes verb.
    pub verb: String,
    /// The resource (plural), with its subresource after a `/`.
    pub resource: String,
}

/// The API request counters and histograms.
#[derive(Clone)]
pub struct KubeApiMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<VerbLabels, Histogram>,
    clock: Arc<dyn Clock>,
}

impl KubeApiMetrics {
    /// Registers the API request metrics in `registry`.
    pub fn register(registry: &mut Registry, clock: Arc<dyn Clock>) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<VerbLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "kube_api_requests",
            "Kubernetes API requests of the provider by verb, resource and HTTP status",
            requests.clone(),
        );
        registry.register(
            "kube_api_request_duration_seconds",
            "Latency of Kubernetes API requests until the response head, by verb and resource",
            duration.clone(),
        );
        Self {
            requests,
            duration,
            clock,
        }
    }

    /// The layer that records into these metrics (for `kube::client::ClientBuilder::with_layer`).
    pub fn layer(&self) -> KubeApiLayer {
        KubeApiLayer(self.clone())
    }

    fn record(&self, labels: VerbLabels, code: String, started: tokio::time::Instant) {
        let seconds = self.clock.monotonic().duration_since(started).as_secs_f64();
        self.duration.get_or_create(&labels).observe(seconds);
        self.requests
            .get_or_create(&RequestLabels {
                verb: labels.verb,
                resource: labels.resource,
                code,
            })
            .inc();
    }
}

/// The verb and resource of a request to the Kubernetes API.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> VerbLabels {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return labels("get", "discovery"),
    };
    let rest = match rest {
        ["namespaces", _namespace, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let (resource, named) = match rest {
        [] => return labels("get", "discovery"),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return labels(verb_of(method, true, false), "other"),
    };
    if !resource.split('/').all(is_resource_word) {
        return labels(verb_of(method, named, false), "other");
    }
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    });
    VerbLabels {
        verb: verb_of(method, named, watching).to_owned(),
        resource,
    }
}

fn labels(verb: &str, resource: &str) -> VerbLabels {
    VerbLabels {
        verb: verb.to_owned(),
        resource: resource.to_owned(),
    }
}

fn verb_of(method: &http::Method, named: bool, watching: bool) -> &'static str {
    match *method {
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// A resource or subresource name: a lowercase DNS label.
fn is_resource_word(word: &str) -> bool {
    (1..=63).contains(&word.len())
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The tower layer that records [`KubeApiMetrics`] around a Kubernetes client transport.
#[derive(Clone)]
pub struct KubeApiLayer(KubeApiMetrics);

impl<S> tower::Layer<S> for KubeApiLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A Kubernetes client transport whose requests are counted and timed.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    metrics: KubeApiMetrics,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Counted<S>
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
        let labels = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let started = self.metrics.clock.monotonic();
        let metrics = self.metrics.clone();
        let call = self.inner.call(request);
        Box::pin(async move {
            let answered = call.await;
            let code = match &answered {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            metrics.record(labels, code, started);
            answered
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn pair(method: Method, path: &str, query: Option<&str>) -> (String, String) {
        let l = classify(&method, path, query);
        (l.verb, l.resource)
    }

    fn p(verb: &str, resource: &str) -> (String, String) {
        (verb.to_owned(), resource.to_owned())
    }

    #[test]
    fn verbs_and_resources_never_carry_names_or_namespaces() {
        let envs = "/apis/execution.example/v1alpha1/namespaces/ns/executionenvironments";
        assert_eq!(
            pair(Method::GET, envs, None),
            p("list", "executionenvironments")
        );
        assert_eq!(
            pair(Method::GET, envs, Some("watch=true&resourceVersion=5")),
            p("watch", "executionenvironments")
        );
        assert_eq!(
            pair(Method::GET, &format!("{envs}/env-1"), None),
            p("get", "executionenvironments")
        );
        assert_eq!(
            pair(Method::PUT, &format!("{envs}/env-1/status"), None),
            p("update", "executionenvironments/status")
        );
        assert_eq!(
            pair(Method::PATCH, "/api/v1/namespaces/ns/pods/p-1", None),
            p("patch", "pods")
        );
        assert_eq!(
            pair(Method::POST, "/api/v1/namespaces/ns/pods", None),
            p("create", "pods")
        );
        assert_eq!(
            pair(
                Method::GET,
                "/api/v1/namespaces/ns/pods/p-1/exec",
                Some("command=x")
            ),
            p("get", "pods/exec")
        );
        assert_eq!(
            pair(
                Method::DELETE,
                "/api/v1/namespaces/ns/persistentvolumeclaims/w",
                None
            ),
            p("delete", "persistentvolumeclaims")
        );
        assert_eq!(
            pair(Method::DELETE, "/api/v1/namespaces/ns/configmaps", None),
            p("deletecollection", "configmaps")
        );
        assert_eq!(
            pair(Method::GET, "/api/v1/namespaces/ns", None),
            p("get", "namespaces")
        );
        assert_eq!(pair(Method::GET, "/api/v1/nodes", None), p("list", "nodes"));
        assert_eq!(pair(Method::GET, "/version", None), p("get", "discovery"));
        assert_eq!(
            pair(Method::GET, "/apis/execution.example/v1alpha1", None),
            p("get", "discovery")
        );
        assert_eq!(
            pair(Method::GET, "/api/v1/namespaces/ns/pods/p/exec/more", None),
            p("get", "other")
        );
        assert_eq!(
            pair(Method::GET, "/api/v1/namespaces/ns/Pods%20x/p", None),
            p("get", "other")
        );
    }
}
