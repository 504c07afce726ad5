//! kubectl against `dev`: the embedded API server's read-only view served over mutual TLS on
//! a loopback address, and a kubeconfig for it in the state directory
//! (`<state>/kubeconfig`). Each start makes a new certificate authority that lives only in
//! memory, a server certificate for the listening address and one client certificate, which
//! only that kubeconfig holds; the kubeconfig is replaced atomically (owner-only) on every
//! start, so an old copy stops working at the next restart.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{Value, json};

use super::pki::{DevCa, PemPair};
use crate::kube::apiserver::{
    ApiServer,
    read_only::{self, ReadOnly},
};
use crate::runtime::Clock;
use crate::runtime::net::{Net, TokioNet};
use crate::runtime::tls::{self, ClockTime, ConnectionGate, ReloadableServerTls};

/// The kubeconfig's file name in the state directory.
pub const KUBECONFIG_FILE: &str = "kubeconfig";
/// The identity (URI SAN) of the kubeconfig's client certificate.
pub const VIEWER_URI: &str = "spiffe://dev.local/kubectl-viewer";
const CA_NAME: &str = "execution-provider dev kubectl CA";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections (each kubectl watch holds one) and handshakes in progress at once: a
/// local tool needs few, and the bound keeps a misbehaving one from exhausting the provider.
const MAX_CONNECTIONS: usize = 64;
const MAX_HANDSHAKES: usize = 16;
const NAME: &str = "execution-provider-dev";

/// The running endpoint.
#[derive(Debug, Clone)]
pub struct KubectlEndpoint {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The kubeconfig that reaches it.
    pub kubeconfig: PathBuf,
}

/// The kubeconfig document for a server at `addr` (`https://IP:PORT`) trusting `ca` and
/// presenting `client`.
pub fn kubeconfig(addr: SocketAddr, ca: &str, client: &PemPair, namespace: &str) -> Value {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {
            "server": format!("https://{addr}"),
            "certificate-authority-data": b64(ca),
        }}],
        "users": [{"name": "dev-viewer", "user": {
            "client-certificate-data": b64(&client.cert),
            "client-key-data": b64(&client.key),
        }}],
        "contexts": [{"name": NAME, "context": {
            "cluster": NAME,
            "user": "dev-viewer",
            "namespace": namespace,
        }}],
        "current-context": NAME,
        "preferences": {},
    })
}

fn server_tls(
    ca: &DevCa,
    server: &PemPair,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<rustls::ServerConfig> {
    let identity = tls::Identity::from_pem(
        server.cert.as_bytes(),
        server.key.as_bytes(),
        "kubectl endpoint",
    )?;
    let roots = tls::certificates_from_pem(ca.pem.cert.as_bytes(), "kubectl CA")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(tls::root_store(&roots)?),
        provider.clone(),
    )
    .build()?;
    let mut config =
        rustls::ServerConfig::builder_with_details(provider, Arc::new(ClockTime(clock)))
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(identity.chain, identity.key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename), readable by the owner
/// only: the kubeconfig holds a private key.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

/// Serves the read-only view of `api` on `listen` (a loopback address) until `shutdown`,
/// and writes `<state_root>/kubeconfig` for it.
pub async fn start(
    api: &ApiServer,
    listen: SocketAddr,
    state_root: &Path,
    namespace: &str,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<KubectlEndpoint> {
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "--kube-listen {listen} is not a loopback address: the kubectl endpoint of dev is local only"
    );
    let ca = DevCa::generate(CA_NAME)?;
    let server = ca.server_for(listen.ip())?;
    let client = ca.client(VIEWER_URI)?;
    let config = server_tls(&ca, &server, clock)?;
    let listener = TokioNet
        .bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for kubectl"))?;
    let addr = TokioNet::local_addr(&listener)?;
    let incoming = tls::mtls_incoming::<TokioNet>(
        listener,
        ReloadableServerTls::new(config),
        HANDSHAKE_TIMEOUT,
        ConnectionGate::new(MAX_CONNECTIONS, MAX_HANDSHAKES),
    );
    let document = kubeconfig(addr, &ca.pem.cert, &client, namespace);
    let text = serde_saphyr::to_string(&document).context("cannot render the kubeconfig")?;
    let path = state_root.join(KUBECONFIG_FILE);
    write_private(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    tokio::spawn(read_only::serve(
        ReadOnly::new(api.clone()),
        incoming,
        shutdown,
    ));
    Ok(KubectlEndpoint {
        addr,
        kubeconfig: path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_names_the_endpoint_its_ca_and_the_viewer() {
        let pair = PemPair {
            cert: "CLIENT CERT".to_string(),
            key: "CLIENT KEY".to_string(),
        };
        let document = kubeconfig("127.0.0.1:7444".parse().unwrap(), "CA", &pair, "execution");
        let text = serde_saphyr::to_string(&document).expect("yaml");
        insta::assert_snapshot!(text);
    }
}
