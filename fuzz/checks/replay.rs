//! Replays the committed fuzz regressions (`fuzz/regressions/<target>/`) through the same check
//! the fuzz target runs, in the ordinary `cargo test` suite: every input an earlier fuzzing run
//! crashed on, or that reached an edge worth keeping, must pass its check without panicking.

use std::panic;
use std::path::{Path, PathBuf};

/// Runs `check` on every file of `fuzz/regressions/<target>/`; fails naming each file that
/// panics, and when the directory holds no input at all.
pub fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no input", dir.display());
    let panicked: Vec<String> = inputs
        .iter()
        .filter(|input| {
            let data = std::fs::read(input).expect("a regression input reads");
            panic::catch_unwind(|| check(&data)).is_err()
        })
        .map(|input| input.display().to_string())
        .collect();
    assert!(
        panicked.is_empty(),
        "the {target} check panics on {} of {} regression inputs: {panicked:#?}",
        panicked.len(),
        inputs.len()
    );
}
