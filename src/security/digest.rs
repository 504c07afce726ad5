//! The authority digest (api-security §6.3, era A as DECISIONS 4 keeps grants): SHA-256 of a
//! canonical JSON rendering of everything that grants authority in a manifest: version,
//! generation, every client's permissions (clients sorted by URI, scope lists sorted, empty
//! equal to absent), and the grant signing parameters and keys (sorted by id). TLS file names
//! and material are left out, so certificate rotation needs no new generation; every
//! replica computes the same digest from the same manifest.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::keys::KeyState;
use super::manifest::SecurityManifest;

#[derive(Serialize)]
struct Canonical<'a> {
    version: u32,
    generation: u64,
    clients: Vec<CanonicalClient<'a>>,
    issuer: &'a str,
    audience: &'a str,
    active_key_id: &'a str,
    grant_ttl_ms: u128,
    clock_skew_ms: u128,
    keys: Vec<CanonicalKey<'a>>,
}

#[derive(Serialize)]
struct CanonicalClient<'a> {
    uri: &'a str,
    may_attest_owner: bool,
    administrator: bool,
    administrator_for: Vec<&'a str>,
    execution_templates: Vec<&'a str>,
}

#[derive(Serialize)]
struct CanonicalKey<'a> {
    id: &'a str,
    version: u64,
    public_key_sha256: String,
    activate_at: String,
    verify_until: String,
    state: KeyState,
}

fn sorted(items: &[String]) -> Vec<&str> {
    let mut v: Vec<&str> = items.iter().map(String::as_str).collect();
    v.sort_unstable();
    v
}

/// The lowercase hex authority digest of a validated manifest.
pub fn authority_digest(m: &SecurityManifest) -> String {
    let mut clients: Vec<CanonicalClient<'_>> = m
        .clients
        .iter()
        .map(|c| CanonicalClient {
            uri: &c.uri,
            may_attest_owner: c.may_attest_owner,
            administrator: c.administrator,
            administrator_for: sorted(&c.administrator_for),
            execution_templates: sorted(&c.execution_templates),
        })
        .collect();
    clients.sort_by(|a, b| a.uri.cmp(b.uri));
    let mut keys: Vec<CanonicalKey<'_>> = m
        .keys
        .iter()
        .map(|k| CanonicalKey {
            id: &k.id,
            version: k.version,
            public_key_sha256: k.public_key_sha256.to_ascii_lowercase(),
            activate_at: k.activate_at.to_string(),
            verify_until: k.verify_until.to_string(),
            state: k.state,
        })
        .collect();
    keys.sort_by(|a, b| a.id.cmp(b.id));
    let millis = |text: &str| super::keys::parse_duration(text).map_or(0, |d| d.as_millis());
    let canonical = Canonical {
        version: m.version,
        generation: m.generation,
        clients,
        issuer: &m.issuer,
        audience: &m.audience,
        active_key_id: &m.active_key_id,
        grant_ttl_ms: millis(&m.grant_ttl),
        clock_skew_ms: millis(&m.clock_skew),
        keys,
    };
    let bytes = serde_json::to_vec(&canonical).expect("the canonical form serializes");
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::manifest::tests::SIGNING;

    fn digest_of(clients: &str, tls: &str) -> String {
        let text =
            format!(r#"{{"version":1,"generation":3,"tls":{tls},"clients":{clients},{SIGNING}}}"#);
        authority_digest(&SecurityManifest::parse(text.as_bytes()).unwrap())
    }

    const TLS: &str =
        r#"{"certificateFile":"a.pem","privateKeyFile":"a.key","clientCAFile":"c.pem"}"#;

    #[test]
    fn the_digest_ignores_tls_and_order_but_binds_every_permission() {
        let base = r#"[{"uri":"spiffe://c/a","mayAttestOwner":true,"executionTemplates":["x","y"]},{"uri":"spiffe://c/b","administrator":true}]"#;
        let reordered = r#"[{"uri":"spiffe://c/b","administrator":true,"administratorFor":[]},{"uri":"spiffe://c/a","mayAttestOwner":true,"executionTemplates":["y","x"]}]"#;
        let other_tls =
            r#"{"certificateFile":"b.pem","privateKeyFile":"b.key","clientCAFile":"d.pem"}"#;
        let d = digest_of(base, TLS);
        assert_eq!(d, digest_of(reordered, TLS));
        assert_eq!(d, digest_of(base, other_tls));
        for changed in [
            base.replace(r#""administrator":true"#, r#""administrator":false"#),
            base.replace(r#"["x","y"]"#, r#"["x"]"#),
            base.replace(
                r#""mayAttestOwner":true,"executionTemplates":["x","y"]"#,
                "\"mayAttestOwner\":true",
            ),
            base.replace("spiffe://c/b", "spiffe://c/z"),
        ] {
            assert_ne!(d, digest_of(&changed, TLS), "{changed}");
        }
    }

    const TWO_KEYS: &str = r#"{"version":1,"generation":3,"tls":{"certificateFile":"a.pem","privateKeyFile":"a.key","clientCAFile":"c.pem"},"clients":[{"uri":"spiffe://c/a","mayAttestOwner":true}],"issuer":"ep","audience":"ep","activeKeyID":"k1","grantTTL":"5m","clockSkew":"0s","keys":[{"id":"k1","version":1,"file":"k1.key","publicKeySHA256":"1111111111111111111111111111111111111111111111111111111111111111","activateAt":"2020-01-01T00:00:00Z","verifyUntil":"2100-01-01T00:00:00Z","state":"active"},{"id":"k2","version":2,"file":"k2.key","publicKeySHA256":"2222222222222222222222222222222222222222222222222222222222222222","activateAt":"2021-01-01T00:00:00Z","verifyUntil":"2100-01-01T00:00:00Z","state":"verify-only"}]}"#;

    fn digest_text(text: &str) -> String {
        authority_digest(&SecurityManifest::parse(text.as_bytes()).expect(text))
    }

    #[test]
    fn the_digest_changes_with_every_grant_parameter_but_not_with_limiter_bounds() {
        let d = digest_text(TWO_KEYS);
        let switch_active = TWO_KEYS
            .replace(r#""activeKeyID":"k1""#, r#""activeKeyID":"k2""#)
            .replace(r#""state":"active""#, r#""state":"verify-only""#)
            .replace(
                r#""2100-01-01T00:00:00Z","state":"verify-only"}]"#,
                r#""2100-01-01T00:00:00Z","state":"active"}]"#,
            );
        for changed in [
            TWO_KEYS.replace(r#""state":"verify-only""#, r#""state":"revoked""#),
            switch_active,
            TWO_KEYS.replace("2021-01-01T00:00:00Z", "2021-06-01T00:00:00Z"),
            TWO_KEYS.replace(r#""grantTTL":"5m""#, r#""grantTTL":"4m""#),
            TWO_KEYS.replace(r#""clockSkew":"0s""#, r#""clockSkew":"1s""#),
            TWO_KEYS.replace(r#""issuer":"ep""#, r#""issuer":"other""#),
            TWO_KEYS.replace(&"2".repeat(64), &"3".repeat(64)),
        ] {
            assert_ne!(changed, TWO_KEYS);
            assert_ne!(d, digest_text(&changed), "{changed}");
        }
        let bounded = TWO_KEYS.replacen(
            r#""version":1,"#,
            r#""version":1,"limits":{"maxConcurrentRPCs":8},"#,
            1,
        );
        assert_eq!(d, digest_text(&bounded), "limiter bounds are not authority");
    }
}
