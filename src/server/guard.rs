//! The standard services on the mTLS port (health, reflection) answer only authorized
//! identities (issue 15, item 1): the same authentication as the execution service, and a
//! limiter slot held until the response (a `Watch` or reflection stream included) has ended,
//! so these streams count against the limiter like any other call.
//!
//! While the security authority is withdrawn nobody can be authenticated; a health `Check`
//! still answers then (NOT_SERVING, a unary answer that holds nothing), so a client on an
//! open connection learns that the replica is not ready. Everything else is refused with the
//! authentication refusal (`not_ready`). Probes use the plain health listener, not this port.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::status::refusal_status;
use crate::errors::ErrorCode;
use crate::security::Security;

/// The path of the health check, the one call answered while the authority is withdrawn.
const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// `inner`, answering only callers the security authority admits.
#[derive(Clone)]
pub struct Authorized<S> {
    inner: S,
    security: Security,
}

impl<S> Authorized<S> {
    /// Guards `inner` with `security`.
    pub fn new(inner: S, security: Security) -> Self {
        Self { inner, security }
    }
}

impl<S: NamedService> NamedService for Authorized<S> {
    const NAME: &'static str = S::NAME;
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Authorized<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Answer {
        let certs = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        let slot = match self.security.admit(certs.as_deref().map(Vec::as_slice)) {
            Ok(client) => client.slot,
            Err(refusal)
                if refusal.code == ErrorCode::NotReady
                    && request.uri().path() == HEALTH_CHECK_PATH =>
            {
                None
            }
            Err(refusal) => {
                let refused = refusal_status(refusal).into_http::<Body>();
                return Box::pin(std::future::ready(Ok(refused)));
            }
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            // The slot lives as long as the response body: a stream ends only when its body
            // is done or dropped (the client cancelled).
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _held = &slot;
                    frame
                }))
            }))
        })
    }
}
