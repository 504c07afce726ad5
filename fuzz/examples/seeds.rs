//! Writes the seed inputs of every fuzz target into `fuzz/seeds/<target>/`, made by the
//! project's own code: grants signed by the fixture keyring of the `grant_decode` check,
//! manifests the production parser accepts, helper request frames for every operation, and
//! request paths and glob patterns of each kind the helper meets. Every seed is checked to be
//! what its name says (a genuine grant verifies, a manifest parses, a frame decodes) before it
//! is written. Run it after a format change, then refresh the corpus (docs/testing.md):
//!
//! ```sh
//! cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use execution_provider::executor::protocol::{ExecutorRequest, Operation, decode_strict};
use execution_provider::helper::read_frame;
use execution_provider::runtime::SeededIds;
use execution_provider::security::SecurityManifest;
use execution_provider::security::grant::{self, GrantBinding, GrantError};
use execution_provider::security::keys;
use serde_json::{Value, json};

#[path = "../checks/grant_decode.rs"]
#[allow(dead_code)]
mod grant_decode;

fn main() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    write_all(&seeds.join("grant_decode"), grants());
    write_all(&seeds.join("manifest_parse"), manifests());
    write_all(&seeds.join("helper_request_decode"), request_frames());
    write_all(&seeds.join("helper_path_resolve"), paths());
}

/// Replaces the directory's files with `seeds`, each under its name.
fn write_all(dir: &Path, seeds: Vec<(String, Vec<u8>)>) {
    if dir.exists() {
        std::fs::remove_dir_all(dir).expect("the old seeds are removed");
    }
    std::fs::create_dir_all(dir).expect("the seed directory is created");
    for (name, bytes) in &seeds {
        let path: PathBuf = dir.join(name);
        std::fs::write(&path, bytes).expect("a seed is written");
    }
    println!("{}: {} seeds", dir.display(), seeds.len());
}

const NONCE: &str = "00112233445566778899aabbccddeeff";

/// Tokens signed by the fixture keyring, one per verification outcome.
fn grants() -> Vec<(String, Vec<u8>)> {
    let ring = grant_decode::keyring();
    let now = grant_decode::now();
    let sign = |ring: &keys::Keyring, binding: GrantBinding, at| {
        grant::sign(ring, binding, NONCE.into(), at)
            .expect("the fixture key signs")
            .0
    };
    let verify = |token: &str| {
        grant::verify(
            ring,
            token,
            &grant_decode::binding(),
            grant_decode::OPERATION,
            now,
        )
    };
    let genuine = sign(ring, grant_decode::binding(), now);
    assert!(verify(&genuine).is_ok(), "the genuine grant verifies");
    let other_epoch = sign(
        ring,
        GrantBinding {
            epoch: 2,
            ..grant_decode::binding()
        },
        now,
    );
    assert_eq!(verify(&other_epoch), Err(GrantError::Mismatch));
    let expired = sign(
        ring,
        grant_decode::binding(),
        now - Duration::from_secs(600),
    );
    assert_eq!(verify(&expired), Err(GrantError::Expired));
    let not_yet = sign(
        ring,
        grant_decode::binding(),
        now + Duration::from_secs(600),
    );
    assert_eq!(verify(&not_yet), Err(GrantError::NotYetValid));
    let foreign = sign(
        &grant_decode::fixture_keyring(2),
        grant_decode::binding(),
        now,
    );
    assert_eq!(verify(&foreign), Err(GrantError::BadSignature));
    let unsigned = genuine.rsplit_once('.').expect("three parts").0.to_owned() + ".";
    assert!(
        grant::decode(&unsigned).is_ok(),
        "the unsigned grant decodes"
    );
    [
        ("genuine", genuine),
        ("other_epoch", other_epoch),
        ("expired", expired),
        ("not_yet_valid", not_yet),
        ("foreign_key", foreign),
        ("unsigned", unsigned),
    ]
    .into_iter()
    .map(|(name, token)| (name.to_owned(), token.into_bytes()))
    .collect()
}

/// Manifests the production parser accepts: the documented rotation example with real key
/// fingerprints, every client permission, limiter bounds and each key state.
fn manifests() -> Vec<(String, Vec<u8>)> {
    let print = |seed| keys::generate(&SeededIds::new(seed)).1;
    let key = |id: &str, version: u64, from: &str, until: &str, state: &str| {
        json!({"id": id, "version": version, "file": format!("{id}.key"),
               "publicKeySHA256": print(version), "activateAt": from, "verifyUntil": until,
               "state": state})
    };
    let base = json!({
        "version": 1, "generation": 7,
        "tls": {"certificateFile": "server.pem", "privateKeyFile": "server.key",
                "clientCAFile": "clients.pem"},
        "clients": [
            {"uri": "spiffe://cluster/ns/platform", "mayAttestOwner": true,
             "executionTemplates": ["default", "gpu"]},
            {"uri": "spiffe://cluster/ns/ops", "administrator": true,
             "administratorFor": ["spiffe://cluster/ns/platform"]}
        ],
        "issuer": "execution-provider", "audience": "execution-provider",
        "activeKeyID": "k2", "grantTTL": "5m", "clockSkew": "0s",
        "keys": [
            key("k1", 1, "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "verify-only"),
            key("k2", 2, "2026-06-01T00:00:00Z", "2027-06-01T00:00:00.5Z", "active"),
        ]
    });
    let mut limited = base.clone();
    limited["limits"] = json!({"maxConcurrentRPCs": 128, "maxConcurrentRPCsPerClient": 32});
    limited["grantTTL"] = json!("4m30s");
    limited["clockSkew"] = json!("1500ms");
    let mut revoked = base.clone();
    revoked["keys"][0]["state"] = json!("revoked");
    revoked["generation"] = json!(i64::MAX);
    let mut minimal = base.clone();
    minimal["clients"] = json!([{"uri": "spiffe://c/a"}]);
    minimal["keys"] = json!([key(
        "k2",
        2,
        "2000-01-01T00:00:00Z",
        "2200-01-01T00:00:00Z",
        "active"
    )]);
    let texts = [
        ("rotation", pretty(&base)),
        ("rotation_compact", base.to_string()),
        ("limits", pretty(&limited)),
        ("revoked_key", pretty(&revoked)),
        ("minimal", minimal.to_string()),
    ];
    texts
        .into_iter()
        .map(|(name, text)| {
            SecurityManifest::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
            (format!("{name}.json"), text.into_bytes())
        })
        .collect()
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("a manifest encodes")
}

/// One stdin frame per operation, with the fields that operation uses.
fn request_frames() -> Vec<(String, Vec<u8>)> {
    Operation::ALL
        .iter()
        .map(|operation| {
            let request = typical_request(operation.clone());
            let mut frame = serde_json::to_vec(&request).expect("a request encodes");
            frame.push(b'\n');
            let decoded: ExecutorRequest =
                decode_strict(&read_frame(&mut &frame[..]).expect("a frame reads"))
                    .expect("the frame decodes");
            assert_eq!(decoded, request);
            (operation.as_str().replace('.', "_"), frame)
        })
        .collect()
}

fn typical_request(operation: Operation) -> ExecutorRequest {
    let request = ExecutorRequest::at(operation.clone(), "src/main.rs");
    match operation {
        Operation::FileCreate => ExecutorRequest {
            data: b"fn main() {}\n".to_vec(),
            ..request
        },
        Operation::FileReplace => ExecutorRequest {
            data: b"fn main() { println!(\"hi\"); }\n".to_vec(),
            version: "a".repeat(64),
            ..request
        },
        Operation::FileRename | Operation::FileCopy => ExecutorRequest {
            destination: "src/lib.rs".into(),
            ..request
        },
        Operation::FileList => ExecutorRequest {
            path: "src".into(),
            limit: 100,
            ..request
        },
        Operation::FileGlob => ExecutorRequest {
            path: String::new(),
            pattern: "**/*.{rs,toml}".into(),
            limit: 10,
            ..request
        },
        Operation::FileGrep => ExecutorRequest {
            path: "src".into(),
            pattern: "*.rs".into(),
            command: "fn main".into(),
            ..request
        },
        Operation::CommandStart => ExecutorRequest {
            limit: 65536,
            timeout_ms: 30_000,
            ..ExecutorRequest::command("cmd-1", "cargo test 2>&1 | tail -n 5")
        },
        Operation::CommandStatus | Operation::CommandCancel | Operation::CommandStream => {
            ExecutorRequest {
                command_id: "cmd-1".into(),
                ..ExecutorRequest::new(operation)
            }
        }
        _ => request,
    }
}

/// Request paths and glob patterns: plain, in-root and escaping symlinks, `..`, absolute,
/// repeated separators, and every glob construct.
fn paths() -> Vec<(String, Vec<u8>)> {
    [
        ("file", "src/main.rs"),
        ("dot", "./dir/."),
        ("inside_link", "inside/notes.txt"),
        ("outside_link", "outside/etc/passwd"),
        ("dotdot_in_root", "dir/../inside/x"),
        ("dotdot_out", "dir/../../x"),
        ("absolute", "/etc/passwd"),
        ("separators", "dir//a///b/"),
        ("doublestar", "**/*.rs"),
        ("braces", "src/{a,{b,c}}/*.[ch]"),
        ("class", "[!a-z]?[]x]-[^0-9]"),
        ("escape", "\\*literal\\?"),
    ]
    .into_iter()
    .map(|(name, text)| (name.to_owned(), text.as_bytes().to_vec()))
    .collect()
}
