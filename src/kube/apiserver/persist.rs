//! The state file of a persisted API server: one JSON document holding every object and the
//! resourceVersion counter, marked with a format name and version so that a foreign file is
//! recognised and never overwritten. Every write goes to a temporary file that is fsynced and
//! renamed over the state file, and the directory is fsynced, so a crash at any instant leaves
//! either the previous or the new state.

use std::{
    collections::BTreeMap,
    fs, io,
    io::Write,
    path::{Path, PathBuf},
};

use serde::Serialize;
use serde_json::Value;

use super::{meta, registry, store::ObjectKey};

/// The state file's name inside the state directory.
pub const STATE_FILE: &str = "apiserver.json";
const TEMP_FILE: &str = "apiserver.json.tmp";
const LOCK_FILE: &str = "apiserver.lock";
const FORMAT: &str = "execution-provider/apiserver-state";
const VERSION: u64 = 1;

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
    /// The state file exists but could not be read.
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
    /// The state file is not valid JSON or its content is inconsistent.
    #[error("the API server state file {} is corrupt ({reason}); it was left untouched", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The state file is JSON but not an API server state file.
    #[error("{} is not an API server state file (no {FORMAT:?} format marker); it was left untouched", path.display())]
    Foreign {
        /// The state file.
        path: PathBuf,
    },
    /// The state file was written by an incompatible version.
    #[error("the API server state file {} has unsupported version {version} (expected {VERSION}); it was left untouched", path.display())]
    UnsupportedVersion {
        /// The state file.
        path: PathBuf,
        /// The version found.
        version: String,
    },
}

/// What a state file held.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The resourceVersion counter.
    pub resource_version: u64,
    /// Every stored object.
    pub objects: BTreeMap<ObjectKey, Value>,
}

/// Writes the state file of one state directory, holding the directory's lock while it lives.
#[derive(Debug)]
pub struct Persister {
    dir: PathBuf,
    path: PathBuf,
    temp: PathBuf,
    _lock: fs::File,
}

/// Creates (or truncates) a file readable only by its owner: objects may hold key material.
fn create_private(path: &Path, truncate: bool) -> io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(truncate);
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
    let file = create_private(&path, false).map_err(read_error)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(ApiServerError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(source)) => Err(read_error(source)),
    }
}

#[derive(Serialize)]
struct StateRef<'a> {
    format: &'static str,
    version: u64,
    #[serde(rename = "resourceVersion")]
    resource_version: String,
    objects: Vec<&'a Value>,
}

fn parse_object(object: Value, max_rv: u64) -> Result<(ObjectKey, Value), String> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind_name = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let kind = registry::by_api_version_kind(api_version, kind_name)
        .ok_or_else(|| format!("an object of unknown kind {api_version}/{kind_name}"))?;
    let name = meta::non_empty(&object, "name")
        .ok_or_else(|| format!("a {kind_name} without a name"))?
        .to_string();
    let namespace = meta::non_empty(&object, "namespace")
        .unwrap_or("")
        .to_string();
    if kind.namespaced == namespace.is_empty() {
        return Err(format!("{kind_name} {name:?} has the wrong scope"));
    }
    let rv = meta::get_str(&object, "resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .ok_or_else(|| format!("{kind_name} {name:?} has no valid resourceVersion"))?;
    if rv > max_rv {
        return Err(format!(
            "{kind_name} {name:?} has resourceVersion {rv} beyond the counter {max_rv}"
        ));
    }
    let key = ObjectKey {
        kind: kind.kind,
        namespace,
        name,
    };
    Ok((key, object))
}

fn parse(text: &[u8], path: &Path) -> Result<Loaded, ApiServerError> {
    let corrupt = |reason: String| ApiServerError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let document: Value = serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
    if document.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(ApiServerError::Foreign {
            path: path.to_path_buf(),
        });
    }
    let version = document.get("version").cloned().unwrap_or(Value::Null);
    if version.as_u64() != Some(VERSION) {
        return Err(ApiServerError::UnsupportedVersion {
            path: path.to_path_buf(),
            version: version.to_string(),
        });
    }
    let resource_version = document
        .get("resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse::<u64>().ok())
        .ok_or_else(|| corrupt("no valid resourceVersion counter".to_string()))?;
    let Some(Value::Array(items)) = document.get("objects") else {
        return Err(corrupt("no objects array".to_string()));
    };
    let mut objects = BTreeMap::new();
    for item in items {
        let (key, object) = parse_object(item.clone(), resource_version).map_err(corrupt)?;
        if objects.insert(key.clone(), object).is_some() {
            return Err(corrupt(format!(
                "{} {:?} appears twice",
                key.kind, key.name
            )));
        }
    }
    Ok(Loaded {
        resource_version,
        objects,
    })
}

impl Persister {
    /// Opens `dir` (creating it), loading its state file if there is one.
    pub fn open(dir: &Path) -> Result<(Self, Loaded), ApiServerError> {
        fs::create_dir_all(dir).map_err(|source| ApiServerError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let persister = Self {
            dir: dir.to_path_buf(),
            path: dir.join(STATE_FILE),
            temp: dir.join(TEMP_FILE),
            _lock: lock(dir)?,
        };
        let loaded = match fs::read(&persister.path) {
            Ok(text) => parse(&text, &persister.path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Loaded::default(),
            Err(source) => {
                return Err(ApiServerError::Read {
                    path: persister.path.clone(),
                    source,
                });
            }
        };
        Ok((persister, loaded))
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically replaces the state file with `objects` and the counter `resource_version`.
    pub fn save(
        &self,
        resource_version: u64,
        objects: &BTreeMap<ObjectKey, Value>,
    ) -> io::Result<()> {
        let state = StateRef {
            format: FORMAT,
            version: VERSION,
            resource_version: resource_version.to_string(),
            objects: objects.values().collect(),
        };
        let bytes = serde_json::to_vec(&state).map_err(io::Error::other)?;
        let mut file = create_private(&self.temp, true)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&self.temp, &self.path)?;
        fs::File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            kind: "ConfigMap",
            namespace: "default".to_string(),
            name: name.to_string(),
        }
    }

    #[test]
    fn saved_state_loads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (persister, loaded) = Persister::open(dir.path()).expect("opens empty");
        assert_eq!(loaded.resource_version, 0);
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "default", "resourceVersion": "3"}});
        let objects = BTreeMap::from([(key("a"), object.clone())]);
        persister.save(7, &objects).expect("saves");
        drop(persister);
        let (_, loaded) = Persister::open(dir.path()).expect("reopens");
        assert_eq!(loaded.resource_version, 7);
        assert_eq!(loaded.objects, objects);
        assert!(!dir.path().join(TEMP_FILE).exists());
    }

    #[test]
    fn a_state_directory_is_used_by_one_server_at_a_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (first, _) = Persister::open(dir.path()).expect("opens");
        let err = Persister::open(dir.path()).expect_err("locked");
        assert!(matches!(err, ApiServerError::Locked { .. }), "{err}");
        drop(first);
        Persister::open(dir.path()).expect("reopens after the first is gone");
    }

    #[test]
    fn corrupt_foreign_and_future_files_are_refused_with_the_path() {
        type Expect = fn(&ApiServerError) -> bool;
        let cases: [(&str, Expect); 5] = [
            ("{not json", |e| matches!(e, ApiServerError::Corrupt { .. })),
            (r#"{"hello": 1}"#, |e| {
                matches!(e, ApiServerError::Foreign { .. })
            }),
            (
                r#"{"format": "execution-provider/apiserver-state", "version": 9}"#,
                |e| matches!(e, ApiServerError::UnsupportedVersion { .. }),
            ),
            (
                r#"{"format": "execution-provider/apiserver-state", "version": 1, "resourceVersion": "1", "objects": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}]}"#,
                |e| matches!(e, ApiServerError::Corrupt { .. }),
            ),
            (
                r#"{"format": "execution-provider/apiserver-state", "version": 1, "resourceVersion": "1", "objects": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d", "resourceVersion": "5"}}]}"#,
                |e| matches!(e, ApiServerError::Corrupt { .. }),
            ),
        ];
        for (text, expected) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join(STATE_FILE);
            fs::write(&path, text).expect("write");
            let err = Persister::open(dir.path()).expect_err("refused");
            assert!(expected(&err), "{text}: {err}");
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
            assert_eq!(fs::read_to_string(&path).expect("read"), text);
        }
    }
}
