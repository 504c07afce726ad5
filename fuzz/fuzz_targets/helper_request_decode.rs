//! The `helper_request_decode` fuzz target: runs `fuzz/checks/helper_request_decode.rs` on every input.
#![no_main]

#[path = "../checks/helper_request_decode.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
