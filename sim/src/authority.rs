//! The security authority as a fault: each run gets its own copy of the security directory,
//! every replica runs the production `SecurityManager` on it (reloading it and publishing to
//! the authority ledger), and the driver rotates the manifest (a higher generation) or
//! attempts a rollback (a lower generation, or the same generation with other content) and
//! later restores the good manifest. The ledger must never move backwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use execution_provider::security::{Security, SecurityManager, SecuritySettings, manager};
use serde_json::Value;

use crate::world::NAMESPACE;

/// How often replicas reload the directory in the simulation.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// A run's own security directory and the manifest in force.
#[derive(Debug)]
pub struct SecurityFiles {
    _dir: tempfile::TempDir,
    manifest: PathBuf,
    tls: PathBuf,
    good: Value,
    first: Value,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        if entry.file_type().expect("a file type").is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))
                .unwrap_or_else(|e| panic!("{}: {e}", entry.path().display()));
        }
    }
}

impl SecurityFiles {
    /// A copy of `manifest` and the security directory `tls`.
    pub fn copy(manifest: &Path, tls: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let copy = dir.path().join("manifest.json");
        std::fs::copy(manifest, &copy).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let tls_copy = dir.path().join("security");
        copy_dir(tls, &tls_copy);
        let good: Value = serde_json::from_slice(&std::fs::read(&copy).expect("the manifest copy"))
            .expect("a JSON manifest");
        Self {
            _dir: dir,
            manifest: copy,
            tls: tls_copy,
            first: good.clone(),
            good,
        }
    }

    /// The manifest file replicas load.
    pub fn manifest_path(&self) -> &Path {
        &self.manifest
    }

    /// The directory of TLS and key files.
    pub fn tls_dir(&self) -> &Path {
        &self.tls
    }

    /// The generation in force.
    pub fn generation(&self) -> u64 {
        self.good["generation"].as_u64().unwrap_or(0)
    }

    fn write(&self, manifest: &Value) {
        let bytes = serde_json::to_vec_pretty(manifest).expect("the manifest serializes");
        std::fs::write(&self.manifest, bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", self.manifest.display()));
    }

    /// A valid rotation: the same authority under the next generation.
    pub fn rotate(&mut self) -> u64 {
        let next = self.generation() + 1;
        self.good["generation"] = next.into();
        self.write(&self.good);
        next
    }

    /// A rollback attempt: the previous generation when there is one, else the same
    /// generation with other permissions (drift). Returns what was written.
    pub fn attempt_rollback(&self) -> String {
        let mut bad = self.good.clone();
        let generation = self.generation();
        let what = if generation > 1 {
            bad["generation"] = (generation - 1).into();
            format!("rollback to generation {}", generation - 1)
        } else {
            let grant = bad
                .pointer_mut("/clients/0/executionTemplates")
                .and_then(|t| t.as_array_mut());
            if let Some(templates) = grant {
                templates.push("drifted".into());
            }
            format!("drift within generation {generation}")
        };
        self.write(&bad);
        what
    }

    /// A rotation that also changes the content: `edit` gets the manifest in force and the
    /// run's first manifest (to put withdrawn material back); the result is written under the
    /// next generation and is in force from then on. Returns that generation.
    pub fn rotate_with(&mut self, edit: impl FnOnce(&mut Value, &Value)) -> u64 {
        let first = self.first.clone();
        edit(&mut self.good, &first);
        self.rotate()
    }

    /// Writes the manifest in force back.
    pub fn restore(&self) {
        self.write(&self.good);
    }

    /// The production manager of `security`, reloading this directory.
    pub fn manager(&self, security: Security, kube: kube::Client) -> SecurityManager {
        SecurityManager::new(
            security,
            kube,
            SecuritySettings {
                manifest_path: self.manifest.clone(),
                tls_dir: self.tls.clone(),
                namespace: NAMESPACE.to_owned(),
                configmap: manager::DEFAULT_AUTHORITY_CONFIGMAP.to_owned(),
                reload_interval: RELOAD_INTERVAL,
                staleness: manager::DEFAULT_STALENESS,
            },
        )
    }
}
