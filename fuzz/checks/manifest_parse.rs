//! The `manifest_parse` fuzz check: strict security-manifest decoding and the authority
//! digest. No input may panic, and every accepted manifest has a digest.
//!
//! Shared by the fuzz target and the replay of `fuzz/regressions/manifest_parse/` in
//! `tests/security_grants.rs`.

use execution_provider::security::SecurityManifest;
use execution_provider::security::digest::authority_digest;

/// Parses `data` as a manifest and digests it when accepted; panics only on a bug.
pub fn check(data: &[u8]) {
    if let Ok(manifest) = SecurityManifest::parse(data) {
        assert_eq!(authority_digest(&manifest).len(), 64);
    }
}
