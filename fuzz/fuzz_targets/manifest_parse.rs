//! Fuzzes strict security-manifest decoding and the authority digest: no input may panic,
//! and every accepted manifest has a digest.
#![no_main]

use execution_provider::security::SecurityManifest;
use execution_provider::security::digest::authority_digest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = SecurityManifest::parse(data) {
        assert_eq!(authority_digest(&manifest).len(), 64);
    }
});
