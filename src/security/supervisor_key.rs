//! The supervisor key `K_sup` of `serve` (docs/commands.md §4.2): 32 bytes from which every
//! replica derives the same per-Pod secret of each executor's supervisor.
//!
//! It is a file of the security directory like the TLS and grant-key files: `supervisor.key`
//! beside them unless `--supervisor-key-file` names another file. It is read once, at start:
//!
//! * named by the flag: it must be there and be exactly 32 bytes, or `serve` does not start;
//! * not named: the security directory's `supervisor.key` is used when present (and must then
//!   be 32 bytes); when absent, `serve` runs without supervisor sessions, and every detached or
//!   supervised command answers `UNIMPLEMENTED` "executor has no supervisor".
//!
//! A changed file takes effect at the next start of each replica. Executors whose supervisors
//! were enrolled with the old key then refuse sessions (`UNAVAILABLE`) until they are replaced;
//! their one-shot calls (files, foreground commands) keep working.

use std::path::{Path, PathBuf};

use super::SecurityError;

/// The file name of the key in the security directory (`dev` uses the same name).
pub const SUPERVISOR_KEY_FILE: &str = "supervisor.key";
/// The key's length.
pub const SUPERVISOR_KEY_LEN: usize = 32;

/// Why the supervisor key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorKeyError {
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] SecurityError),
    /// The file is not exactly 32 bytes.
    #[error("{0} is not a {SUPERVISOR_KEY_LEN}-byte key")]
    Length(PathBuf),
}

/// Loads `K_sup`: from `file` when given (required), else from the security directory's
/// [`SUPERVISOR_KEY_FILE`] when it exists. `Ok(None)`: no key, so no supervisor sessions.
pub fn load(
    file: Option<&Path>,
    security_dir: &Path,
) -> Result<Option<Vec<u8>>, SupervisorKeyError> {
    let (path, required) = match file {
        Some(path) => (path.to_owned(), true),
        None => (security_dir.join(SUPERVISOR_KEY_FILE), false),
    };
    let links = path
        .parent()
        .map(|dir| vec![dir.join(super::PROJECTION_LINK)])
        .unwrap_or_default();
    let read = super::read_consistently(&links, || read_key(&path, required))?;
    let Some(key) = read else { return Ok(None) };
    if key.len() != SUPERVISOR_KEY_LEN {
        return Err(SupervisorKeyError::Length(path));
    }
    Ok(Some(key))
}

/// At most one byte more than a key (a longer file reads as one byte too many); `None` when
/// the file is absent and not `required`.
fn read_key(path: &Path, required: bool) -> Result<Option<Vec<u8>>, SecurityError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(None),
        Err(source) => return Err(super::read_error(path, source)),
    };
    let limit = SUPERVISOR_KEY_LEN as u64;
    match super::read_bounded(file, limit) {
        Ok(Some(bytes)) => Ok(Some(bytes)),
        Ok(None) => Ok(Some(vec![0; SUPERVISOR_KEY_LEN + 1])),
        Err(source) => Err(super::read_error(path, source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_default_key_means_no_supervisor_and_a_present_one_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(None, dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(SUPERVISOR_KEY_FILE), [7u8; 32]).unwrap();
        assert_eq!(load(None, dir.path()).unwrap(), Some(vec![7u8; 32]));
    }

    #[test]
    fn a_named_key_is_required_and_every_key_must_be_32_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("other.key");
        let missing = load(Some(&named), dir.path()).unwrap_err();
        assert!(
            matches!(
                missing,
                SupervisorKeyError::Read(SecurityError::Read { .. })
            ),
            "{missing}"
        );
        std::fs::write(&named, [1u8; 32]).unwrap();
        assert_eq!(load(Some(&named), dir.path()).unwrap(), Some(vec![1u8; 32]));
        for bad in [&[1u8; 31][..], &[1u8; 33][..], b""] {
            std::fs::write(&named, bad).unwrap();
            let error = load(Some(&named), dir.path()).unwrap_err();
            assert!(
                matches!(error, SupervisorKeyError::Length(_)),
                "{}",
                bad.len()
            );
            std::fs::write(dir.path().join(SUPERVISOR_KEY_FILE), bad).unwrap();
            assert!(load(None, dir.path()).is_err(), "{}", bad.len());
        }
    }
}
