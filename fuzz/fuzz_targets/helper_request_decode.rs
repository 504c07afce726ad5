//! Fuzzes the helper's request decoding: any stdin frame either decodes strictly into one
//! `ExecutorRequest` or is refused, never panics, and a decoded request re-encodes to JSON that
//! decodes to the same request; the generic bounds check never panics either.
#![no_main]

use execution_provider::executor::protocol::{ExecutorRequest, decode_strict};
use execution_provider::helper::{check_bounds, read_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
