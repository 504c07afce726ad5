//! The SQLite database of a persisted API server (bundled SQLite through `rusqlite`, so no
//! system library is needed). Two tables: `objects`, one row per object keyed by
//! (kind, namespace, name) holding its JSON, and `meta`, holding the resourceVersion counter.
//! The file is marked by SQLite's `application_id` (so a foreign database is recognised and
//! left alone) and its schema version by `user_version`. The write-ahead log with
//! `synchronous=FULL` makes every commit durable before it returns.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};
use serde_json::Value;

use super::{ApiServerError, Loaded, parse_object};
use crate::kube::apiserver::store::ObjectKey;

/// The database's file name inside the state directory.
pub const STATE_FILE: &str = "apiserver.sqlite3";
/// `application_id` of our databases: "EPAS" (execution-provider API server).
const APPLICATION_ID: i32 = 0x4550_4153;
/// `user_version`: the schema version.
const SCHEMA_VERSION: i32 = 1;
const RESOURCE_VERSION_KEY: &str = "resourceVersion";
const MIGRATED_FROM_KEY: &str = "migratedFrom";

const SCHEMA: &str = "
    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
    CREATE TABLE objects (
        kind TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        object TEXT NOT NULL,
        PRIMARY KEY (kind, namespace, name)
    );
";
const UPSERT: &str = "INSERT INTO objects (kind, namespace, name, object) VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (kind, namespace, name) DO UPDATE SET object = excluded.object";
const DELETE: &str = "DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3";
const SET_META: &str = "INSERT INTO meta (key, value) VALUES (?1, ?2)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value";
const GET_META: &str = "SELECT value FROM meta WHERE key = ?1";

/// An open database of ours.
#[derive(Debug)]
pub struct Database {
    path: PathBuf,
    connection: Connection,
}

/// A database file that holds nothing yet (new, or created by a start that crashed before its
/// first commit).
#[derive(Debug)]
pub struct FreshDatabase {
    path: PathBuf,
    connection: Connection,
}

/// What [`Database::open`] found.
#[derive(Debug)]
pub enum Opened {
    /// A database of ours, ready to load.
    Existing(Database),
    /// An empty file, to initialise.
    Fresh(FreshDatabase),
}

/// Maps a SQLite error on `path`: unreadable content is corruption, the rest an I/O problem.
fn error(path: &Path, e: &rusqlite::Error) -> ApiServerError {
    let path = path.to_path_buf();
    let reason = e.to_string();
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            ApiServerError::Corrupt { path, reason }
        }
        _ => ApiServerError::Database { path, reason },
    }
}

/// Durability settings of every connection: write-ahead log, fsync at every commit.
fn configure(connection: &Connection) -> rusqlite::Result<()> {
    let mode: String =
        connection.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode is {mode}, not wal"
        )));
    }
    connection.pragma_update(None, "synchronous", "FULL")
}

impl Database {
    /// Opens (creating when absent) the database at `path` and tells whether it is ours or
    /// empty. Nothing is written to a file that is neither.
    pub fn open(path: &Path) -> Result<Opened, ApiServerError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connection = Connection::open_with_flags(path, flags).map_err(|e| error(path, &e))?;
        let path = path.to_path_buf();
        let fail = |e: rusqlite::Error| error(&path, &e);
        let application_id: i32 = connection
            .pragma_query_value(None, "application_id", |row| row.get(0))
            .map_err(fail)?;
        if application_id == APPLICATION_ID {
            let version: i32 = connection
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .map_err(fail)?;
            if version != SCHEMA_VERSION {
                return Err(ApiServerError::UnsupportedVersion {
                    path,
                    version: version.to_string(),
                });
            }
            configure(&connection).map_err(fail)?;
            return Ok(Opened::Existing(Database { path, connection }));
        }
        let tables: i64 = connection
            .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
            .map_err(fail)?;
        if application_id != 0 || tables != 0 {
            return Err(ApiServerError::Foreign { path });
        }
        Ok(Opened::Fresh(FreshDatabase { path, connection }))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn meta(&self, key: &str) -> Result<Option<String>, ApiServerError> {
        self.connection
            .query_row(GET_META, [key], |row| row.get(0))
            .optional()
            .map_err(|e| error(&self.path, &e))
    }

    /// Whether this database was made from a legacy JSON state file.
    pub fn migrated_from_legacy(&self) -> Result<bool, ApiServerError> {
        Ok(self.meta(MIGRATED_FROM_KEY)?.is_some())
    }

    /// Reads and checks every object and the counter.
    pub fn load(&self) -> Result<Loaded, ApiServerError> {
        let corrupt = |reason: String| ApiServerError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let fail = |e: rusqlite::Error| error(&self.path, &e);
        let resource_version = self
            .meta(RESOURCE_VERSION_KEY)?
            .and_then(|rv| rv.parse::<u64>().ok())
            .ok_or_else(|| corrupt("no valid resourceVersion counter".to_string()))?;
        let mut statement = self
            .connection
            .prepare("SELECT kind, namespace, name, object FROM objects")
            .map_err(fail)?;
        let mut rows = statement.query([]).map_err(fail)?;
        let mut objects = std::collections::BTreeMap::new();
        while let Some(row) = rows.next().map_err(fail)? {
            let stored_under: (String, String, String) = (
                row.get(0).map_err(fail)?,
                row.get(1).map_err(fail)?,
                row.get(2).map_err(fail)?,
            );
            let text: String = row.get(3).map_err(fail)?;
            let object: Value = serde_json::from_str(&text)
                .map_err(|e| corrupt(format!("object {stored_under:?}: {e}")))?;
            let key = parse_object(&object, resource_version).map_err(corrupt)?;
            if (key.kind, key.namespace.as_str(), key.name.as_str())
                != (
                    stored_under.0.as_str(),
                    stored_under.1.as_str(),
                    stored_under.2.as_str(),
                )
            {
                return Err(corrupt(format!(
                    "the row {stored_under:?} holds {} {:?}",
                    key.kind, key.name
                )));
            }
            objects.insert(key, object);
        }
        Ok(Loaded {
            resource_version,
            objects,
        })
    }

    /// One transaction: `object` stored under `key` (or its row removed) and the counter set.
    pub fn write(
        &mut self,
        resource_version: u64,
        key: &ObjectKey,
        object: Option<&Value>,
    ) -> rusqlite::Result<()> {
        let transaction = self.connection.transaction()?;
        let key_params = params![key.kind, key.namespace, key.name];
        match object {
            Some(object) => {
                let text = serde_json::to_string(object)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                transaction.prepare_cached(UPSERT)?.execute(params![
                    key.kind,
                    key.namespace,
                    key.name,
                    text
                ])?;
            }
            None => {
                transaction.prepare_cached(DELETE)?.execute(key_params)?;
            }
        }
        transaction
            .prepare_cached(SET_META)?
            .execute(params![RESOURCE_VERSION_KEY, resource_version.to_string()])?;
        transaction.commit()
    }
}

impl FreshDatabase {
    /// Creates the schema holding `loaded` in one transaction (recording whether it came from a
    /// legacy JSON file) and returns the database.
    pub fn initialise(self, loaded: &Loaded, migrated: bool) -> Result<Database, ApiServerError> {
        let Self {
            path,
            mut connection,
        } = self;
        let fail = |e: rusqlite::Error| error(&path, &e);
        configure(&connection).map_err(fail)?;
        let transaction = connection.transaction().map_err(fail)?;
        transaction.execute_batch(SCHEMA).map_err(fail)?;
        transaction
            .pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(fail)?;
        transaction
            .pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(fail)?;
        let mut meta = vec![(RESOURCE_VERSION_KEY, loaded.resource_version.to_string())];
        if migrated {
            meta.push((MIGRATED_FROM_KEY, super::LEGACY_STATE_FILE.to_string()));
        }
        for (key, value) in meta {
            transaction
                .execute(SET_META, params![key, value])
                .map_err(fail)?;
        }
        for (key, object) in &loaded.objects {
            let text = serde_json::to_string(object).map_err(|e| ApiServerError::Database {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            transaction
                .execute(UPSERT, params![key.kind, key.namespace, key.name, text])
                .map_err(fail)?;
        }
        transaction.commit().map_err(fail)?;
        Ok(Database { path, connection })
    }
}
