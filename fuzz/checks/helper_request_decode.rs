//! The `helper_request_decode` fuzz check: any stdin frame either decodes strictly into one
//! `ExecutorRequest` or is refused, never panics, and a decoded request re-encodes to JSON that
//! decodes to the same request; the generic bounds check never panics either.
//!
//! Shared by the fuzz target and the replay of `fuzz/regressions/helper_request_decode/` in
//! `tests/helper_escapes.rs`.

use execution_provider::executor::protocol::{ExecutorRequest, decode_strict};
use execution_provider::helper::{check_bounds, read_frame};

/// Reads `data` as the helper reads its stdin; panics only on a bug.
pub fn check(data: &[u8]) {
    let Ok(frame) = read_frame(&mut &data[..]) else {
        return;
    };
    let Ok(request) = decode_strict::<ExecutorRequest>(&frame) else {
        return;
    };
    let _ = check_bounds(&request);
    let encoded = serde_json::to_vec(&request).expect("a request always encodes");
    let again: ExecutorRequest = decode_strict(&encoded).expect("its own encoding decodes");
    assert_eq!(again, request);
}
