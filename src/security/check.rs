//! An operator's check of a security directory (`execution-provider security check`): the
//! same strict rules the SecurityManager applies on every reload (api-security §6.1-§6.2;
//! [`loaded_problems`] is shared with the reload), but every problem is collected and
//! reported instead of stopping at the first one.
//!
//! Checked: the manifest decodes strictly and validates; each TLS file it names is a
//! basename present inside the directory (no escaping symlink, at most 1 MiB); the server
//! chain parses, its key matches, its leaf is valid now and usable for serverAuth; the client
//! CA bundle holds only CA certificates; every grant key file is one PKCS#8 Ed25519 block
//! whose public key matches `publicKeySHA256`; and the active key may sign now.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use x509_parser::prelude::{FromDer, X509Certificate};

use super::keys::{self, KeyState};
use super::manifest::{MAX_MANIFEST_BYTES, SecurityManifest};
use super::{LoadedSecurity, MAX_TLS_FILE_BYTES, read_bounded};
use crate::runtime::Clock;
use crate::runtime::tls::{self, Identity};
use rustls::pki_types::CertificateDer;

/// The outcome of a check: the manifest when it decoded, and every problem found.
#[derive(Debug)]
pub struct CheckReport {
    /// The manifest, if it decoded and validated.
    pub manifest: Option<SecurityManifest>,
    /// Each problem, one sentence naming the file or field at fault.
    pub problems: Vec<String>,
}

/// Checks the manifest at `manifest_path` against the files in `tls_dir` at `clock`'s time.
pub fn check_directory(manifest_path: &Path, tls_dir: &Path, clock: Arc<dyn Clock>) -> CheckReport {
    let mut problems = Vec::new();
    let manifest = match read_manifest(manifest_path) {
        Ok(m) => m,
        Err(problem) => {
            return CheckReport {
                manifest: None,
                problems: vec![problem],
            };
        }
    };
    let dir = match cap_std::fs::Dir::open_ambient_dir(tls_dir, cap_std::ambient_authority()) {
        Ok(dir) => dir,
        Err(e) => {
            problems.push(format!("cannot open directory {}: {e}", tls_dir.display()));
            return CheckReport {
                manifest: Some(manifest),
                problems,
            };
        }
    };
    let mut read = |name: &str| -> Option<Vec<u8>> {
        let shown = tls_dir.join(name);
        match dir
            .open(name)
            .and_then(|f| read_bounded(f.into_std(), MAX_TLS_FILE_BYTES))
        {
            Ok(Some(bytes)) => Some(bytes),
            Ok(None) => {
                problems.push(format!("{} exceeds 1 MiB", shown.display()));
                None
            }
            Err(e) => {
                problems.push(format!(
                    "cannot read {} inside the directory: {e}",
                    shown.display()
                ));
                None
            }
        }
    };
    let files = &manifest.tls;
    let cert = read(&files.certificate_file);
    let key = read(&files.private_key_file);
    let cas = read(&files.client_ca_file);
    let key_files: Vec<_> = manifest.keys.iter().map(|k| read(&k.file)).collect();
    let now = clock.wall();
    if let (Some(cert), Some(key)) = (cert, key) {
        check_server(&cert, &key, &files.certificate_file, clock, &mut problems);
    }
    if let Some(cas) = cas {
        match tls::certificates_from_pem(&cas, &files.client_ca_file) {
            Ok(cas) => problems.extend(client_ca_problems(&cas, &files.client_ca_file)),
            Err(e) => problems.push(format!("client CA bundle: {e}")),
        }
    }
    check_keys(&manifest, &key_files, now, &mut problems);
    CheckReport {
        manifest: Some(manifest),
        problems,
    }
}

/// Reads and strictly decodes a manifest; the problem when it cannot.
pub fn read_manifest(path: &Path) -> Result<SecurityManifest, String> {
    let bytes = std::fs::File::open(path)
        .and_then(|f| read_bounded(f, MAX_MANIFEST_BYTES as u64))
        .map_err(|e| format!("cannot read manifest {}: {e}", path.display()))?
        .ok_or_else(|| format!("manifest {} exceeds 8 MiB", path.display()))?;
    SecurityManifest::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn check_server(cert: &[u8], key: &[u8], name: &str, clock: Arc<dyn Clock>, out: &mut Vec<String>) {
    let identity = match Identity::from_pem(cert, key, name) {
        Ok(identity) => identity,
        Err(e) => return out.push(format!("server certificate or key: {e}")),
    };
    if let Err(e) = tls::server_config(&identity, clock.clone()) {
        out.push(format!("server key does not fit certificate {name}: {e}"));
    }
    out.extend(server_leaf_problems(&identity, name, clock.as_ref()));
}

/// What `security check` and every reload refuse in loaded TLS material: a server leaf that
/// is not valid at `clock`'s time or lacks the serverAuth usage, and a client CA bundle entry
/// that is not a CA certificate (a leaf there would become a trust anchor).
pub fn loaded_problems(loaded: &LoadedSecurity, clock: &dyn Clock) -> Vec<String> {
    let files = &loaded.manifest.tls;
    let mut problems = server_leaf_problems(&loaded.server, &files.certificate_file, clock);
    problems.extend(client_ca_problems(
        &loaded.client_cas,
        &files.client_ca_file,
    ));
    problems
}

fn server_leaf_problems(identity: &Identity, name: &str, clock: &dyn Clock) -> Vec<String> {
    let mut out = Vec::new();
    let Ok((_, leaf)) = X509Certificate::from_der(&identity.chain[0]) else {
        out.push(format!("server certificate {name} does not parse"));
        return out;
    };
    let now = i64::try_from(clock.unix().as_secs()).unwrap_or(i64::MAX);
    let validity = leaf.validity();
    if now < validity.not_before.timestamp() || now >= validity.not_after.timestamp() {
        out.push(format!(
            "server certificate {name} is not valid now (valid {} to {})",
            validity.not_before, validity.not_after
        ));
    }
    if let Ok(Some(eku)) = leaf.extended_key_usage()
        && !eku.value.server_auth
        && !eku.value.any
    {
        out.push(format!(
            "server certificate {name} lacks the serverAuth usage"
        ));
    }
    out
}

fn client_ca_problems(cas: &[CertificateDer<'static>], name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, der) in cas.iter().enumerate() {
        let is_ca = X509Certificate::from_der(der)
            .ok()
            .and_then(|(_, c)| c.basic_constraints().ok().flatten().map(|b| b.value.ca));
        if is_ca != Some(true) {
            out.push(format!(
                "client CA bundle {name}: certificate {} is not a CA",
                i + 1
            ));
        }
    }
    out
}

fn check_keys(
    manifest: &SecurityManifest,
    files: &[Option<Vec<u8>>],
    now: SystemTime,
    out: &mut Vec<String>,
) {
    for (entry, bytes) in manifest.keys.iter().zip(files) {
        let Some(bytes) = bytes else { continue };
        let Some(key) = keys::parse_key_file(bytes) else {
            out.push(format!(
                "key {}: {} is not exactly one PKCS#8 Ed25519 PRIVATE KEY block",
                entry.id, entry.file
            ));
            continue;
        };
        let print = keys::fingerprint(&key.verifying_key());
        if !print.eq_ignore_ascii_case(&entry.public_key_sha256) {
            out.push(format!(
                "key {}: {} has publicKeySHA256 {print}, the manifest says {}",
                entry.id, entry.file, entry.public_key_sha256
            ));
        }
    }
    if let Some(active) = manifest
        .keys
        .iter()
        .find(|k| k.id == manifest.active_key_id)
    {
        let window = active.activate_at.to_system_time()..active.verify_until.to_system_time();
        if active.state != KeyState::Active || !window.contains(&now) {
            out.push(format!(
                "active key {} may not sign now (window {} to {})",
                active.id, active.activate_at, active.verify_until
            ));
        }
    }
}
