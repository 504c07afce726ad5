//! TLS over the network seam: TLS 1.3-only rustls configs (ring provider, certificate
//! validity judged by the injected clock), a server config that can be swapped at run time,
//! the mTLS accept loop feeding tonic, and the mTLS connector for clients.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;

use super::clock::Clock;
use super::net::{Io, Net};

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file or blob could not be parsed.
    #[error("invalid PEM in {what}: {reason}")]
    Pem { what: String, reason: String },
    /// No certificate was found where one is required.
    #[error("no certificate in {0}")]
    NoCertificate(String),
    /// rustls refused the configuration.
    #[error("TLS configuration rejected: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client CA pool rejected: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// A certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    /// Leaf first, then intermediates.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Parses a PEM certificate chain and a PEM private key.
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8], what: &str) -> Result<Self, TlsError> {
        Ok(Self {
            chain: certificates_from_pem(chain_pem, what)?,
            key: private_key_from_pem(key_pem, what)?,
        })
    }
}

/// Parses every certificate in a PEM blob; at least one is required.
pub fn certificates_from_pem(
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: what.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(what.to_owned()));
    }
    Ok(certs)
}

/// Parses the first private key in a PEM blob.
pub fn private_key_from_pem(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// A root store holding `cas`.
pub fn root_store(cas: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone())?;
    }
    Ok(roots)
}

/// Lets rustls judge certificate validity by the injected clock instead of the OS clock.
#[derive(Clone)]
pub struct ClockTime(pub Arc<dyn Clock>);

impl std::fmt::Debug for ClockTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClockTime")
    }
}

impl rustls::time_provider::TimeProvider for ClockTime {
    fn current_time(&self) -> Option<UnixTime> {
        Some(UnixTime::since_unix_epoch(self.0.unix()))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS 1.3-only server config whose handshake demands a client certificate (and proof of
/// its key) but does not judge its chain: the chain is verified on every RPC against the
/// security snapshot current then ([`ClientChainVerifier`]), so CA rotation, a removed issuer
/// or an expiry takes effect on connections that are already open.
pub fn server_config(identity: &Identity, clock: Arc<dyn Clock>) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let verifier = Arc::new(RequireAnyClientCert {
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = ServerConfig::builder_with_details(provider, Arc::new(ClockTime(clock)))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Demands a client certificate and proof of possession of its key; trust is decided per RPC.
#[derive(Debug)]
struct RequireAnyClientCert {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::server::danger::ClientCertVerifier for RequireAnyClientCert {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Verifies a presented client chain against a CA pool at the injected clock's time, with
/// the clientAuth usage required.
pub struct ClientChainVerifier {
    verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    clock: Arc<dyn Clock>,
}

impl ClientChainVerifier {
    /// A verifier trusting `client_cas`.
    pub fn new(
        client_cas: &[CertificateDer<'static>],
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(root_store(client_cas)?),
            provider(),
        )
        .build()?;
        Ok(Self { verifier, clock })
    }

    /// Whether `chain` (leaf first) chains to the pool and is valid now.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        let now = UnixTime::since_unix_epoch(self.clock.unix());
        self.verifier
            .verify_client_cert(leaf, intermediates, now)
            .is_ok()
    }
}

/// A TLS 1.3-only client config presenting `identity` (if any) and trusting `server_cas`.
pub fn client_config(
    identity: Option<&Identity>,
    server_cas: &[CertificateDer<'static>],
    clock: Arc<dyn Clock>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_details(provider(), Arc::new(ClockTime(clock)))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(root_store(server_cas)?);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A server TLS config that can be replaced while the server runs, or withdrawn. New
/// handshakes use the newest config, and fail while there is none (the replica is not
/// ready); established connections keep the one they were accepted with.
#[derive(Clone)]
pub struct ReloadableServerTls {
    current: Arc<ArcSwapOption<ServerConfig>>,
}

impl ReloadableServerTls {
    /// Starts with `config`.
    pub fn new(config: ServerConfig) -> Self {
        Self {
            current: Arc::new(ArcSwapOption::from_pointee(config)),
        }
    }

    /// Replaces the config used by later handshakes.
    pub fn replace(&self, config: ServerConfig) {
        self.current.store(Some(Arc::new(config)));
    }

    /// Withdraws the config: later handshakes fail until one is installed again.
    pub fn clear(&self) {
        self.current.store(None);
    }

    /// An acceptor for the config current now, if there is one.
    pub fn acceptor(&self) -> Option<TlsAcceptor> {
        self.current.load_full().map(TlsAcceptor::from)
    }
}

/// A server-side mTLS stream as tonic sees it.
pub type ServerTlsStream<S> = tokio_rustls::server::TlsStream<Io<S>>;

/// Places for open connections and for TLS handshakes in progress. A connection takes one of
/// each at `accept`; it gives the handshake place back when its handshake ends and the
/// connection place when it closes. Without a free place of either kind it is closed at once.
#[derive(Debug, Clone)]
pub struct ConnectionGate {
    connections: Arc<tokio::sync::Semaphore>,
    handshakes: Arc<tokio::sync::Semaphore>,
}

impl ConnectionGate {
    /// At most `connections` open connections and `handshakes` handshakes in progress.
    pub fn new(connections: usize, handshakes: usize) -> Self {
        Self {
            connections: Arc::new(tokio::sync::Semaphore::new(connections)),
            handshakes: Arc::new(tokio::sync::Semaphore::new(handshakes)),
        }
    }

    /// Free places `(connections, handshakes)` now.
    pub fn free(&self) -> (usize, usize) {
        (
            self.connections.available_permits(),
            self.handshakes.available_permits(),
        )
    }

    fn admit(
        &self,
    ) -> Option<(
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    )> {
        let connection = self.connections.clone().try_acquire_owned().ok()?;
        let handshake = self.handshakes.clone().try_acquire_owned().ok()?;
        Some((connection, handshake))
    }
}

/// Accepts connections on `listener` within the bounds of `gate`, runs each TLS handshake in
/// its own task under `handshake_timeout`, and yields the completed streams. Failed
/// handshakes are logged and dropped. The loop ends when the returned stream is dropped.
pub fn mtls_incoming<N: Net>(
    listener: N::Listener,
    tls: ReloadableServerTls,
    handshake_timeout: Duration,
    gate: ConnectionGate,
) -> ReceiverStream<io::Result<ServerTlsStream<N::Stream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let local = N::local_addr(&listener).ok();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = N::accept(&listener) => accepted,
                () = tx.closed() => return,
            };
            let (stream, peer) = match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            };
            let Some(acceptor) = tls.acceptor() else {
                tracing::debug!(%peer, "no TLS config is published: connection refused");
                continue;
            };
            let Some((place, handshake)) = gate.admit() else {
                tracing::debug!(%peer, "connection or handshake bound reached: connection closed");
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let io = Io::new(stream, local, Some(peer)).holding(place);
                let accepted = tokio::time::timeout(handshake_timeout, acceptor.accept(io)).await;
                drop(handshake);
                match accepted {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// A tower connector for tonic and hyper clients: TCP (or turmoil TCP) through the network
/// seam, then TLS. Use it with an `http://` URI; the connector does the TLS.
#[derive(Clone)]
pub struct MtlsConnector<N> {
    net: N,
    tls: TlsConnector,
    server_name: Option<ServerName<'static>>,
}

impl<N: Net> MtlsConnector<N> {
    /// A connector using `config`. `server_name` overrides the name checked against the
    /// server certificate (default: the URI host).
    pub fn new(net: N, config: ClientConfig, server_name: Option<ServerName<'static>>) -> Self {
        Self {
            net,
            tls: TlsConnector::from(Arc::new(config)),
            server_name,
        }
    }
}

impl<N: Net> tower::Service<Uri> for MtlsConnector<N> {
    type Response = TokioIo<Io<tokio_rustls::client::TlsStream<N::Stream>>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let net = self.net.clone();
        let tls = self.tls.clone();
        let fixed_name = self.server_name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = match fixed_name {
                Some(name) => name,
                None => ServerName::try_from(host.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            };
            let stream = net.connect(&host, port).await?;
            let stream = tls.connect(name, stream).await?;
            Ok(TokioIo::new(Io::new(stream, None, None)))
        })
    }
}
