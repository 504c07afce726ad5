//! Signed grants (DECISIONS 4; api-security §5): the compact `header.payload.signature`
//! token, base64url without padding, Ed25519 over the first two parts, minted on
//! `AcquireRun`/`RenewRun` and required, beside the durable run claim, on every data-plane
//! call.
//!
//! Decoding is strict: exactly three parts, canonical base64url, JSON with no unknown or
//! duplicate keys and nothing after the value. Verification follows §5.3 in order and stops
//! at the first failure; no clock-skew leeway is applied to `not_before`/`expires_at`.

use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer};
use serde::{Deserialize, Serialize};

use super::keys::Keyring;
use crate::errors::{ErrorCode, WireError};
use crate::kube::crd::RfcTime;

/// The largest grant accepted in a RequestContext.
pub const MAX_GRANT_BYTES: usize = 16 * 1024;
const ALG: &str = "Ed25519";
const TYP: &str = "MECATL-GRANT";
const MAX_OPERATIONS: usize = 32;

/// The data-plane operations every minted grant carries.
pub const DATA_PLANE_OPERATIONS: [&str; 14] = [
    "file.read",
    "file.resolve_authority",
    "file.stat",
    "file.create",
    "file.replace",
    "file.list",
    "file.remove",
    "file.rename",
    "file.copy",
    "file.glob",
    "file.grep",
    "command.start",
    "command.status",
    "command.cancel",
];

/// The closed operation vocabulary a grant may name.
const VOCABULARY: [&str; 13] = [
    "attach",
    "run.acquire",
    "run.renew",
    "run.release",
    "reference.commit",
    "reference.abort",
    "reference.reserve",
    "reference.delete.prepare",
    "reference.delete.confirm",
    "reference.delete.cancel",
    "reference.release",
    "retire",
    "command.stream",
];

/// Why a grant was refused or could not be minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// Not three strict base64url parts of strict JSON with the expected header.
    #[error("grant is malformed")]
    Malformed,
    /// Signed by a revoked key.
    #[error("grant key is revoked")]
    RevokedKey,
    /// Signed by a key that is unknown or outside its window.
    #[error("grant key is unknown")]
    UnknownKey,
    /// The signature does not verify.
    #[error("grant signature is invalid")]
    BadSignature,
    /// A claim is missing, empty or zero, or the operations are invalid.
    #[error("grant claims are incomplete")]
    Incomplete,
    /// Issued by or for someone else.
    #[error("grant issuer or audience is wrong")]
    WrongIssuer,
    /// `now < not_before`.
    #[error("grant is not yet valid")]
    NotYetValid,
    /// `now >= expires_at`.
    #[error("grant has expired")]
    Expired,
    /// Claims a lifetime above the configured ceiling.
    #[error("grant lifetime is too long")]
    TooLong,
    /// Binds another client, owner, binding, run, claim, environment, epoch or generation.
    #[error("grant does not match the request")]
    Mismatch,
    /// Does not name the requested operation.
    #[error("grant does not allow the operation")]
    OperationNotGranted,
    /// No key may sign now.
    #[error("no grant signing key is active")]
    NoSigningKey,
}

impl GrantError {
    /// The wire refusal: an expired grant is UNAUTHENTICATED and retryable (renew and
    /// retry), a missing signing key is INTERNAL, everything else PERMISSION_DENIED.
    pub fn wire(self) -> WireError {
        match self {
            Self::Expired => WireError::retryable(ErrorCode::Unauthenticated),
            Self::NoSigningKey => WireError::retryable(ErrorCode::NotReady),
            _ => WireError::fatal(ErrorCode::PermissionDenied),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    alg: String,
    kid: String,
    typ: String,
}

/// The environment a grant binds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantEnvironment {
    /// The environment id.
    pub id: String,
    /// Its revision.
    pub revision: String,
}

/// What a grant binds: every field must equal the request's exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantBinding {
    /// The caller's canonical URI.
    pub client: String,
    /// The owner hash.
    pub owner: String,
    /// The binding id.
    pub binding_id: String,
    /// The run id.
    pub run_id: String,
    /// The claim id.
    pub claim_id: String,
    /// The environment.
    pub environment: GrantEnvironment,
    /// The claim epoch.
    pub epoch: u64,
    /// The grant generation.
    pub grant_generation: u64,
}

/// The payload of a grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantClaims {
    /// The issuer.
    pub iss: String,
    /// The audience.
    pub aud: String,
    /// The caller's canonical URI.
    pub client: String,
    /// The owner hash.
    pub owner: String,
    /// The binding id.
    pub binding_id: String,
    /// The run id.
    pub run_id: String,
    /// The claim id.
    pub claim_id: String,
    /// The environment.
    pub environment: GrantEnvironment,
    /// The claim epoch.
    pub epoch: u64,
    /// The grant generation.
    pub grant_generation: u64,
    /// The operations allowed.
    pub operations: Vec<String>,
    /// Valid from.
    pub not_before: RfcTime,
    /// Valid until (exclusive).
    pub expires_at: RfcTime,
    /// 16 random bytes, hex.
    pub nonce: String,
}

impl GrantClaims {
    /// The binding these claims carry.
    pub fn binding(&self) -> GrantBinding {
        GrantBinding {
            client: self.client.clone(),
            owner: self.owner.clone(),
            binding_id: self.binding_id.clone(),
            run_id: self.run_id.clone(),
            claim_id: self.claim_id.clone(),
            environment: self.environment.clone(),
            epoch: self.epoch,
            grant_generation: self.grant_generation,
        }
    }
}

/// Mints a grant for `binding` at `now` with the keyring's active key; returns the token and
/// its expiry (`min(now + ttl, key.verifyUntil)`).
pub fn sign(
    keyring: &Keyring,
    binding: GrantBinding,
    nonce: String,
    now: SystemTime,
) -> Result<(String, SystemTime), GrantError> {
    let (kid, key, key_until) = keyring.signer(now).ok_or(GrantError::NoSigningKey)?;
    let expiry = (now + keyring.ttl).min(key_until);
    if now >= expiry {
        return Err(GrantError::NoSigningKey);
    }
    let header = Header {
        alg: ALG.to_owned(),
        kid: kid.to_owned(),
        typ: TYP.to_owned(),
    };
    let claims = GrantClaims {
        iss: keyring.issuer.clone(),
        aud: keyring.audience.clone(),
        client: binding.client,
        owner: binding.owner,
        binding_id: binding.binding_id,
        run_id: binding.run_id,
        claim_id: binding.claim_id,
        environment: binding.environment,
        epoch: binding.epoch,
        grant_generation: binding.grant_generation,
        operations: DATA_PLANE_OPERATIONS.map(str::to_owned).to_vec(),
        not_before: RfcTime::from_system_time(now),
        expires_at: RfcTime::from_system_time(expiry),
        nonce,
    };
    let signed = format!("{}.{}", b64_json(&header), b64_json(&claims));
    let signature = key.sign(signed.as_bytes());
    let token = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()));
    Ok((token, expiry))
}

fn b64_json<T: Serialize>(value: &T) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).expect("grant parts serialize"))
}

fn decode_part(part: &str) -> Result<Vec<u8>, GrantError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| GrantError::Malformed)
}

/// Decodes a grant strictly without verifying it: the header's key id and the claims.
pub fn decode(token: &str) -> Result<(String, GrantClaims), GrantError> {
    let (header, payload, _) = split(token)?;
    let header = parse_header(header)?;
    let claims =
        serde_json::from_slice(&decode_part(payload)?).map_err(|_| GrantError::Malformed)?;
    Ok((header.kid, claims))
}

fn split(token: &str) -> Result<(&str, &str, &str), GrantError> {
    if token.len() > MAX_GRANT_BYTES {
        return Err(GrantError::Malformed);
    }
    let mut parts = token.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) => Ok((h, p, s)),
        _ => Err(GrantError::Malformed),
    }
}

fn parse_header(part: &str) -> Result<Header, GrantError> {
    let header: Header =
        serde_json::from_slice(&decode_part(part)?).map_err(|_| GrantError::Malformed)?;
    if header.alg != ALG || header.typ != TYP || header.kid.is_empty() {
        return Err(GrantError::Malformed);
    }
    Ok(header)
}

/// Verifies `token` for `operation` on `expected` at `now`, in the order of §5.3.
pub fn verify(
    keyring: &Keyring,
    token: &str,
    expected: &GrantBinding,
    operation: &str,
    now: SystemTime,
) -> Result<GrantClaims, GrantError> {
    let (header_part, payload_part, signature_part) = split(token)?;
    let header = parse_header(header_part)?;
    if keyring.is_revoked(&header.kid) {
        return Err(GrantError::RevokedKey);
    }
    let key = keyring
        .verifier(&header.kid, now)
        .ok_or(GrantError::UnknownKey)?;
    let signature_bytes: [u8; 64] = decode_part(signature_part)?
        .try_into()
        .map_err(|_| GrantError::BadSignature)?;
    let signed = &token[..header_part.len() + 1 + payload_part.len()];
    key.verify_strict(signed.as_bytes(), &Signature::from_bytes(&signature_bytes))
        .map_err(|_| GrantError::BadSignature)?;
    let claims: GrantClaims =
        serde_json::from_slice(&decode_part(payload_part)?).map_err(|_| GrantError::Malformed)?;
    check_claims(keyring, &claims, now)?;
    if claims.binding() != *expected {
        return Err(GrantError::Mismatch);
    }
    if !claims.operations.iter().any(|op| op == operation) {
        return Err(GrantError::OperationNotGranted);
    }
    Ok(claims)
}

fn check_claims(keyring: &Keyring, c: &GrantClaims, now: SystemTime) -> Result<(), GrantError> {
    let b = c;
    let complete = [
        &c.iss,
        &c.aud,
        &b.client,
        &b.owner,
        &b.binding_id,
        &b.run_id,
        &b.claim_id,
        &b.environment.id,
        &b.environment.revision,
        &c.nonce,
    ]
    .iter()
    .all(|s| !s.is_empty())
        && b.epoch != 0
        && b.grant_generation != 0
        && c.expires_at > c.not_before
        && operations_valid(&c.operations);
    if !complete {
        return Err(GrantError::Incomplete);
    }
    if c.iss != keyring.issuer || c.aud != keyring.audience {
        return Err(GrantError::WrongIssuer);
    }
    let (not_before, expires_at) = (c.not_before.to_system_time(), c.expires_at.to_system_time());
    if now < not_before {
        return Err(GrantError::NotYetValid);
    }
    if now >= expires_at {
        return Err(GrantError::Expired);
    }
    let lifetime = expires_at.duration_since(not_before).unwrap_or_default();
    if lifetime > keyring.max_lifetime {
        return Err(GrantError::TooLong);
    }
    Ok(())
}

fn operations_valid(ops: &[String]) -> bool {
    let known = |op: &str| DATA_PLANE_OPERATIONS.contains(&op) || VOCABULARY.contains(&op);
    let unique = ops.iter().collect::<std::collections::BTreeSet<_>>().len() == ops.len();
    (1..=MAX_OPERATIONS).contains(&ops.len()) && unique && ops.iter().all(|op| known(op))
}

#[cfg(test)]
#[path = "grant_tests.rs"]
mod tests;
