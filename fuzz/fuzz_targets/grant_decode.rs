//! The `grant_decode` fuzz target: runs `fuzz/checks/grant_decode.rs` on every input.
#![no_main]

#[path = "../checks/grant_decode.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
