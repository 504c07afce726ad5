//! Tests of grant minting and verification: round trips, strict decoding, every verification
//! step of §5.3, key states, and property tests over tampering and foreign bindings.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer, SigningKey};
use proptest::prelude::*;

use super::*;
use crate::runtime::SeededIds;
use crate::security::SecurityManifest;
use crate::security::keys::{self, Keyring};

const NOW: u64 = 1_800_000_000;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

struct Key {
    id: &'static str,
    state: &'static str,
    seed: u64,
}

fn key_material(seed: u64) -> (String, String) {
    keys::generate(&SeededIds::new(seed))
}

fn signing_key(seed: u64) -> SigningKey {
    keys::parse_key_file(key_material(seed).0.as_bytes()).unwrap()
}

/// A keyring of `keys` (each valid from NOW-1000 s to NOW+10000 s), signing with `active`.
fn keyring(keys: &[Key], active: &str, ttl: &str) -> Keyring {
    let entries: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            format!(
                r#"{{"id":"{}","version":{},"file":"{}.key","publicKeySHA256":"{}","activateAt":"{}","verifyUntil":"{}","state":"{}"}}"#,
                k.id,
                i + 1,
                k.id,
                key_material(k.seed).1,
                RfcTime::from_system_time(at(NOW - 1000)),
                RfcTime::from_system_time(at(NOW + 10_000)),
                k.state
            )
        })
        .collect();
    let text = format!(
        r#"{{"version":1,"generation":1,"tls":{{"certificateFile":"s.pem","privateKeyFile":"s.key","clientCAFile":"c.pem"}},"clients":[{{"uri":"spiffe://c/a","mayAttestOwner":true}}],"issuer":"iss","audience":"aud","activeKeyID":"{active}","grantTTL":"{ttl}","clockSkew":"0s","keys":[{}]}}"#,
        entries.join(",")
    );
    let manifest = SecurityManifest::parse(text.as_bytes()).unwrap();
    Keyring::load(&manifest, |file: &str| {
        let key = keys
            .iter()
            .find(|k| format!("{}.key", k.id) == file)
            .unwrap();
        Ok::<_, keys::KeyringError>(key_material(key.seed).0.into_bytes())
    })
    .unwrap()
}

fn one_key() -> Keyring {
    keyring(
        &[Key {
            id: "k1",
            state: "active",
            seed: 1,
        }],
        "k1",
        "5m",
    )
}

fn binding() -> GrantBinding {
    GrantBinding {
        client: "spiffe://c/a".into(),
        owner: "ab".repeat(32),
        binding_id: "b1".into(),
        run_id: "run-1".into(),
        claim_id: "cd".repeat(16),
        environment: GrantEnvironment {
            id: format!("exec-{}", "0".repeat(40)),
            revision: "ef".repeat(16),
        },
        epoch: 3,
        grant_generation: 1,
    }
}

fn mint(ring: &Keyring) -> String {
    sign(ring, binding(), "00".repeat(16), at(NOW)).unwrap().0
}

/// Signs arbitrary header and payload JSON with the key of `seed`.
fn forge(header: &str, payload: &str, seed: u64) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let sig = signing_key(seed).sign(signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
}

fn payload_json(ring: &Keyring) -> serde_json::Value {
    let (_, claims) = decode(&mint(ring)).unwrap();
    serde_json::to_value(claims).unwrap()
}

const HEADER: &str = r#"{"alg":"Ed25519","kid":"k1","typ":"MECATL-GRANT"}"#;

#[test]
fn a_minted_grant_verifies_for_every_data_plane_operation() {
    let ring = one_key();
    let (token, expiry) = sign(&ring, binding(), "00".repeat(16), at(NOW)).unwrap();
    assert_eq!(expiry, at(NOW + 300));
    for op in DATA_PLANE_OPERATIONS {
        let claims = verify(&ring, &token, &binding(), op, at(NOW + 1)).unwrap();
        assert_eq!(claims.binding(), binding());
    }
}

#[test]
fn an_operation_outside_the_grant_is_refused() {
    let ring = one_key();
    let err = verify(&ring, &mint(&ring), &binding(), "attach", at(NOW)).unwrap_err();
    assert_eq!(err, GrantError::OperationNotGranted);
}

#[test]
fn expiry_is_unauthenticated_and_retryable_with_no_leeway() {
    let ring = one_key();
    let token = mint(&ring);
    verify(&ring, &token, &binding(), "file.read", at(NOW + 299)).unwrap();
    let err = verify(&ring, &token, &binding(), "file.read", at(NOW + 300)).unwrap_err();
    assert_eq!(err, GrantError::Expired);
    assert_eq!(err.wire(), WireError::retryable(ErrorCode::Unauthenticated));
    let early = verify(&ring, &token, &binding(), "file.read", at(NOW - 1)).unwrap_err();
    assert_eq!(early, GrantError::NotYetValid);
    assert_eq!(early.wire(), WireError::fatal(ErrorCode::PermissionDenied));
}

#[test]
fn a_lifetime_above_the_configured_ceiling_is_refused() {
    let long = one_key();
    let short = keyring(
        &[Key {
            id: "k1",
            state: "active",
            seed: 1,
        }],
        "k1",
        "1m",
    );
    let err = verify(&short, &mint(&long), &binding(), "file.read", at(NOW)).unwrap_err();
    assert_eq!(err, GrantError::TooLong);
}

#[test]
fn a_grant_from_another_issuer_or_for_another_audience_is_refused() {
    let ring = one_key();
    for (key, value) in [("iss", "other"), ("aud", "other")] {
        let mut payload = payload_json(&ring);
        payload[key] = value.into();
        let token = forge(HEADER, &payload.to_string(), 1);
        let err = verify(&ring, &token, &binding(), "file.read", at(NOW)).unwrap_err();
        assert_eq!(err, GrantError::WrongIssuer, "{key}");
    }
}

#[test]
fn strict_decoding_refuses_unknown_duplicate_and_trailing_json_and_padding() {
    let ring = one_key();
    let good = payload_json(&ring).to_string();
    let unknown = good.replacen('{', r#"{"extra":1,"#, 1);
    let duplicate = good.replacen('{', r#"{"iss":"iss","#, 1);
    let trailing = format!("{good} {{}}");
    for payload in [unknown, duplicate, trailing] {
        let token = forge(HEADER, &payload, 1);
        let err = verify(&ring, &token, &binding(), "file.read", at(NOW)).unwrap_err();
        assert_eq!(err, GrantError::Malformed, "{payload}");
    }
    let bad_headers = [
        r#"{"alg":"none","kid":"k1","typ":"MECATL-GRANT"}"#,
        r#"{"alg":"Ed25519","kid":"k1","typ":"JWT"}"#,
        r#"{"alg":"Ed25519","kid":"","typ":"MECATL-GRANT"}"#,
        r#"{"alg":"Ed25519","kid":"k1","typ":"MECATL-GRANT","x":1}"#,
    ];
    for header in bad_headers {
        let token = forge(header, &good, 1);
        let err = verify(&ring, &token, &binding(), "file.read", at(NOW)).unwrap_err();
        assert_eq!(err, GrantError::Malformed, "{header}");
    }
    let token = mint(&ring);
    for bad in [
        format!("{token}="),
        format!("{token}.x"),
        token.replacen('.', "=.", 1),
    ] {
        let err = verify(&ring, &bad, &binding(), "file.read", at(NOW)).unwrap_err();
        assert!(
            matches!(err, GrantError::Malformed | GrantError::BadSignature),
            "{bad}"
        );
    }
    let huge = "a".repeat(MAX_GRANT_BYTES + 1);
    assert_eq!(decode(&huge).unwrap_err(), GrantError::Malformed);
}

#[test]
fn incomplete_claims_and_bad_operation_lists_are_refused() {
    let ring = one_key();
    let mutations: [(&str, serde_json::Value); 5] = [
        ("nonce", "".into()),
        ("epoch", 0.into()),
        ("operations", serde_json::json!([])),
        ("operations", serde_json::json!(["file.read", "file.read"])),
        ("operations", serde_json::json!(["file.read", "rm -rf"])),
    ];
    for (key, value) in mutations {
        let mut payload = payload_json(&ring);
        payload[key] = value;
        let token = forge(HEADER, &payload.to_string(), 1);
        let err = verify(&ring, &token, &binding(), "file.read", at(NOW)).unwrap_err();
        assert_eq!(err, GrantError::Incomplete, "{key}");
    }
}

#[test]
fn key_states_decide_who_signs_and_what_verifies() {
    let old = keyring(
        &[Key {
            id: "k1",
            state: "active",
            seed: 1,
        }],
        "k1",
        "5m",
    );
    let old_grant = mint(&old);
    // Rotation: k2 signs, k1 only verifies.
    let rotated = keyring(
        &[
            Key {
                id: "k1",
                state: "verify-only",
                seed: 1,
            },
            Key {
                id: "k2",
                state: "active",
                seed: 2,
            },
        ],
        "k2",
        "5m",
    );
    verify(&rotated, &old_grant, &binding(), "file.read", at(NOW)).unwrap();
    let (kid, _) = decode(&mint(&rotated)).unwrap();
    assert_eq!(kid, "k2");
    // Revocation of k1 stops its grants at once.
    let revoked = keyring(
        &[
            Key {
                id: "k1",
                state: "revoked",
                seed: 1,
            },
            Key {
                id: "k2",
                state: "active",
                seed: 2,
            },
        ],
        "k2",
        "5m",
    );
    let err = verify(&revoked, &old_grant, &binding(), "file.read", at(NOW)).unwrap_err();
    assert_eq!(err, GrantError::RevokedKey);
    // Removal: unknown.
    let removed = keyring(
        &[Key {
            id: "k2",
            state: "active",
            seed: 2,
        }],
        "k2",
        "5m",
    );
    let err = verify(&removed, &old_grant, &binding(), "file.read", at(NOW)).unwrap_err();
    assert_eq!(err, GrantError::UnknownKey);
    // A key claiming another key's id does not verify.
    let impostor = keyring(
        &[Key {
            id: "k1",
            state: "active",
            seed: 9,
        }],
        "k1",
        "5m",
    );
    let err = verify(&impostor, &old_grant, &binding(), "file.read", at(NOW)).unwrap_err();
    assert_eq!(err, GrantError::BadSignature);
}

#[test]
fn no_grant_is_minted_outside_the_active_keys_window() {
    let ring = one_key();
    let err = sign(&ring, binding(), "00".repeat(16), at(NOW + 10_000)).unwrap_err();
    assert_eq!(err, GrantError::NoSigningKey);
    assert_eq!(err.wire(), WireError::retryable(ErrorCode::NotReady));
    let (_, expiry) = sign(&ring, binding(), "00".repeat(16), at(NOW + 9_900)).unwrap();
    assert_eq!(expiry, at(NOW + 10_000), "the grant ends with its key");
    let err = verify(
        &ring,
        &mint(&ring),
        &binding(),
        "file.read",
        at(NOW + 10_000),
    );
    assert!(err.is_err(), "a key outside its window verifies nothing");
}

fn mutate_binding(b: &mut GrantBinding, field: usize, salt: u64) {
    let salt_text = format!("x{salt}");
    match field {
        0 => b.client.push_str(&salt_text),
        1 => b.owner.push_str(&salt_text),
        2 => b.binding_id.push_str(&salt_text),
        3 => b.run_id.push_str(&salt_text),
        4 => b.claim_id.push_str(&salt_text),
        5 => b.environment.id.push_str(&salt_text),
        6 => b.environment.revision.push_str(&salt_text),
        7 => b.epoch = b.epoch.wrapping_add(salt % 1000 + 1),
        _ => b.grant_generation = b.grant_generation.wrapping_add(salt % 1000 + 1),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn grants_round_trip_for_any_binding(
        client in "[a-z]{1,8}://[a-z]{1,8}/[a-z/]{0,16}",
        binding_id in "[a-z0-9-]{1,40}",
        run_id in "\\PC{1,40}",
        epoch in 1u64..u64::MAX / 2,
        generation in 1u64..u64::MAX / 2,
    ) {
        let ring = one_key();
        let mut b = binding();
        b.client = client;
        b.binding_id = binding_id;
        b.run_id = run_id;
        b.epoch = epoch;
        b.grant_generation = generation;
        let (token, _) = sign(&ring, b.clone(), "11".repeat(16), at(NOW)).unwrap();
        let claims = verify(&ring, &token, &b, "command.start", at(NOW)).unwrap();
        prop_assert_eq!(claims.binding(), b);
    }

    #[test]
    fn changing_any_byte_of_a_grant_fails_verification(index in any::<prop::sample::Index>(), byte in 0x21u8..0x7f) {
        let ring = one_key();
        let token = mint(&ring);
        let mut bytes = token.clone().into_bytes();
        let i = index.index(bytes.len());
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        let tampered = String::from_utf8(bytes).unwrap();
        prop_assert!(verify(&ring, &tampered, &binding(), "file.read", at(NOW)).is_err());
    }

    #[test]
    fn a_grant_for_one_binding_is_refused_for_any_other(field in 0usize..9, salt in any::<u64>()) {
        let ring = one_key();
        let token = mint(&ring);
        let mut other = binding();
        mutate_binding(&mut other, field, salt);
        let err = verify(&ring, &token, &other, "file.read", at(NOW)).unwrap_err();
        prop_assert_eq!(err, GrantError::Mismatch);
    }
}
