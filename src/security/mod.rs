//! The security boundary: TLS policy, client identity, the security manifest and the client
//! policy every RPC is authorized against.
//!
//! [`Security`] holds the current [`SecuritySnapshot`] and the hot-swappable server TLS
//! config. It is loaded from a security directory (manifest plus TLS and key files named by
//! it, [`load_directory`]); the [`SecurityManager`] reloads it, records each authority in a
//! durable ledger ([`ledger`]) and withdraws it whenever the ledger says it is not current.

mod authority;
pub mod check;
pub mod digest;
pub mod grant;
pub mod identity;
pub mod keys;
pub mod ledger;
pub mod manager;
pub mod manifest;
pub mod policy;

use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;

use crate::runtime::tls::{self, Identity, TlsError};
pub use authority::Security;
pub use manager::{SecurityManager, SecuritySettings};
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
    /// A grant key file is invalid.
    #[error(transparent)]
    Keyring(#[from] keys::KeyringError),
    /// The RPC limiter bounds (manifest and flags together) are invalid.
    #[error(transparent)]
    Limits(#[from] crate::server::limiter::LimiterError),
}

/// Everything loaded from one security directory.
pub struct LoadedSecurity {
    /// The manifest.
    pub manifest: SecurityManifest,
    /// The server certificate chain and key.
    pub server: Identity,
    /// The CAs client certificates must chain to.
    pub client_cas: Vec<CertificateDer<'static>>,
    /// The grant keys.
    pub keyring: keys::Keyring,
}

/// Reads the manifest at `manifest_path` and the TLS and key files it names from `tls_dir`.
/// Those files are basenames opened through a handle confined to `tls_dir`: a symlink that
/// leads out of it is refused, and at most 1 MiB is read from each.
pub fn load_directory(
    manifest_path: &Path,
    tls_dir: &Path,
) -> Result<LoadedSecurity, SecurityError> {
    let manifest_bytes = std::fs::File::open(manifest_path)
        .and_then(|f| read_bounded(f, manifest::MAX_MANIFEST_BYTES as u64))
        .map_err(|source| read_error(manifest_path, source))?
        .ok_or_else(|| SecurityError::TooLarge(manifest_path.to_owned()))?;
    let manifest =
        SecurityManifest::parse(&manifest_bytes).map_err(|source| SecurityError::Manifest {
            path: manifest_path.to_owned(),
            source,
        })?;
    let dir = cap_std::fs::Dir::open_ambient_dir(tls_dir, cap_std::ambient_authority())
        .map_err(|source| read_error(tls_dir, source))?;
    let tls_file = |name: &str| -> Result<Vec<u8>, SecurityError> {
        let path = tls_dir.join(name);
        dir.open(name)
            .and_then(|f| read_bounded(f.into_std(), MAX_TLS_FILE_BYTES))
            .map_err(|source| read_error(&path, source))?
            .ok_or(SecurityError::TooLarge(path))
    };
    let cert = tls_file(&manifest.tls.certificate_file)?;
    let key = tls_file(&manifest.tls.private_key_file)?;
    let cas = tls_file(&manifest.tls.client_ca_file)?;
    let keyring = keys::Keyring::load(&manifest, tls_file)?;
    Ok(LoadedSecurity {
        server: Identity::from_pem(&cert, &key, &manifest.tls.certificate_file)?,
        client_cas: tls::certificates_from_pem(&cas, &manifest.tls.client_ca_file)?,
        keyring,
        manifest,
    })
}

fn read_error(path: &Path, source: std::io::Error) -> SecurityError {
    SecurityError::Read {
        path: path.to_owned(),
        source,
    }
}

/// Reads at most `limit` bytes; `None` when the file is larger.
fn read_bounded(file: std::fs::File, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}
