//! The core does not reach the wire (issue 15, item 5): the store, the reconciler, the
//! executor, the helper, the templates, the Kubernetes seam and the error codes never name the
//! generated protobuf types, `tonic`, `prost` or the server. Only `src/server` turns an error
//! code into a `tonic::Status` with an `ErrorDetail`.

use std::path::{Path, PathBuf};

/// Core paths, relative to `src/`, that must stay free of wire types.
const CORE: [&str; 7] = [
    "errors.rs",
    "store",
    "reconciler",
    "executor",
    "helper",
    "templates",
    "kube",
];

/// What a core source line must not name.
const WIRE: [&str; 6] = [
    "crate::api",
    "crate::server",
    "tonic",
    "prost",
    "ErrorDetail",
    "execution_provider::api",
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .expect("readable source directory")
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            rust_files(&entry, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The wire names a line of code uses (comments are not code).
fn wire_names(line: &str) -> Vec<&'static str> {
    let code = line.split("//").next().unwrap_or_default();
    WIRE.into_iter()
        .filter(|name| {
            code.match_indices(name).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + name.len()..].chars().next();
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !word(before) && !word(after)
            })
        })
        .collect()
}

#[test]
fn the_core_names_no_wire_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for core in CORE {
        rust_files(&src.join(core), &mut files);
    }
    assert!(files.len() > 20, "the core sources were not found");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            for name in wire_names(line) {
                found.push(format!("{}:{}: {name}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "core code names wire types:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_wire_name_in_code_is_caught_and_one_in_a_comment_is_not() {
    assert_eq!(
        wire_names("use crate::api::pb::ErrorDetail;"),
        ["crate::api", "ErrorDetail"]
    );
    assert_eq!(wire_names("impl From<E> for tonic::Status {"), ["tonic"]);
    assert!(wire_names("/// becomes a `tonic::Status` in the server").is_empty());
    assert!(wire_names("let now = clock.monotonic();").is_empty());
}
