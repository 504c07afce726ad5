//! `ValidateRunClaim` (store §4.4): the read-only gate every data-plane call passes before
//! anything is dispatched. It reads the environment once; the [`ValidatedClaim`] it returns
//! carries that observation to the dispatch, whose admission write starts from it instead of
//! reading again (the write is a compare-and-swap on the observed `resourceVersion`, so a
//! stale observation can only lose and be re-read, never be written back).

use tracing::Instrument as _;

use super::cas;
use super::claims::in_token_range;
use super::policy::{SharedPolicyCheck, unchecked};
use super::predicates::{
    active, claim_current, creator_matches, healthy, published, ready, schema_current,
    template_retained,
};
use super::{Caller, ClaimContext, Store, StoreError};
use crate::child_span;
use crate::kube::crd::ExecutionEnvironment;
use crate::telemetry::traces::record_store_outcome;

/// A claim found current on one observation of its environment, by this store.
pub struct ValidatedClaim {
    pub(super) caller: Caller,
    pub(super) rc: ClaimContext,
    pub(super) observed: ExecutionEnvironment,
    pub(super) policy: SharedPolicyCheck,
}

impl ValidatedClaim {
    /// The environment as the validation observed it.
    pub fn environment(&self) -> &ExecutionEnvironment {
        &self.observed
    }

    /// The canonical client URI of the caller.
    pub fn caller_client(&self) -> &str {
        &self.caller.client
    }

    /// The claim that was validated.
    pub fn context(&self) -> &ClaimContext {
        &self.rc
    }
}

impl Store {
    /// [`Store::validate_run_claim_under`] without a security layer: the client policy is
    /// taken as current.
    pub async fn validate_run_claim(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
    ) -> Result<ValidatedClaim, StoreError> {
        self.validate_run_claim_under(caller, rc, unchecked()).await
    }

    /// The gate before any dispatch, in the order of §4.4: the presented tuple must be the
    /// current claim on a ready, healthy environment through a published binding, and the
    /// caller's client policy must still allow the environment's template. Never writes.
    /// Inside a traced call, it is the span `store.validate`.
    pub async fn validate_run_claim_under(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        policy: SharedPolicyCheck,
    ) -> Result<ValidatedClaim, StoreError> {
        let span = child_span!(
            "store.validate",
            environment = %rc.env.id,
            store.outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty
        );
        let result = self
            .check_run_claim(caller, rc, policy)
            .instrument(span.clone())
            .await;
        record_store_outcome(&span, &result);
        result
    }

    /// The checks of [`Store::validate_run_claim_under`].
    async fn check_run_claim(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        policy: SharedPolicyCheck,
    ) -> Result<ValidatedClaim, StoreError> {
        let env = &rc.env;
        if !in_token_range(rc.epoch) || !in_token_range(rc.grant_generation) {
            return Err(StoreError::InvalidArgument(
                "epoch or generation out of range",
            ));
        }
        let o = match cas::get(&self.api, &env.id).await {
            Ok(Some(o)) => o,
            _ => return Err(StoreError::not_found(&env.id, "environment unavailable")),
        };
        if !creator_matches(&o, caller) {
            return Err(StoreError::not_found(&env.id, "creator or owner differs"));
        }
        if !schema_current(&o) {
            return Err(StoreError::not_ready(&env.id, "incompatible schema"));
        }
        if !template_retained(&o, &self.templates) {
            return Err(StoreError::not_ready(&env.id, "template revoked"));
        }
        if !claim_current(&o, rc, self.now()) {
            return Err(StoreError::conflict(&env.id, "run claim is not current"));
        }
        if !published(&o, &rc.binding_id) || !active(&o) || !ready(&o) || !healthy(&o) {
            return Err(StoreError::not_ready(&env.id, "environment is not serving"));
        }
        if !policy.current(&o.spec.template_id) {
            return Err(StoreError::not_ready(
                &env.id,
                "client policy unavailable or revoked",
            ));
        }
        Ok(ValidatedClaim {
            caller: caller.clone(),
            rc: rc.clone(),
            observed: o,
            policy,
        })
    }
}
