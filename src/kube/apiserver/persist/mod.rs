//! The persistence of an API server's state directory: an embedded SQLite database
//! ([`database`]) holding one row per object and the resourceVersion counter. Every
//! acknowledged mutation is one transaction that writes one row and the counter, committed
//! (write-ahead log, `synchronous=FULL`) before the answer, so a write costs the same with ten
//! objects as with ten thousand, and a crash at any instant loses nothing acknowledged.
//!
//! A state directory written by an older version (one JSON document, [`legacy_json`]) is
//! migrated on the first start in one transaction; the JSON file is then renamed aside.
//! A directory is used by one server at a time (an advisory lock file).

mod database;
mod legacy_json;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::{meta, registry, store::ObjectKey};
use database::Database;

pub use database::STATE_FILE;
pub use legacy_json::{LEGACY_STATE_FILE, MIGRATED_LEGACY_STATE_FILE};

const LOCK_FILE: &str = "apiserver.lock";

/// Why a persisted API server could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The state directory could not be created.
    #[error("cannot create the API server state directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A state file exists but could not be read (or renamed aside after its migration).
    #[error("cannot read the API server state file {}: {source}", path.display())]
    Read {
        /// The state file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Another live API server (in this or another process) holds the state directory.
    #[error("the API server state directory {} is in use by another API server (lock file {})", dir.display(), dir.join(LOCK_FILE).display())]
    Locked {
        /// The state directory.
        dir: PathBuf,
    },
    /// The database could not be opened, initialised or read for a reason other than its
    /// content (permissions, a full disk, ...).
    #[error("cannot use the API server database {}: {reason}", path.display())]
    Database {
        /// The database file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A state file is not readable as what it claims to be, or its content is inconsistent.
    #[error("the API server state file {} is corrupt ({reason}); it was left untouched", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A state file of the right shape (JSON, or SQLite) that another program wrote.
    #[error("{} is not an API server state file (no execution-provider format marker); it was left untouched", path.display())]
    Foreign {
        /// The state file.
        path: PathBuf,
    },
    /// A state file written by an incompatible version.
    #[error("the API server state file {} has unsupported version {version}; it was left untouched", path.display())]
    UnsupportedVersion {
        /// The state file.
        path: PathBuf,
        /// The version found.
        version: String,
    },
}

/// What a state directory held.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The resourceVersion counter.
    pub resource_version: u64,
    /// Every stored object.
    pub objects: BTreeMap<ObjectKey, Value>,
}

/// Writes the database of one state directory, holding the directory's lock while it lives.
#[derive(Debug)]
pub struct Persister {
    database: Database,
    _lock: fs::File,
}

/// Creates (or opens) a file readable only by its owner: objects may hold key material.
fn create_private(path: &Path) -> io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Takes the exclusive lock of `dir`, so two servers never write the same state.
fn lock(dir: &Path) -> Result<fs::File, ApiServerError> {
    let path = dir.join(LOCK_FILE);
    let read_error = |source| ApiServerError::Read {
        path: path.clone(),
        source,
    };
    let file = create_private(&path).map_err(read_error)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(ApiServerError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(source)) => Err(read_error(source)),
    }
}

/// Checks one stored object (a served kind, a name, the right scope, a resourceVersion not
/// beyond the counter) and returns the key it is stored under.
fn parse_object(object: &Value, max_rv: u64) -> Result<ObjectKey, String> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind_name = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let kind = registry::by_api_version_kind(api_version, kind_name)
        .ok_or_else(|| format!("an object of unknown kind {api_version}/{kind_name}"))?;
    let name = meta::non_empty(object, "name")
        .ok_or_else(|| format!("a {kind_name} without a name"))?
        .to_string();
    let namespace = meta::non_empty(object, "namespace")
        .unwrap_or("")
        .to_string();
    if kind.namespaced == namespace.is_empty() {
        return Err(format!("{kind_name} {name:?} has the wrong scope"));
    }
    let rv = meta::get_str(object, "resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .ok_or_else(|| format!("{kind_name} {name:?} has no valid resourceVersion"))?;
    if rv > max_rv {
        return Err(format!(
            "{kind_name} {name:?} has resourceVersion {rv} beyond the counter {max_rv}"
        ));
    }
    Ok(ObjectKey {
        kind: kind.kind,
        namespace,
        name,
    })
}

impl Persister {
    /// Opens `dir` (creating it) and loads its state: from the database, or, on the first
    /// start after an upgrade, from the legacy JSON file, which is migrated into a new
    /// database in one transaction and then renamed aside. A corrupt or foreign file is an
    /// error naming it and is never modified.
    pub fn open(dir: &Path) -> Result<(Self, Loaded), ApiServerError> {
        fs::create_dir_all(dir).map_err(|source| ApiServerError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = lock(dir)?;
        let legacy = dir.join(LEGACY_STATE_FILE);
        let (database, loaded) = match Database::open(&dir.join(STATE_FILE))? {
            database::Opened::Existing(database) => {
                let loaded = database.load()?;
                if database.migrated_from_legacy()? {
                    // A crash after the migration's commit may have left the JSON file.
                    legacy_json::rename_aside(&legacy)?;
                }
                (database, loaded)
            }
            database::Opened::Fresh(fresh) => match legacy_json::read(&legacy)? {
                Some(loaded) => {
                    let database = fresh.initialise(&loaded, true)?;
                    legacy_json::rename_aside(&legacy)?;
                    tracing::info!(
                        from = %legacy.display(),
                        to = %database.path().display(),
                        objects = loaded.objects.len(),
                        "migrated the API server state to the embedded database"
                    );
                    (database, loaded)
                }
                None => {
                    let loaded = Loaded::default();
                    (fresh.initialise(&loaded, false)?, loaded)
                }
            },
        };
        let persister = Self {
            database,
            _lock: lock,
        };
        Ok((persister, loaded))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.database.path()
    }

    /// Commits one change in one transaction: `object` stored under `key` (or the row of `key`
    /// removed, for `None`) and the counter set to `resource_version`.
    pub fn write(
        &mut self,
        resource_version: u64,
        key: &ObjectKey,
        object: Option<&Value>,
    ) -> Result<(), rusqlite::Error> {
        self.database.write(resource_version, key, object)
    }
}
