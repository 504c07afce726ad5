//! The `manifest_parse` fuzz target: runs `fuzz/checks/manifest_parse.rs` on every input.
#![no_main]

#[path = "../checks/manifest_parse.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
