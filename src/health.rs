//! The health endpoints of the provider (k8s-executor §5.4), a tiny HTTP/1 server on its own
//! port: `GET /live` answers 204 while the process serves at all; `GET /ready` answers 204 when
//! the reconciler is initialised and its caches are filled, otherwise 503 with
//! `not ready: <reason>`; `GET /metrics` answers the Prometheus scrape ([`crate::metrics`]).
//! Anything else is 404 (405 for another method on a known path).
//! Connections come through the runtime `Net` seam; header reads time out after 2 s.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::task::JoinSet;

use crate::metrics::{self, Metrics};
use crate::reconciler::Reconciler;
use crate::runtime::net::Net;
use crate::security::Security;

/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long in-flight health requests may finish after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Why the provider is not ready; `None` when it is.
pub type Readiness = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The provider's readiness: the reconciler's start-up and caches, then the security
/// authority (and the server certificate's expiry).
pub fn provider_readiness(reconciler: Arc<Reconciler>, security: Security) -> Readiness {
    Arc::new(move || {
        if !reconciler.is_ready() {
            return Some(reconciler.readiness_reason().to_owned());
        }
        (!security.ready()).then(|| "security-authority-or-expiry".to_owned())
    })
}

/// What the health listener serves.
#[derive(Clone)]
pub struct Endpoints {
    /// Answers `/ready`.
    pub readiness: Readiness,
    /// Answers `/metrics`.
    pub metrics: Metrics,
}

/// The answer to one request.
pub fn answer(method: &Method, path: &str, endpoints: &Endpoints) -> (StatusCode, String) {
    let known = matches!(path, "/live" | "/ready" | "/metrics");
    if !known {
        return (StatusCode::NOT_FOUND, "not found\n".to_owned());
    }
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".to_owned(),
        );
    }
    if path == "/live" {
        return (StatusCode::NO_CONTENT, String::new());
    }
    if path == "/metrics" {
        return (StatusCode::OK, endpoints.metrics.encode());
    }
    match (endpoints.readiness)() {
        None => (StatusCode::NO_CONTENT, String::new()),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}

async fn handle(
    request: Request<Incoming>,
    endpoints: Endpoints,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    let (status, body) = answer(request.method(), path, &endpoints);
    let content_type = if path == "/metrics" && status == StatusCode::OK {
        metrics::CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if status != StatusCode::NO_CONTENT {
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
    }
    Ok(response)
}

/// Serves the health endpoints on `listener` until `shutdown` completes.
pub async fn serve<N: Net>(
    listener: N::Listener,
    endpoints: Endpoints,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = N::accept(&listener) => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let endpoints = endpoints.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(r, endpoints.clone()));
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "health connection failed");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readiness(reason: Option<&'static str>) -> Endpoints {
        Endpoints {
            readiness: Arc::new(move || reason.map(str::to_owned)),
            metrics: Metrics::new(Default::default(), Arc::new(crate::runtime::SystemClock)),
        }
    }

    #[test]
    fn live_is_always_no_content_and_ready_follows_the_reason() {
        let starting = readiness(Some("controller-starting"));
        assert_eq!(
            answer(&Method::GET, "/live", &starting).0,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            answer(&Method::GET, "/ready", &starting),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: controller-starting\n".to_owned()
            )
        );
        let ready = readiness(None);
        assert_eq!(
            answer(&Method::GET, "/ready", &ready).0,
            StatusCode::NO_CONTENT
        );
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        let ready = readiness(None);
        assert_eq!(
            answer(&Method::GET, "/metrics/x", &ready).0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            answer(&Method::POST, "/ready", &ready).0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let (status, scrape) = answer(&Method::GET, "/metrics", &ready);
        assert_eq!(status, StatusCode::OK);
        assert!(
            scrape.contains("execution_provider_limiter_rejections_total"),
            "{scrape}"
        );
    }
}
