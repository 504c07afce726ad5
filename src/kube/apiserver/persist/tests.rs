//! Tests of the state directory: the database round trip, the lock, refusal of files that are
//! not ours (left byte for byte as they were), and the migration of a legacy JSON file.

use std::fs;

use serde_json::{Value, json};

use super::*;

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        kind: "ConfigMap",
        namespace: "default".to_string(),
        name: name.to_string(),
    }
}

fn config_map(name: &str, rv: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv.to_string()}})
}

fn legacy_document(rv: u64, objects: &[Value]) -> String {
    json!({"format": "execution-provider/apiserver-state", "version": 1,
        "resourceVersion": rv.to_string(), "objects": objects})
    .to_string()
}

#[test]
fn written_changes_load_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut persister, loaded) = Persister::open(dir.path()).expect("opens empty");
    assert_eq!(loaded.resource_version, 0);
    assert!(loaded.objects.is_empty());
    assert_eq!(persister.path(), dir.path().join(STATE_FILE));
    let (a, b) = (config_map("a", 1), config_map("b", 2));
    persister.write(1, &key("a"), Some(&a)).expect("writes a");
    persister.write(2, &key("b"), Some(&b)).expect("writes b");
    let a3 = config_map("a", 3);
    persister.write(3, &key("a"), Some(&a3)).expect("updates a");
    persister.write(4, &key("b"), None).expect("removes b");
    drop(persister);
    let (_, loaded) = Persister::open(dir.path()).expect("reopens");
    assert_eq!(loaded.resource_version, 4);
    assert_eq!(loaded.objects, BTreeMap::from([(key("a"), a3)]));
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

type Expect = fn(&ApiServerError) -> bool;

#[test]
fn corrupt_foreign_and_future_legacy_files_are_refused_with_the_path() {
    let cases: [(String, Expect); 5] = [
        ("{not json".to_string(), |e| {
            matches!(e, ApiServerError::Corrupt { .. })
        }),
        (r#"{"hello": 1}"#.to_string(), |e| {
            matches!(e, ApiServerError::Foreign { .. })
        }),
        (
            r#"{"format": "execution-provider/apiserver-state", "version": 9}"#.to_string(),
            |e| matches!(e, ApiServerError::UnsupportedVersion { .. }),
        ),
        (
            legacy_document(
                1,
                &[json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "resourceVersion": "1"}})],
            ),
            |e| matches!(e, ApiServerError::Corrupt { .. }),
        ),
        (legacy_document(1, &[config_map("c", 5)]), |e| {
            matches!(e, ApiServerError::Corrupt { .. })
        }),
    ];
    for (text, expected) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LEGACY_STATE_FILE);
        fs::write(&path, &text).expect("write");
        let err = Persister::open(dir.path()).expect_err("refused");
        assert!(expected(&err), "{text}: {err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(fs::read_to_string(&path).expect("read"), text);
        // Nothing was migrated: the next start reads the same file again.
        let again = Persister::open(dir.path()).expect_err("still refused");
        assert_eq!(again.to_string(), err.to_string());
    }
}

/// Writes a database with `setup` through a plain connection and returns its bytes.
fn sqlite_file(path: &Path, setup: &str) -> Vec<u8> {
    let connection = rusqlite::Connection::open(path).expect("sqlite opens");
    connection.execute_batch(setup).expect("setup");
    drop(connection);
    fs::read(path).expect("read")
}

#[test]
fn corrupt_foreign_and_future_databases_are_refused_and_left_as_they_were() {
    let ours_v9 = "PRAGMA application_id = 1162887507; PRAGMA user_version = 9;
        CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);";
    let cases: [(Option<&str>, Expect); 4] = [
        (None, |e| matches!(e, ApiServerError::Corrupt { .. })),
        (Some("CREATE TABLE notes (text TEXT);"), |e| {
            matches!(e, ApiServerError::Foreign { .. })
        }),
        (Some("PRAGMA application_id = 7;"), |e| {
            matches!(e, ApiServerError::Foreign { .. })
        }),
        (Some(ours_v9), |e| {
            matches!(e, ApiServerError::UnsupportedVersion { .. })
        }),
    ];
    for (setup, expected) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(STATE_FILE);
        let bytes = match setup {
            Some(setup) => sqlite_file(&path, setup),
            None => {
                let garbage =
                    b"this is not a database, but it is long enough to have a header of sorts";
                fs::write(&path, garbage).expect("write");
                garbage.to_vec()
            }
        };
        let err = Persister::open(dir.path()).expect_err("refused");
        assert!(expected(&err), "{setup:?}: {err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(fs::read(&path).expect("read"), bytes, "{setup:?}");
    }
}

#[test]
fn a_database_whose_creation_never_committed_is_initialised() {
    let dir = tempfile::tempdir().expect("tempdir");
    // What a first start that crashed right after switching to the write-ahead log leaves.
    sqlite_file(&dir.path().join(STATE_FILE), "PRAGMA journal_mode = WAL;");
    let legacy = legacy_document(4, &[config_map("kept", 4)]);
    fs::write(dir.path().join(LEGACY_STATE_FILE), &legacy).expect("write");
    let (_, loaded) = Persister::open(dir.path()).expect("initialises");
    assert_eq!(loaded.resource_version, 4);
    assert_eq!(loaded.objects.len(), 1);
}

#[test]
fn a_legacy_file_is_migrated_once_and_renamed_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let legacy_path = dir.path().join(LEGACY_STATE_FILE);
    let legacy = legacy_document(6, &[config_map("a", 2), config_map("b", 6)]);
    fs::write(&legacy_path, &legacy).expect("write");
    let (mut persister, loaded) = Persister::open(dir.path()).expect("migrates");
    assert_eq!(loaded.resource_version, 6);
    assert_eq!(
        loaded.objects.keys().cloned().collect::<Vec<_>>(),
        vec![key("a"), key("b")]
    );
    assert!(!legacy_path.exists());
    let aside = dir.path().join(MIGRATED_LEGACY_STATE_FILE);
    assert_eq!(fs::read_to_string(&aside).expect("kept aside"), legacy);
    persister.write(7, &key("a"), None).expect("writes");
    drop(persister);

    // A crash between the migration's commit and the rename leaves the legacy file beside the
    // database: the database wins and the file is renamed aside again.
    fs::copy(&aside, &legacy_path).expect("copy back");
    let (_, loaded) = Persister::open(dir.path()).expect("reopens");
    assert_eq!(loaded.resource_version, 7);
    assert_eq!(
        loaded.objects.keys().cloned().collect::<Vec<_>>(),
        vec![key("b")]
    );
    assert!(!legacy_path.exists());
}

#[test]
fn a_row_stored_under_another_key_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut persister, _) = Persister::open(dir.path()).expect("opens");
    persister
        .write(1, &key("a"), Some(&config_map("b", 1)))
        .expect("writes");
    drop(persister);
    let err = Persister::open(dir.path()).expect_err("refused");
    assert!(matches!(err, ApiServerError::Corrupt { .. }), "{err}");
}
