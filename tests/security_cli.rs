//! The operator's `execution-provider security` subcommands (issue 3, deliverable 8):
//! `keygen` writes a grant key with private file modes and never overwrites, `digest` prints
//! what the ledger will record, and `check` reports every problem of a security directory
//! and exits non-zero. Run through the functions and through the built binary.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use execution_provider::cli::security::{KeygenArgs, keygen};
use execution_provider::cli::state_dir::StateDir;
use execution_provider::runtime::{Runtime, SystemClock};
use execution_provider::security::SecurityManifest;
use execution_provider::security::check::check_directory;
use execution_provider::security::digest::authority_digest;
use execution_provider::security::keys;

fn binary(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_execution-provider"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code().expect("an exit code"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn keygen_args(dir: &Path, id: &str) -> KeygenArgs {
    KeygenArgs {
        key_directory: dir.to_owned(),
        id: id.to_owned(),
        version: 2,
        file: None,
        activate_at: None,
        verify_until: None,
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A dev security directory: (state dir guard, manifest path, security dir).
fn dev_security() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open_or_init(tmp.path()).unwrap();
    (tmp, state.manifest_path(), state.security_dir())
}

fn problems(manifest: &Path, dir: &Path) -> Vec<String> {
    check_directory(manifest, dir, Arc::new(SystemClock)).problems
}

#[test]
fn keygen_writes_a_private_key_file_that_matches_the_entry_it_prints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys");
    let entry = keygen(&keygen_args(&dir, "k2"), &Runtime::system()).unwrap();
    assert_eq!(mode(&dir), 0o700, "a new key directory is private");
    let file = dir.join("k2.key");
    assert_eq!(entry.file, "k2.key");
    assert_eq!(mode(&file), 0o600, "the key file is private");
    let key = keys::parse_key_file(&std::fs::read(&file).unwrap()).expect("one PKCS#8 block");
    assert_eq!(
        keys::fingerprint(&key.verifying_key()),
        entry.public_key_sha256
    );
    assert_eq!(entry.version, 2);
    assert!(entry.activate_at < entry.verify_until);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["k2.key"], "no temporary file is left behind");
}

#[test]
fn keygen_refuses_to_overwrite_an_existing_key_and_leaves_it_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    keygen(&keygen_args(tmp.path(), "k1"), &Runtime::system()).unwrap();
    let before = std::fs::read(tmp.path().join("k1.key")).unwrap();
    let error = keygen(&keygen_args(tmp.path(), "k1"), &Runtime::system()).unwrap_err();
    assert!(
        error.to_string().contains("refusing to overwrite"),
        "{error:#}"
    );
    assert_eq!(std::fs::read(tmp.path().join("k1.key")).unwrap(), before);

    let dir = tmp.path().to_str().unwrap();
    let (code, _, stderr) = binary(&["security", "keygen", "--key-directory", dir, "--id", "k1"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("refusing to overwrite"), "{stderr}");
    assert_eq!(std::fs::read(tmp.path().join("k1.key")).unwrap(), before);
}

#[test]
fn keygen_refuses_a_bad_id_a_zero_version_a_path_or_an_empty_window() {
    let tmp = tempfile::tempdir().unwrap();
    let runtime = Runtime::system();
    let bad_id = keygen_args(tmp.path(), "k/1");
    let zero = KeygenArgs {
        version: 0,
        ..keygen_args(tmp.path(), "k1")
    };
    let path = KeygenArgs {
        file: Some("../k1.key".into()),
        ..keygen_args(tmp.path(), "k1")
    };
    let t = "2030-01-01T00:00:00Z".parse().ok();
    let empty = KeygenArgs {
        activate_at: t,
        verify_until: t,
        ..keygen_args(tmp.path(), "k1")
    };
    for args in [bad_id, zero, path, empty] {
        assert!(keygen(&args, &runtime).is_err(), "{args:?}");
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn digest_prints_the_generation_and_the_authority_digest_the_ledger_records() {
    let (_tmp, manifest, _) = dev_security();
    let parsed = SecurityManifest::parse(&std::fs::read(&manifest).unwrap()).unwrap();
    let (code, stdout, _) = binary(&[
        "security",
        "digest",
        "--manifest",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let expected = format!("generation 1\ndigest {}\n", authority_digest(&parsed));
    assert_eq!(stdout, expected);

    std::fs::write(&manifest, br#"{"version":2}"#).unwrap();
    let (code, _, stderr) = binary(&[
        "security",
        "digest",
        "--manifest",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("manifest"), "{stderr}");
}

#[test]
fn check_passes_a_valid_directory_including_a_key_added_by_keygen() {
    let (_tmp, manifest, dir) = dev_security();
    assert_eq!(problems(&manifest, &dir), Vec::<String>::new());
    let entry = keygen(&keygen_args(&dir, "next"), &Runtime::system()).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let mut value = serde_json::to_value(&entry).unwrap();
    value["state"] = "verify-only".into();
    json["keys"].as_array_mut().unwrap().push(value);
    std::fs::write(&manifest, serde_json::to_vec(&json).unwrap()).unwrap();
    assert_eq!(problems(&manifest, &dir), Vec::<String>::new());
    let (code, stdout, _) = binary(&[
        "security",
        "check",
        "--manifest",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.starts_with("ok: generation 1 digest "), "{stdout}");
}

#[test]
fn check_reports_every_missing_or_mismatched_file_and_exits_non_zero() {
    let (tmp, manifest, dir) = dev_security();
    std::fs::remove_file(dir.join("clients.pem")).unwrap();
    let (other_key, _) = keys::generate(&execution_provider::runtime::OsIds);
    std::fs::write(dir.join("grant.key"), other_key).unwrap();
    let outside = tmp.path().join("outside.key");
    std::fs::rename(dir.join("server.key"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("server.key")).unwrap();
    let found = problems(&manifest, &dir);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].contains("server.key"),
        "escaping symlink: {}",
        found[0]
    );
    assert!(found[1].contains("clients.pem"), "missing: {}", found[1]);
    assert!(
        found[2].contains("publicKeySHA256"),
        "fingerprint: {}",
        found[2]
    );

    let (code, stdout, _) = binary(&[
        "security",
        "check",
        "--manifest",
        manifest.to_str().unwrap(),
        "--tls-directory",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("problem: "))
            .count(),
        3,
        "{stdout}"
    );
}

#[test]
fn check_reports_a_manifest_that_does_not_decode_strictly_and_a_key_that_does_not_fit() {
    let (_tmp, manifest, dir) = dev_security();
    let good = std::fs::read(&manifest).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&good).unwrap();
    json["surprise"] = true.into();
    std::fs::write(&manifest, serde_json::to_vec(&json).unwrap()).unwrap();
    let found = problems(&manifest, &dir);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("unknown field"), "{}", found[0]);

    std::fs::write(&manifest, &good).unwrap();
    let ca = execution_provider::cli::pki::DevCa::generate("other").unwrap();
    std::fs::write(dir.join("server.key"), ca.server().unwrap().key).unwrap();
    let found = problems(&manifest, &dir);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("does not fit"), "{}", found[0]);
}

#[test]
fn check_reports_a_client_ca_bundle_holding_a_leaf() {
    let (_tmp, manifest, dir) = dev_security();
    let server = std::fs::read(dir.join("server.pem")).unwrap();
    std::fs::write(dir.join("clients.pem"), server).unwrap();
    let found = problems(&manifest, &dir);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("is not a CA"), "{}", found[0]);
}
