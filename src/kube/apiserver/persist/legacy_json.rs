//! The state file format of earlier versions, read only to migrate it: one JSON document
//! holding every object and the resourceVersion counter, marked with a format name and
//! version. After a migration has committed, the file is renamed aside (kept as a backup,
//! never read again).

use std::{collections::BTreeMap, fs, io, path::Path};

use serde_json::Value;

use super::{ApiServerError, Loaded, parse_object};

/// The legacy state file's name inside the state directory.
pub const LEGACY_STATE_FILE: &str = "apiserver.json";
/// What the legacy state file is renamed to once its content is in the database.
pub const MIGRATED_LEGACY_STATE_FILE: &str = "apiserver.json.migrated";
const FORMAT: &str = "execution-provider/apiserver-state";
const VERSION: u64 = 1;

/// Reads the legacy state file at `path`, `None` if there is none.
pub fn read(path: &Path) -> Result<Option<Loaded>, ApiServerError> {
    match fs::read(path) {
        Ok(text) => parse(&text, path).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ApiServerError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
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
        let key = parse_object(item, resource_version).map_err(corrupt)?;
        if objects.insert(key.clone(), item.clone()).is_some() {
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

/// Renames the migrated legacy file at `path` aside (nothing to do if it is gone) and makes
/// the rename durable.
pub fn rename_aside(path: &Path) -> Result<(), ApiServerError> {
    let fail = |source| ApiServerError::Read {
        path: path.to_path_buf(),
        source,
    };
    let target = path.with_file_name(MIGRATED_LEGACY_STATE_FILE);
    match fs::rename(path, &target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(fail(source)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(fail)
}
