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
pub mod supervisor_key;

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
    /// The TLS material breaks a rule of `security check` (expired or non-serverAuth server
    /// leaf, a client CA bundle entry that is not a CA).
    #[error("security directory refused: {}", .0.join("; "))]
    Refused(Vec<String>),
    /// A projected volume swapped its `..data` version while it was read, twice in a row.
    #[error("the security files changed while they were read; retried once")]
    Swapped,
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
///
/// A Kubernetes projected volume (Secret, ConfigMap) swaps all its files at once by
/// re-pointing its `..data` link; a read that saw a swap may mix two versions, so it is
/// retried once, and refused ([`SecurityError::Swapped`]) when the retry sees another swap.
pub fn load_directory(
    manifest_path: &Path,
    tls_dir: &Path,
) -> Result<LoadedSecurity, SecurityError> {
    let mut links = vec![tls_dir.join(PROJECTION_LINK)];
    if let Some(parent) = manifest_path.parent()
        && parent != tls_dir
    {
        links.push(parent.join(PROJECTION_LINK));
    }
    read_consistently(&links, || load_directory_once(manifest_path, tls_dir))
}

/// The link through which a projected volume publishes its current version.
pub const PROJECTION_LINK: &str = "..data";

/// Runs `read` while the projected-volume `links` keep their targets: when a link changed
/// during a read, the read is done once more, and when it changed again,
/// [`SecurityError::Swapped`]. A missing link (not a projected volume) never changes.
pub fn read_consistently<T>(
    links: &[PathBuf],
    mut read: impl FnMut() -> Result<T, SecurityError>,
) -> Result<T, SecurityError> {
    let versions =
        || -> Vec<Option<PathBuf>> { links.iter().map(|l| std::fs::read_link(l).ok()).collect() };
    for _ in 0..2 {
        let before = versions();
        let result = read();
        if versions() == before {
            return result;
        }
    }
    Err(SecurityError::Swapped)
}

fn load_directory_once(
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
