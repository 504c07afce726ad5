//! The read-only view of the API server that `dev` serves to kubectl: reads (GET and HEAD:
//! get, list, watch, discovery, Tables) pass through; every other verb is answered 403
//! Forbidden before it reaches the server, and so is `pods/exec`, which acts although it is a
//! GET. Nothing can change a claim, a grant, a fence or a status through this view.
//! [`serve`] runs it over already-authenticated TLS connections.

use std::{convert::Infallible, future::Future, pin::Pin, task::Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{Method, Request, Response};
use serde_json::json;

use super::{ApiServer, BoxError, exec, response, status::ApiError};

/// The API server behind a read-only filter.
#[derive(Clone, Debug)]
pub struct ReadOnly {
    server: ApiServer,
}

impl ReadOnly {
    /// A read-only view of `server`.
    pub fn new(server: ApiServer) -> Self {
        Self { server }
    }
}

/// The Kubernetes verb a refused method stands for, for the message.
fn verb(method: &Method) -> &str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        ref other => other.as_str(),
    }
}

fn forbidden(verb: &str, path: &str) -> ApiError {
    ApiError {
        code: 403,
        reason: "Forbidden",
        message: format!(
            "{verb} {path} is forbidden: this endpoint of execution-provider dev is read-only \
             (writes go through the provider's gRPC API)"
        ),
        details: Some(json!({})),
    }
}

/// Why a request is refused, or `None` for a read.
pub fn refusal(method: &Method, path: &str) -> Option<ApiError> {
    if exec::exec_target(path).is_some() {
        return Some(forbidden("create", path));
    }
    match *method {
        Method::GET | Method::HEAD => None,
        ref other => Some(forbidden(verb(other), path)),
    }
}

impl<B> tower::Service<Request<B>> for ReadOnly
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<response::ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Some(refused) = refusal(request.method(), request.uri().path()) {
            tracing::debug!(method = %request.method(), uri = %request.uri(), "read-only API endpoint refused a write");
            return Box::pin(async move { Ok(response::error(&refused)) });
        }
        self.server.call(request)
    }
}

/// Serves `view` on every connection `incoming` yields (HTTP/1.1), until `shutdown`
/// completes; then the open connections (watches) are closed.
pub async fn serve<S, I>(view: ReadOnly, mut incoming: I, shutdown: impl Future<Output = ()>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    I: Stream<Item = std::io::Result<S>> + Unpin,
{
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            next = incoming.next() => match next {
                Some(Ok(stream)) => stream,
                Some(Err(error)) => {
                    tracing::debug!(%error, "read-only API endpoint: connection failed");
                    continue;
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let service = hyper_util::service::TowerToHyperService::new(view.clone());
        connections.spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(%error, "read-only API endpoint: connection ended");
            }
        });
    }
    connections.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_pass() {
        let path =
            "/apis/execution.mecatl.dev/v1alpha1/namespaces/execution/executionenvironments/e";
        for method in [Method::GET, Method::HEAD] {
            assert_eq!(refusal(&method, path), None, "{method}");
        }
        for method in [
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ] {
            let refused = refusal(&method, path).expect("refused");
            assert_eq!((refused.code, refused.reason), (403, "Forbidden"));
        }
        let status = format!("{path}/status");
        assert_eq!(refusal(&Method::PATCH, &status).expect("refused").code, 403);
    }

    #[test]
    fn exec_is_refused_although_it_is_a_get() {
        let exec = "/api/v1/namespaces/execution/pods/executor-1/exec";
        let refused = refusal(&Method::GET, exec).expect("refused");
        assert_eq!(refused.code, 403);
    }
}
