//! The `dev` state directory: recognised by a marker file, initialised once (development PKI,
//! security manifest, templates), reused on every later start, never overwritten.
//!
//! ```text
//! <state>/state.json              marker: {"format":"execution-provider-dev","version":1}
//! <state>/security/manifest.json  security manifest admitting the dev client
//! <state>/security/{server.pem,server.key,clients.pem,grant.key}
//! <state>/client/{ca.pem,client.pem,client.key}   what `client` uses by default
//! <state>/pki/{ca.pem,ca.key}     the development CA, to issue more client certificates
//! <state>/templates.yaml          the template catalogue
//! <state>/apiserver/apiserver.sqlite3   the in-process API server's database
//! <state>/kubeconfig              read-only kubectl access, rewritten at every start
//! <state>/workspaces/<env>/       one directory per environment, standing for its PVC
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::pki::{DEV_CA_NAME, DevCa};
use crate::security::keys::{self, KeyState, ManifestKey};
use crate::security::manifest::{ManifestClient, SecurityManifest, TlsFiles};

/// The identity of the development client.
pub const DEV_CLIENT_URI: &str = "spiffe://dev.local/ns/default/client";
/// The template catalogue `dev` starts with.
pub const DEFAULT_TEMPLATES: &str = include_str!("../../fixtures/templates.yaml");
const MARKER_FILE: &str = "state.json";
/// The development grant signing key, in the security directory.
const GRANT_KEY_FILE: &str = "grant.key";
const FORMAT: &str = "execution-provider-dev";
const VERSION: u32 = 1;

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// The directory holds something else.
    #[error(
        "{0} is not empty and is not an execution-provider state directory (no state.json); choose another --state-dir"
    )]
    Foreign(PathBuf),
    /// The marker is corrupt or from another format.
    #[error("{path} is not a valid execution-provider state marker: {reason}")]
    BadMarker {
        /// The marker file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file that initialisation created is missing.
    #[error(
        "{0} is missing: the state directory is incomplete; restore it or choose another --state-dir"
    )]
    Missing(PathBuf),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error(transparent)]
    Pki(#[from] super::pki::PkiError),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Marker {
    format: String,
    version: u32,
}

/// An initialised state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Opens `root`, initialising it when it is absent or empty.
    pub fn open_or_init(root: &Path) -> Result<Self, StateDirError> {
        let dir = Self {
            root: root.to_owned(),
        };
        let marker = root.join(MARKER_FILE);
        if marker.exists() {
            dir.check_marker(&marker)?;
            dir.check_complete()?;
            return Ok(dir);
        }
        let empty = match std::fs::read_dir(root) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(source) => return Err(io(root, source)),
        };
        if !empty {
            return Err(StateDirError::Foreign(root.to_owned()));
        }
        dir.initialise()?;
        Ok(dir)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The security directory (manifest and server TLS files).
    pub fn security_dir(&self) -> PathBuf {
        self.root.join("security")
    }
    /// The security manifest.
    pub fn manifest_path(&self) -> PathBuf {
        self.security_dir().join(crate::security::MANIFEST_FILE)
    }
    /// The client configuration directory.
    pub fn client_dir(&self) -> PathBuf {
        self.root.join("client")
    }
    /// The development CA's directory.
    pub fn pki_dir(&self) -> PathBuf {
        self.root.join("pki")
    }
    /// The template catalogue.
    pub fn templates_path(&self) -> PathBuf {
        self.root.join("templates.yaml")
    }
    /// The in-process API server's directory.
    pub fn apiserver_dir(&self) -> PathBuf {
        self.root.join("apiserver")
    }
    /// Where environment workspaces live.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    fn required_files(&self) -> Vec<PathBuf> {
        let security = self.security_dir();
        let client = self.client_dir();
        vec![
            self.manifest_path(),
            security.join("server.pem"),
            security.join("server.key"),
            security.join("clients.pem"),
            security.join(GRANT_KEY_FILE),
            client.join("ca.pem"),
            client.join("client.pem"),
            client.join("client.key"),
            self.pki_dir().join("ca.pem"),
            self.pki_dir().join("ca.key"),
            self.templates_path(),
        ]
    }

    fn check_marker(&self, path: &Path) -> Result<(), StateDirError> {
        let bad = |reason: String| StateDirError::BadMarker {
            path: path.to_owned(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
        let marker: Marker = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if marker.format != FORMAT || marker.version != VERSION {
            return Err(bad(format!(
                "format {} version {}",
                marker.format, marker.version
            )));
        }
        Ok(())
    }

    fn check_complete(&self) -> Result<(), StateDirError> {
        match self.required_files().into_iter().find(|f| !f.is_file()) {
            Some(missing) => Err(StateDirError::Missing(missing)),
            None => Ok(()),
        }
    }

    fn initialise(&self) -> Result<(), StateDirError> {
        let ca = DevCa::generate(DEV_CA_NAME)?;
        let server = ca.server()?;
        let client = ca.client(DEV_CLIENT_URI)?;
        let security = self.security_dir();
        let client_dir = self.client_dir();
        write_new(&security.join("server.pem"), server.cert.as_bytes())?;
        write_new(&security.join("server.key"), server.key.as_bytes())?;
        write_new(&security.join("clients.pem"), ca.pem.cert.as_bytes())?;
        let (grant_key, grant_key_sha256) = keys::generate(&crate::runtime::OsIds);
        write_new(&security.join(GRANT_KEY_FILE), grant_key.as_bytes())?;
        write_new(&self.manifest_path(), &dev_manifest(grant_key_sha256))?;
        write_new(&client_dir.join("ca.pem"), ca.pem.cert.as_bytes())?;
        write_new(&client_dir.join("client.pem"), client.cert.as_bytes())?;
        write_new(&client_dir.join("client.key"), client.key.as_bytes())?;
        write_new(&self.pki_dir().join("ca.pem"), ca.pem.cert.as_bytes())?;
        write_new(&self.pki_dir().join("ca.key"), ca.pem.key.as_bytes())?;
        write_new(&self.templates_path(), DEFAULT_TEMPLATES.as_bytes())?;
        let marker = serde_json::to_vec_pretty(&Marker {
            format: FORMAT.to_owned(),
            version: VERSION,
        })
        .expect("marker serializes");
        // The marker goes last: a crash before it leaves a directory that is retried afresh
        // only if it is removed, never silently half-used.
        write_new(&self.root.join(MARKER_FILE), &marker)
    }
}

fn dev_manifest(grant_key_sha256: String) -> Vec<u8> {
    let manifest = SecurityManifest {
        version: 1,
        generation: 1,
        tls: TlsFiles {
            certificate_file: "server.pem".to_owned(),
            private_key_file: "server.key".to_owned(),
            client_ca_file: "clients.pem".to_owned(),
        },
        clients: vec![ManifestClient {
            uri: DEV_CLIENT_URI.to_owned(),
            may_attest_owner: true,
            administrator: true,
            administrator_for: Vec::new(),
            execution_templates: vec!["default".to_owned()],
        }],
        issuer: "execution-provider-dev".to_owned(),
        audience: "execution-provider-dev".to_owned(),
        active_key_id: "dev-grant".to_owned(),
        grant_ttl: "5m".to_owned(),
        clock_skew: "0s".to_owned(),
        keys: vec![ManifestKey {
            id: "dev-grant".to_owned(),
            version: 1,
            file: GRANT_KEY_FILE.to_owned(),
            public_key_sha256: grant_key_sha256,
            activate_at: "2020-01-01T00:00:00Z".parse().expect("a valid instant"),
            verify_until: "2100-01-01T00:00:00Z".parse().expect("a valid instant"),
            state: KeyState::Active,
        }],
        limits: None,
    };
    serde_json::to_vec_pretty(&manifest).expect("manifest serializes")
}

fn io(path: &Path, source: std::io::Error) -> StateDirError {
    StateDirError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes a file that must not exist yet, atomically (temporary file, fsync, rename).
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), StateDirError> {
    let parent = path.parent().expect("state files have a parent");
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    if path.exists() {
        return Err(StateDirError::Foreign(parent.to_owned()));
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    restrict(&file, path);
    file.write_all(bytes).map_err(|e| io(&tmp, e))?;
    file.sync_all().map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))
}

/// Private keys are readable by the owner only.
fn restrict(file: &std::fs::File, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if path.extension().is_some_and(|e| e == "key") {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_is_initialised_and_reopened_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        let dir = StateDir::open_or_init(&root).unwrap();
        let manifest = std::fs::read(dir.manifest_path()).unwrap();
        SecurityManifest::parse(&manifest).unwrap();
        StateDir::open_or_init(&root).unwrap();
        assert_eq!(std::fs::read(dir.manifest_path()).unwrap(), manifest);
    }

    #[test]
    fn a_foreign_directory_is_refused_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("notes.txt"), b"mine").unwrap();
        let err = StateDir::open_or_init(tmp.path()).unwrap_err();
        assert!(matches!(err, StateDirError::Foreign(_)), "{err}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_corrupt_marker_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(MARKER_FILE), b"{not json").unwrap();
        let err = StateDir::open_or_init(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("state.json"), "{err}");
        assert_eq!(
            std::fs::read(tmp.path().join(MARKER_FILE)).unwrap(),
            b"{not json"
        );
    }

    #[test]
    fn a_missing_file_is_reported_not_regenerated() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_init(tmp.path()).unwrap();
        std::fs::remove_file(dir.client_dir().join("client.key")).unwrap();
        let err = StateDir::open_or_init(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("client.key"), "{err}");
    }
}
