//! The hashes and names derived from identities: owner and client hashes, request
//! fingerprints and the deterministic environment name.

use sha2::{Digest, Sha256};

/// `hex(sha256(issuer || 0x00 || subject))`.
pub fn owner_hash(issuer: &str, subject: &str) -> String {
    let mut h = Sha256::new();
    h.update(issuer.as_bytes());
    h.update([0u8]);
    h.update(subject.as_bytes());
    hex::encode(h.finalize())
}

/// `hex(sha256(client_uri))`.
pub fn client_hash(client_uri: &str) -> String {
    hex::encode(Sha256::digest(client_uri.as_bytes()))
}

/// `hex(sha256(0x00 || f1 || 0x00 || f2 ...))`.
pub fn fingerprint(fields: &[&str]) -> String {
    let mut h = Sha256::new();
    for field in fields {
        h.update([0u8]);
        h.update(field.as_bytes());
    }
    hex::encode(h.finalize())
}

/// `"exec-" + hex(first 20 bytes of sha256(client || 0 || ownerHash || 0 || binding))`.
pub fn allocation_name(client_uri: &str, owner_hash: &str, binding_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(client_uri.as_bytes());
    h.update([0u8]);
    h.update(owner_hash.as_bytes());
    h.update([0u8]);
    h.update(binding_id.as_bytes());
    format!("exec-{}", hex::encode(&h.finalize()[..20]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_and_45_characters() {
        let owner = owner_hash("https://issuer", "alice");
        let a = allocation_name("spiffe://c/a", &owner, "b1");
        assert_eq!(a, allocation_name("spiffe://c/a", &owner, "b1"));
        assert_eq!(a.len(), 45);
        assert_ne!(a, allocation_name("spiffe://c/a", &owner, "b2"));
    }

    #[test]
    fn field_boundaries_change_the_fingerprint() {
        assert_ne!(fingerprint(&["ab", "c"]), fingerprint(&["a", "bc"]));
        assert_ne!(owner_hash("a", "bc"), owner_hash("ab", "c"));
    }

    #[test]
    fn owner_hash_matches_a_known_vector() {
        // sha256("a" || 0x00 || "b"), computed independently.
        assert_eq!(
            owner_hash("a", "b"),
            "59b271ae1bbcb1d31d41929817f4b16fb439eb4f31520b5ad1d5ce98920a7138"
        );
    }
}
