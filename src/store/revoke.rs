//! RevokeEnvironment (store §7.7, DECISIONS 10): bumps the grant generation by
//! compare-and-swap on an expected value, so every outstanding claim and grant stops being
//! current at once, and ends the current run claim so the owner can acquire a fresh one
//! immediately. Idempotent per operation id through a ledger of receipts whose fingerprint
//! binds the authenticated actor, the environment, the owner and the expected generation.

use super::admin::{AdminRequest, admin_subject};
use super::cas::{self, Decision};
use super::naming::fingerprint;
use super::{Store, StoreError};
use crate::kube::crd::RevocationReceipt;

/// How many revocation receipts are kept.
pub const MAX_REVOCATION_RECEIPTS: usize = 32;

impl Store {
    /// Revokes every claim under `expected` generation; answers the generation now in force.
    pub async fn revoke_environment(
        &self,
        q: &AdminRequest,
        expected: u64,
    ) -> Result<u64, StoreError> {
        if expected < 1
            || expected >= i64::MAX as u64
            || q.operation_id.is_empty()
            || q.operation_id.len() > 1024
        {
            return Err(StoreError::InvalidArgument("revocation arguments invalid"));
        }
        let fp = fingerprint(&[
            &q.env.id,
            &q.env.revision,
            &q.actor,
            &q.owner_hash,
            &expected.to_string(),
        ]);
        let env = &q.env.id;
        let (next, written) = cas::update_status_observed(&self.api, env, None, |o| {
            admin_subject(o, q)?;
            let status = o.status.get_or_insert_with(Default::default);
            if let Some(receipt) = status
                .revocation_receipts
                .iter()
                .find(|r| r.operation_id == q.operation_id)
            {
                if receipt.fingerprint != fp {
                    return Err(StoreError::conflict(env, "revocation operation id reused"));
                }
                return Ok(Decision::Keep(receipt.grant_generation));
            }
            if status.grant_generation != Some(expected) {
                return Err(StoreError::conflict(env, "grant generation changed"));
            }
            let next = expected + 1;
            status.revocation_receipts.push(RevocationReceipt {
                operation_id: q.operation_id.clone(),
                fingerprint: fp.clone(),
                expected_grant_generation: expected,
                grant_generation: next,
            });
            let excess = status
                .revocation_receipts
                .len()
                .saturating_sub(MAX_REVOCATION_RECEIPTS);
            status.revocation_receipts.drain(..excess);
            status.grant_generation = Some(next);
            status.active_run = None;
            Ok(Decision::Write(next))
        })
        .await?;
        // Every claim under the old generation has ended: so do its commands (§5.5).
        if let Err(error) = self.end_stale_claims_of(&written).await {
            tracing::warn!(env, %error, "revoked claims' commands not ended yet");
        }
        Ok(next)
    }
}
