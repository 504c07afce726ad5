//! The grant keyring (DECISIONS 4; api-security §5.4 and the era-A key fields of §6.1): the
//! manifest's signing parameters and key entries, their validation, loading of the PKCS#8
//! Ed25519 key files with their public-key fingerprints checked, and which key may sign or
//! verify at a given instant.
//!
//! A key is usable for verification while its state is not `revoked` and
//! `activateAt <= now < verifyUntil`. Only `activeKeyID` signs, and only while it is `active`
//! and inside its window.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::{ManifestError, SecurityManifest, is_basename};
use crate::kube::crd::RfcTime;
use crate::runtime::IdSource;

/// The longest grant lifetime a manifest may configure.
pub const MAX_GRANT_TTL: Duration = Duration::from_secs(300);
const MAX_KEYS: usize = 64;
const MAX_KEY_ID: usize = 64;

/// The lifecycle state of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyState {
    /// May sign (when named by `activeKeyID`) and verify.
    Active,
    /// Verifies grants it signed until `verifyUntil`; never signs.
    VerifyOnly,
    /// Verifies nothing: grants it signed are refused at once.
    Revoked,
}

/// One key entry of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ManifestKey {
    /// Key id (`kid`): 1..64 of `[A-Za-z0-9_-]`, unique.
    pub id: String,
    /// Non-zero, unique across all keys; a rotation of the same id takes a higher version.
    pub version: u64,
    /// The PKCS#8 PEM private key, by basename in the security directory.
    pub file: String,
    /// Lowercase hex SHA-256 of the raw 32-byte public key.
    #[serde(rename = "publicKeySHA256")]
    pub public_key_sha256: String,
    /// When the key starts to verify (and may sign).
    pub activate_at: RfcTime,
    /// When the key stops verifying.
    pub verify_until: RfcTime,
    /// The key's state.
    pub state: KeyState,
}

/// Validates the signing fields of a manifest (issuer, audience, TTLs, keys).
pub fn validate(m: &SecurityManifest) -> Result<(), ManifestError> {
    let invalid = |s: &str| Err(ManifestError::Invalid(s.to_owned()));
    if m.issuer.is_empty() || m.audience.is_empty() || m.active_key_id.is_empty() {
        return invalid("issuer, audience and activeKeyID must be non-empty");
    }
    let ttl = parse_duration(&m.grant_ttl);
    let skew = parse_duration(&m.clock_skew);
    match (ttl, skew) {
        (Some(ttl), Some(skew)) if !ttl.is_zero() && ttl <= MAX_GRANT_TTL && skew < ttl => {}
        _ => return invalid("grantTTL and clockSkew must satisfy 0 <= clockSkew < grantTTL <= 5m"),
    }
    if m.keys.is_empty() || m.keys.len() > MAX_KEYS {
        return invalid("keys must have 1..64 entries");
    }
    let (mut ids, mut versions) = (BTreeSet::new(), BTreeSet::new());
    for key in &m.keys {
        let id_ok = !key.id.is_empty()
            && key.id.len() <= MAX_KEY_ID
            && key
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok || !ids.insert(key.id.as_str()) {
            return invalid("key ids must be unique and 1..64 of [A-Za-z0-9_-]");
        }
        if key.version == 0 || !versions.insert(key.version) {
            return invalid("key versions must be non-zero and unique");
        }
        if !is_basename(&key.file) {
            return invalid("key files must be plain file names");
        }
        let fingerprint_ok =
            key.public_key_sha256.len() == 64 && hex::decode(&key.public_key_sha256).is_ok();
        if !fingerprint_ok {
            return invalid("publicKeySHA256 must be 64 hex digits");
        }
        if key.verify_until <= key.activate_at {
            return invalid("verifyUntil must be after activateAt");
        }
    }
    match m.keys.iter().find(|k| k.id == m.active_key_id) {
        Some(k) if k.state == KeyState::Active => Ok(()),
        _ => invalid("activeKeyID must name a key in state active"),
    }
}

/// Parses a Go-style duration made of `<digits><unit>` parts (units `h`, `m`, `s`, `ms`),
/// such as `5m`, `90s` or `1m30s`. `0` alone is zero.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 12 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else {
            match rest.as_bytes().first()? {
                b'h' => (Duration::from_secs(3600), 1),
                b'm' => (Duration::from_secs(60), 1),
                b's' => (Duration::from_secs(1), 1),
                _ => return None,
            }
        };
        rest = &rest[len..];
        total = total.checked_add(unit.checked_mul(u32::try_from(value).ok()?)?)?;
    }
    Some(total)
}

/// Lowercase hex SHA-256 of a raw public key: the manifest's `publicKeySHA256`.
pub fn fingerprint(key: &VerifyingKey) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new signing key from `ids`, as PKCS#8 PEM, with its fingerprint.
pub fn generate(ids: &dyn IdSource) -> (String, String) {
    let mut secret = [0u8; 32];
    ids.fill(&mut secret);
    let key = SigningKey::from_bytes(&secret);
    let pem = key
        .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .expect("an Ed25519 key encodes as PKCS#8")
        .to_string();
    (pem, fingerprint(&key.verifying_key()))
}

/// Parses a key file: exactly one PEM `PRIVATE KEY` block holding a PKCS#8 Ed25519 key,
/// with nothing after it.
pub fn parse_key_file(bytes: &[u8]) -> Option<SigningKey> {
    let text = std::str::from_utf8(bytes).ok()?;
    let trimmed = text.trim();
    let one_block = trimmed.matches("-----BEGIN").count() == 1
        && trimmed.starts_with("-----BEGIN PRIVATE KEY-----")
        && trimmed.ends_with("-----END PRIVATE KEY-----");
    if !one_block {
        return None;
    }
    SigningKey::from_pkcs8_pem(trimmed).ok()
}

/// One loaded key.
#[derive(Clone)]
pub struct GrantKey {
    /// Its version.
    pub version: u64,
    /// Its state.
    pub state: KeyState,
    activate_at: SystemTime,
    verify_until: SystemTime,
    signing: SigningKey,
}

impl GrantKey {
    fn usable_at(&self, now: SystemTime) -> bool {
        self.state != KeyState::Revoked && self.activate_at <= now && now < self.verify_until
    }
}

/// The signing parameters and keys of one manifest load.
#[derive(Clone)]
pub struct Keyring {
    /// `iss` of every grant.
    pub issuer: String,
    /// `aud` of every grant.
    pub audience: String,
    /// How long a minted grant lives.
    pub ttl: Duration,
    /// The longest lifetime a verified grant may claim (`grantTTL + clockSkew`).
    pub max_lifetime: Duration,
    active_key_id: String,
    keys: BTreeMap<String, GrantKey>,
}

/// Why the keyring could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// A key file is not one PKCS#8 Ed25519 PEM block.
    #[error("key file {0} is not exactly one PKCS#8 Ed25519 PRIVATE KEY block")]
    BadKeyFile(String),
    /// A key file's public key does not match its fingerprint.
    #[error("key file {0} does not match its publicKeySHA256")]
    FingerprintMismatch(String),
}

impl Keyring {
    /// Builds the keyring of a validated manifest, reading each key file with `read`.
    pub fn load<E: From<KeyringError>>(
        m: &SecurityManifest,
        mut read: impl FnMut(&str) -> Result<Vec<u8>, E>,
    ) -> Result<Self, E> {
        let mut keys = BTreeMap::new();
        for k in &m.keys {
            let signing = parse_key_file(&read(&k.file)?)
                .ok_or_else(|| KeyringError::BadKeyFile(k.file.clone()))?;
            if !fingerprint(&signing.verifying_key()).eq_ignore_ascii_case(&k.public_key_sha256) {
                return Err(KeyringError::FingerprintMismatch(k.file.clone()).into());
            }
            let key = GrantKey {
                version: k.version,
                state: k.state,
                activate_at: k.activate_at.to_system_time(),
                verify_until: k.verify_until.to_system_time(),
                signing,
            };
            keys.insert(k.id.clone(), key);
        }
        let ttl = parse_duration(&m.grant_ttl).unwrap_or(Duration::from_secs(60));
        let skew = parse_duration(&m.clock_skew).unwrap_or_default();
        Ok(Self {
            issuer: m.issuer.clone(),
            audience: m.audience.clone(),
            ttl,
            max_lifetime: ttl + skew,
            active_key_id: m.active_key_id.clone(),
            keys,
        })
    }

    /// The key that signs at `now` with its id and the end of its window, if the active key
    /// is in state `active` and its window contains `now`.
    pub fn signer(&self, now: SystemTime) -> Option<(&str, &SigningKey, SystemTime)> {
        let key = self.keys.get(&self.active_key_id)?;
        (key.state == KeyState::Active && key.usable_at(now)).then_some((
            self.active_key_id.as_str(),
            &key.signing,
            key.verify_until,
        ))
    }

    /// Whether `kid` names a revoked key.
    pub fn is_revoked(&self, kid: &str) -> bool {
        self.keys
            .get(kid)
            .is_some_and(|k| k.state == KeyState::Revoked)
    }

    /// The verifying key of `kid`, if it is usable at `now`.
    pub fn verifier(&self, kid: &str, now: SystemTime) -> Option<VerifyingKey> {
        self.keys
            .get(kid)
            .filter(|k| k.usable_at(now))
            .map(|k| k.signing.verifying_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse_and_junk_is_refused() {
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        for bad in ["", "5", "m", "-1s", "1x", "1.5s", "1m ", "s1"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_generated_key_file_parses_back_to_its_fingerprint() {
        let ids = crate::runtime::SeededIds::new(1);
        let (pem, print) = generate(&ids);
        let key = parse_key_file(pem.as_bytes()).unwrap();
        assert_eq!(fingerprint(&key.verifying_key()), print);
        let doubled = format!("{pem}{pem}");
        assert!(parse_key_file(doubled.as_bytes()).is_none());
        let trailing = format!("{pem}extra");
        assert!(parse_key_file(trailing.as_bytes()).is_none());
    }
}
