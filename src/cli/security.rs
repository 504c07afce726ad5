//! `execution-provider security`: what an operator needs to run the security directory of
//! api-security §6 by hand.
//!
//! - `keygen` writes a new Ed25519 grant key (PKCS#8 PEM, mode 0600) into a key directory
//!   (created 0700 when missing), never over an existing file, and prints the manifest's key
//!   entry for it.
//! - `digest` prints a manifest's generation and authority digest (what the ledger records).
//! - `check` checks a manifest against a security directory and reports every problem; it
//!   exits 1 when there is any.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::kube::crd::RfcTime;
use crate::runtime::Runtime;
use crate::security::check::{check_directory, read_manifest};
use crate::security::digest::authority_digest;
use crate::security::keys::{self, KeyState, ManifestKey};
use crate::security::manifest::is_basename;

/// Default verification window of a new key.
const DEFAULT_KEY_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Options of `security`.
#[derive(Debug, clap::Args)]
pub struct SecurityArgs {
    /// The subcommand.
    #[command(subcommand)]
    pub command: SecurityCommand,
}

/// Subcommands of `security`.
#[derive(Debug, clap::Subcommand)]
pub enum SecurityCommand {
    /// Generates an Ed25519 grant signing key and prints its manifest entry.
    Keygen(KeygenArgs),
    /// Prints a manifest's generation and authority digest.
    Digest {
        /// The manifest file.
        #[arg(long = "manifest")]
        manifest: PathBuf,
    },
    /// Checks a manifest against a security directory; exits 1 on any problem.
    Check {
        /// The manifest file.
        #[arg(long = "manifest")]
        manifest: PathBuf,
        /// The directory holding the TLS and key files the manifest names (default: the
        /// manifest's directory).
        #[arg(long = "tls-directory")]
        tls_directory: Option<PathBuf>,
    },
}

/// Options of `security keygen`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeygenArgs {
    /// The key directory (the security directory of the manifest).
    #[arg(long = "key-directory")]
    pub key_directory: PathBuf,
    /// The key id (`kid`): 1..64 of `[A-Za-z0-9_-]`.
    #[arg(long)]
    pub id: String,
    /// The key's version: non-zero, higher than every earlier version of this id.
    #[arg(long, default_value_t = 1)]
    pub version: u64,
    /// The key file's name in the directory (default `<id>.key`).
    #[arg(long)]
    pub file: Option<String>,
    /// When the key starts to verify (RFC 3339; default now).
    #[arg(long)]
    pub activate_at: Option<RfcTime>,
    /// When the key stops verifying (RFC 3339; default a year after activation).
    #[arg(long)]
    pub verify_until: Option<RfcTime>,
}

/// Runs `security` and returns the exit code.
pub fn run(args: SecurityArgs, runtime: &Runtime) -> anyhow::Result<i32> {
    let mut out = std::io::stdout().lock();
    match args.command {
        SecurityCommand::Keygen(args) => {
            let entry = keygen(&args, runtime)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&entry)?)?;
            Ok(0)
        }
        SecurityCommand::Digest { manifest } => {
            let m = read_manifest(&manifest).map_err(anyhow::Error::msg)?;
            writeln!(out, "generation {}", m.generation)?;
            writeln!(out, "digest {}", authority_digest(&m))?;
            Ok(0)
        }
        SecurityCommand::Check {
            manifest,
            tls_directory,
        } => {
            let dir = tls_directory.unwrap_or_else(|| manifest_dir(&manifest));
            let report = check_directory(&manifest, &dir, runtime.clock.clone());
            for problem in &report.problems {
                writeln!(out, "problem: {problem}")?;
            }
            match (&report.manifest, report.problems.is_empty()) {
                (Some(m), true) => {
                    writeln!(
                        out,
                        "ok: generation {} digest {}",
                        m.generation,
                        authority_digest(m)
                    )?;
                    Ok(0)
                }
                _ => Ok(1),
            }
        }
    }
}

fn manifest_dir(manifest: &Path) -> PathBuf {
    match manifest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Writes a new grant key into the key directory and returns its manifest entry (state
/// `active`; set it to `verify-only` if it should not sign yet).
pub fn keygen(args: &KeygenArgs, runtime: &Runtime) -> anyhow::Result<ManifestKey> {
    let id_ok = (1..=64).contains(&args.id.len())
        && args
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !id_ok {
        bail!("--id must be 1..64 of [A-Za-z0-9_-], got {:?}", args.id);
    }
    if args.version == 0 {
        bail!("--version must be non-zero");
    }
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| format!("{}.key", args.id));
    if !is_basename(&file) {
        bail!("--file must be a plain file name, got {file:?}");
    }
    let activate_at = args
        .activate_at
        .unwrap_or_else(|| RfcTime::from_system_time(runtime.clock.wall()).whole_seconds());
    let verify_until = args.verify_until.unwrap_or_else(|| {
        RfcTime::from_system_time(activate_at.to_system_time() + DEFAULT_KEY_LIFETIME)
    });
    if verify_until <= activate_at {
        bail!("--verify-until must be after --activate-at");
    }
    let (pem, fingerprint) = keys::generate(runtime.ids.as_ref());
    ensure_key_directory(&args.key_directory)?;
    let tmp_name = format!(".{file}.{}.tmp", runtime.ids.hex(8));
    write_private_new(&args.key_directory, &tmp_name, &file, pem.as_bytes())?;
    Ok(ManifestKey {
        id: args.id.clone(),
        version: args.version,
        file,
        public_key_sha256: fingerprint,
        activate_at,
        verify_until,
        state: KeyState::Active,
    })
}

/// Creates the key directory (mode 0700) when missing; an existing one must be a directory.
fn ensure_key_directory(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display())),
        Err(e) => Err(e).with_context(|| format!("cannot inspect {}", dir.display())),
    }
}

/// Writes `bytes` to `dir/name` with mode 0600, refusing to replace an existing file: the
/// bytes go to a temporary file first (fsynced), which is then hard-linked to its name (the
/// link fails when the name exists) and removed.
fn write_private_new(dir: &Path, tmp_name: &str, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let target = dir.join(name);
    if std::fs::symlink_metadata(&target).is_ok() {
        bail!("refusing to overwrite {}", target.display());
    }
    let tmp = dir.join(tmp_name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, &target));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("refusing to overwrite {}", target.display())
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", target.display())),
    }
}
