//! The `helper_path_resolve` fuzz target: runs `fuzz/checks/helper_path_resolve.rs` on every input.
#![no_main]

#[path = "../checks/helper_path_resolve.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
