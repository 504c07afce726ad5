//! The security boundary: TLS policy, client identity, the security manifest and the client
//! policy every RPC is authorized against.
//!
//! [`Security`] holds the current [`SecuritySnapshot`] and the hot-swappable server TLS
//! config. It is loaded from a security directory (manifest plus TLS files named by it).

pub mod identity;
pub mod manifest;
pub mod policy;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::CertificateDer;

use crate::errors::{ErrorCode, WireError};
use crate::runtime::Clock;
use crate::runtime::tls::{self, ClientChainVerifier, Identity, ReloadableServerTls, TlsError};
pub use manifest::SecurityManifest;
pub use policy::{Client, ClientPolicy, SecuritySnapshot};

/// The manifest's file name inside a security directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Largest TLS file read.
const MAX_TLS_FILE_BYTES: u64 = 1024 * 1024;

/// Why the security directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file exceeds the read bound.
    #[error("{0} exceeds 1 MiB")]
    TooLarge(PathBuf),
    /// The manifest is invalid.
    #[error("{path}: {source}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// The cause.
        source: manifest::ManifestError,
    },
    /// TLS material is invalid.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Everything loaded from one security directory.
pub struct LoadedSecurity {
    /// The manifest.
    pub manifest: SecurityManifest,
    /// The server certificate chain and key.
    pub server: Identity,
    /// The CAs client certificates must chain to.
    pub client_cas: Vec<CertificateDer<'static>>,
}

/// Reads the manifest at `manifest_path` and the TLS files it names from `tls_dir`.
pub fn load_directory(
    manifest_path: &Path,
    tls_dir: &Path,
) -> Result<LoadedSecurity, SecurityError> {
    let manifest = SecurityManifest::parse(&read_bounded(manifest_path)?).map_err(|source| {
        SecurityError::Manifest {
            path: manifest_path.to_owned(),
            source,
        }
    })?;
    let tls_file = |name: &str| read_bounded(&tls_dir.join(name));
    let cert = tls_file(&manifest.tls.certificate_file)?;
    let key = tls_file(&manifest.tls.private_key_file)?;
    let cas = tls_file(&manifest.tls.client_ca_file)?;
    Ok(LoadedSecurity {
        server: Identity::from_pem(&cert, &key, &manifest.tls.certificate_file)?,
        client_cas: tls::certificates_from_pem(&cas, &manifest.tls.client_ca_file)?,
        manifest,
    })
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, SecurityError> {
    use std::io::Read;
    let read_err = |source| SecurityError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_TLS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_TLS_FILE_BYTES {
        return Err(SecurityError::TooLarge(path.to_owned()));
    }
    Ok(bytes)
}

/// What every RPC is judged against: the allowlist and the client CA pool of one load.
struct Authority {
    snapshot: SecuritySnapshot,
    chains: ClientChainVerifier,
}

/// The live security state shared by the server and its handlers.
#[derive(Clone)]
pub struct Security {
    authority: Arc<ArcSwap<Authority>>,
    tls: ReloadableServerTls,
    clock: Arc<dyn Clock>,
}

impl Security {
    /// Builds the state from a loaded directory.
    pub fn new(loaded: &LoadedSecurity, clock: Arc<dyn Clock>) -> Result<Self, SecurityError> {
        let config = tls::server_config(&loaded.server, clock.clone())?;
        let authority = Self::authority(loaded, clock.clone())?;
        Ok(Self {
            authority: Arc::new(ArcSwap::from_pointee(authority)),
            tls: ReloadableServerTls::new(config),
            clock,
        })
    }

    fn authority(
        loaded: &LoadedSecurity,
        clock: Arc<dyn Clock>,
    ) -> Result<Authority, SecurityError> {
        Ok(Authority {
            snapshot: loaded.manifest.snapshot(),
            chains: ClientChainVerifier::new(&loaded.client_cas, clock)?,
        })
    }

    /// Installs a newly loaded directory: later handshakes and RPCs, including RPCs on
    /// connections that are already open, use it.
    pub fn install(&self, loaded: &LoadedSecurity) -> Result<(), SecurityError> {
        let config = tls::server_config(&loaded.server, self.clock.clone())?;
        let authority = Self::authority(loaded, self.clock.clone())?;
        self.tls.replace(config);
        self.authority.store(Arc::new(authority));
        Ok(())
    }

    /// The server TLS config handle for the accept loop.
    pub fn server_tls(&self) -> ReloadableServerTls {
        self.tls.clone()
    }

    /// The generation of the allowlist in force now.
    pub fn generation(&self) -> u64 {
        self.authority.load().snapshot.generation
    }

    /// Authenticates the peer of an RPC against the authority in force now: its chain must
    /// verify against the client CA pool at the injected clock's time, and its leaf must name
    /// an admitted client. The returned policy is this snapshot's, for the whole request.
    pub fn authenticate(
        &self,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Client, WireError> {
        let unauthenticated = WireError::fatal(ErrorCode::Unauthenticated);
        let chain = peer_certs
            .filter(|c| !c.is_empty())
            .ok_or(unauthenticated)?;
        let authority = self.authority.load();
        if !authority.chains.verify(chain) {
            return Err(unauthenticated);
        }
        let uri = identity::client_identity(&chain[0]).map_err(|_| unauthenticated)?;
        authority.snapshot.admit(&uri).ok_or(unauthenticated)
    }
}
