//! The network seam over turmoil TCP: [`SimNet`] implements the provider's `Net` trait, so the
//! production accept loop, mTLS handshake and connector run unchanged inside the simulation;
//! [`PlainConnector`] gives hyper (and so `kube::Client`) a turmoil connection; and
//! [`serve_api_server`] serves the in-process API server over HTTP/1 on a turmoil listener.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use execution_provider::runtime::net::{Io, Net};
use http::Uri;
use hyper_util::rt::TokioIo;

/// turmoil TCP as the provider's network.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimNet;

impl Net for SimNet {
    type Stream = turmoil::net::TcpStream;
    type Listener = turmoil::net::TcpListener;

    async fn connect(&self, host: &str, port: u16) -> io::Result<Self::Stream> {
        turmoil::net::TcpStream::connect((host, port)).await
    }

    async fn bind(&self, addr: SocketAddr) -> io::Result<Self::Listener> {
        turmoil::net::TcpListener::bind(addr).await
    }

    async fn accept(listener: &Self::Listener) -> io::Result<(Self::Stream, SocketAddr)> {
        listener.accept().await
    }

    fn local_addr(listener: &Self::Listener) -> io::Result<SocketAddr> {
        listener.local_addr()
    }
}

/// A plaintext hyper connector over turmoil TCP (the API server speaks plain HTTP/1 inside
/// the simulation).
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainConnector;

impl tower::Service<Uri> for PlainConnector {
    type Response = TokioIo<Io<turmoil::net::TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?
                .to_owned();
            let port = uri.port_u16().unwrap_or(80);
            let stream = SimNet.connect(&host, port).await?;
            Ok(TokioIo::new(Io::new(stream, None, None)))
        })
    }
}

/// A `kube::Client` reaching the API server host over turmoil TCP. Build it inside the host
/// that uses it (its buffer task runs on that host's runtime).
pub fn kube_client(apiserver: &str, port: u16, namespace: &str) -> kube::Client {
    // The pool reads time through tokio (simulated), never the OS clock, and never expires
    // idle connections: otherwise a run would depend on how fast the machine is.
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(None)
        .build::<_, kube::client::Body>(PlainConnector);
    let base: Uri = format!("http://{apiserver}:{port}")
        .parse()
        .expect("a valid API server URI");
    let service = tower::ServiceBuilder::new()
        .layer(kube::client::middleware::BaseUriLayer::new(base))
        .layer(tower::timeout::TimeoutLayer::new(
            std::time::Duration::from_secs(10),
        ))
        .service(http);
    kube::Client::new(service, namespace)
}

/// Serves `service` over HTTP/1 (with upgrades) on every connection `listener` accepts, until
/// the host stops.
pub async fn serve_http1<S>(listener: turmoil::net::TcpListener, service: S) -> io::Result<()>
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<execution_provider::kube::apiserver::ResponseBody>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let mut service = service.clone();
                async move { tower::Service::call(&mut service, request).await }
            });
            // No `date` header: it is the only OS time in the API server's answers.
            let _ = hyper::server::conn::http1::Builder::new()
                .auto_date_header(false)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}
