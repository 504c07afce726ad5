//! The network seam: listeners and connectors. Production uses tokio TCP; the simulator
//! implements the same trait over turmoil TCP, so the TLS and accept-loop code is shared.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Sockets: connect to a peer, bind a listener, accept from it.
pub trait Net: Clone + Send + Sync + 'static {
    /// A connected byte stream.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static;
    /// A bound listener.
    type Listener: Send + Sync + 'static;

    /// Opens a stream to `host:port`.
    fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = io::Result<Self::Stream>> + Send;
    /// Binds a listener on `addr`.
    fn bind(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Listener>> + Send;
    /// Accepts the next connection.
    fn accept(
        listener: &Self::Listener,
    ) -> impl Future<Output = io::Result<(Self::Stream, SocketAddr)>> + Send;
    /// The address the listener is bound to.
    fn local_addr(listener: &Self::Listener) -> io::Result<SocketAddr>;
}

/// tokio TCP: the production network.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioNet;

impl Net for TokioNet {
    type Stream = tokio::net::TcpStream;
    type Listener = tokio::net::TcpListener;

    async fn connect(&self, host: &str, port: u16) -> io::Result<Self::Stream> {
        let stream = tokio::net::TcpStream::connect((host, port)).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    async fn bind(&self, addr: SocketAddr) -> io::Result<Self::Listener> {
        tokio::net::TcpListener::bind(addr).await
    }

    async fn accept(listener: &Self::Listener) -> io::Result<(Self::Stream, SocketAddr)> {
        let (stream, peer) = listener.accept().await?;
        stream.set_nodelay(true)?;
        Ok((stream, peer))
    }

    fn local_addr(listener: &Self::Listener) -> io::Result<SocketAddr> {
        listener.local_addr()
    }
}

/// A stream with its addresses, so tonic can report them (and, under TLS, the peer
/// certificates) to handlers, and hyper can use it as a client connection.
#[derive(Debug)]
pub struct Io<S> {
    stream: S,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    /// The connection's place under the server's connection bound, given back on close.
    place: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S> Io<S> {
    /// Wraps `stream` with the addresses it connects.
    pub fn new(stream: S, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Self {
        Self {
            stream,
            local,
            remote,
            place: None,
        }
    }

    /// This stream holding `place` until it is dropped.
    #[must_use]
    pub fn holding(mut self, place: tokio::sync::OwnedSemaphorePermit) -> Self {
        self.place = Some(place);
        self
    }
}

impl<S: Send + Sync + Unpin + 'static> Connected for Io<S> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

impl<S> hyper_util::client::legacy::connect::Connection for Io<S> {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Io<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Io<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
