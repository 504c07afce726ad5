//! Run claims: the exclusive, expiring right of one (binding, run) to dispatch work on the
//! environment. The fencing token is (claim id, epoch, grant generation).

use std::time::Duration;

use super::cas::{self, Decision};
use super::naming::{client_hash, fingerprint};
use super::predicates::{
    active, creator_matches, env_ref, healthy, published, ready, schema_current, template_retained,
    valid_claim,
};
use super::{Caller, ClaimContext, EnvRef, MAX_RUN_TTL, MIN_RUN_TTL, RunClaim, Store, StoreError};
use crate::kube::crd::{ActiveRun, ExecutionEnvironment, RenewReceipt, RfcTime};
use crate::metrics::lifecycle::OutcomeLabels;

/// How many renewal receipts are kept.
const MAX_RENEW_RECEIPTS: usize = 32;

/// Why an acquisition waits: commands of an earlier claim are not recorded as ended yet.
const EARLIER_COMMANDS_OPEN: &str = "commands of an earlier claim are still ending";

/// A request to take a claim.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The environment.
    pub env: EnvRef,
    /// The caller.
    pub caller: Caller,
    /// The binding.
    pub binding_id: String,
    /// The client's run id.
    pub run_id: String,
    /// The client's operation id (replays return the same claim).
    pub operation_id: String,
    /// How long the claim lasts.
    pub ttl: Duration,
}

fn check_ttl(ttl: Duration) -> Result<(), StoreError> {
    if ttl < MIN_RUN_TTL || ttl > MAX_RUN_TTL {
        return Err(StoreError::InvalidArgument("run TTL out of bounds"));
    }
    Ok(())
}

/// The gates every claim mutation passes first: same creator and revision, current schema,
/// template retained.
fn claim_gates(
    o: &ExecutionEnvironment,
    env: &EnvRef,
    caller: &Caller,
    store: &Store,
) -> Result<(), StoreError> {
    if !creator_matches(o, caller) || o.spec.revision != env.revision {
        return Err(StoreError::not_found(
            &env.id,
            "creator, owner or revision differs",
        ));
    }
    if !schema_current(o) {
        return Err(StoreError::not_ready(&env.id, "incompatible schema"));
    }
    if !template_retained(o, &store.templates) {
        return Err(StoreError::not_ready(&env.id, "template revoked"));
    }
    Ok(())
}

impl Store {
    /// Takes the environment's run claim, bumping the epoch.
    pub async fn acquire_run(&self, req: &AcquireRequest) -> Result<RunClaim, StoreError> {
        let started = self.runtime.clock.monotonic();
        let result = self.take_claim(req).await;
        let outcome = OutcomeLabels::of(result.as_ref().err().map(StoreError::code));
        self.metrics.claim(outcome, self.seconds_since(started));
        result
    }

    async fn take_claim(&self, req: &AcquireRequest) -> Result<RunClaim, StoreError> {
        match self.take_claim_once(req).await {
            Err(StoreError::NotReady { reason, .. }) if reason == EARLIER_COMMANDS_OPEN => {
                // The commands of an earlier claim must be ended and recorded first (C2).
                self.end_stale_claims(&req.env.id).await?;
                self.take_claim_once(req).await
            }
            answer => answer,
        }
    }

    async fn take_claim_once(&self, req: &AcquireRequest) -> Result<RunClaim, StoreError> {
        check_ttl(req.ttl)?;
        let env = &req.env;
        let now = self.now();
        let fresh_claim_id = self.runtime.ids.hex(16);
        cas::update_status(&self.api, &env.id, |o| {
            claim_gates(o, env, &req.caller, self)?;
            let status = o.status.clone().unwrap_or_default();
            if status.lifecycle_operation.is_some() {
                return Err(StoreError::not_ready(
                    &env.id,
                    "lifecycle operation in progress",
                ));
            }
            if !published(o, &req.binding_id) {
                return Err(StoreError::not_found(
                    &env.id,
                    "published reference not found",
                ));
            }
            if !active(o) || !ready(o) || !healthy(o) {
                return Err(StoreError::NotReady {
                    env: env.id.clone(),
                    reason: "environment is not ready",
                    retryable: true,
                });
            }
            if let Some((run, epoch)) = valid_claim(o) {
                if run.binding_id == req.binding_id
                    && run.run_id == req.run_id
                    && run.operation_id == req.operation_id
                {
                    if run.grant_generation != status.grant_generation.unwrap_or(0) {
                        return Err(StoreError::conflict(&env.id, "run claim was revoked"));
                    }
                    if now >= run.expires_at.to_system_time() {
                        // DECISIONS 9: an expired claim is never handed back.
                        return Err(StoreError::ClaimExpired {
                            env: env.id.clone(),
                        });
                    }
                    return Ok(Decision::Keep(claim_of(o, &run, epoch)));
                }
                if now < run.expires_at.to_system_time() {
                    return Err(StoreError::conflict(
                        &env.id,
                        "environment has an active run",
                    ));
                }
                if status.active_operation.is_some() {
                    return Err(StoreError::fence(
                        &env.id,
                        "expired run still has an active operation",
                    ));
                }
            } else if status.active_run.is_some() {
                // DECISIONS 8: a malformed stored claim fails closed.
                return Err(StoreError::conflict(
                    &env.id,
                    "stored run claim is malformed",
                ));
            }
            if status.active_operation.is_some() {
                return Err(StoreError::conflict(&env.id, "an operation is in flight"));
            }
            if !super::command_leases::none_open(o) {
                return Err(StoreError::NotReady {
                    env: env.id.clone(),
                    reason: EARLIER_COMMANDS_OPEN,
                    retryable: true,
                });
            }
            let epoch = status.epoch.unwrap_or(0);
            let generation = status.grant_generation.unwrap_or(0);
            if epoch < 1 || epoch >= i64::MAX as u64 || generation < 1 {
                return Err(StoreError::conflict(
                    &env.id,
                    "epoch or generation is malformed",
                ));
            }
            let run = ActiveRun {
                binding_id: req.binding_id.clone(),
                run_id: req.run_id.clone(),
                claim_id: fresh_claim_id.clone(),
                operation_id: req.operation_id.clone(),
                owner_hash: req.caller.owner_hash.clone(),
                client_hash: client_hash(&req.caller.client),
                epoch: epoch + 1,
                grant_generation: generation,
                expires_at: RfcTime::from_system_time(now + req.ttl),
            };
            let status = o.status.get_or_insert_with(Default::default);
            status.epoch = Some(epoch + 1);
            status.active_run = Some(run.clone());
            Ok(Decision::Write(claim_of(o, &run, epoch + 1)))
        })
        .await
    }

    /// Extends (or shortens) the caller's current claim; replays by operation id return the
    /// recorded expiry without extending again.
    pub async fn renew_run(
        &self,
        caller: &Caller,
        rc: &ClaimContext,
        operation_id: &str,
        ttl: Duration,
    ) -> Result<RunClaim, StoreError> {
        check_ttl(ttl)?;
        let env = &rc.env;
        let now = self.now();
        let fp = fingerprint(&[
            &env.id,
            &env.revision,
            &caller.client,
            &caller.owner_hash,
            &rc.binding_id,
            &rc.run_id,
            &rc.claim_id,
            &rc.epoch.to_string(),
            &rc.grant_generation.to_string(),
            &ttl.as_millis().to_string(),
        ]);
        let mut forward = None;
        let renewed = cas::update_status(&self.api, &env.id, |o| {
            claim_gates(o, env, caller, self)?;
            forward = super::commands::renewal_target(self, o, rc);
            let (run, epoch) = valid_claim(o)
                .filter(|(run, epoch)| claim_matches(o, run, *epoch, rc))
                .ok_or_else(|| StoreError::conflict(&env.id, "run claim mismatch"))?;
            let status = o.status.get_or_insert_with(Default::default);
            if let Some(receipt) = status
                .renew_receipts
                .iter()
                .find(|r| r.operation_id == operation_id)
            {
                if receipt.fingerprint != fp {
                    return Err(StoreError::conflict(&env.id, "renewal operation conflicts"));
                }
                if receipt.expires_at.to_system_time() <= now {
                    return Err(StoreError::conflict(&env.id, "renewal receipt expired"));
                }
                let mut replay = run.clone();
                replay.expires_at = receipt.expires_at;
                return Ok(Decision::Keep(claim_of(o, &replay, epoch)));
            }
            if now >= run.expires_at.to_system_time() {
                return Err(StoreError::conflict(&env.id, "run claim expired"));
            }
            let expires_at = RfcTime::from_system_time(now + ttl);
            let mut renewed = run;
            renewed.expires_at = expires_at;
            status.active_run = Some(renewed.clone());
            status.renew_receipts.push(RenewReceipt {
                operation_id: operation_id.to_owned(),
                fingerprint: fp.clone(),
                expires_at,
            });
            let excess = status
                .renew_receipts
                .len()
                .saturating_sub(MAX_RENEW_RECEIPTS);
            status.renew_receipts.drain(..excess);
            Ok(Decision::Write(claim_of(o, &renewed, epoch)))
        })
        .await?;
        if let Some(target) = forward {
            self.forward_renewal(target, &renewed).await;
        }
        Ok(renewed)
    }

    /// Gives the claim back. Releasing when no valid claim exists succeeds.
    pub async fn release_run(&self, caller: &Caller, rc: &ClaimContext) -> Result<(), StoreError> {
        let env = &rc.env;
        let (ended, written) = cas::update_status_observed(&self.api, &env.id, None, |o| {
            if !creator_matches(o, caller) || o.spec.revision != env.revision {
                return Err(StoreError::not_found(
                    &env.id,
                    "creator, owner or revision differs",
                ));
            }
            if !schema_current(o) {
                return Err(StoreError::not_ready(&env.id, "incompatible schema"));
            }
            let Some((run, epoch)) = valid_claim(o) else {
                return Ok(Decision::Keep(false));
            };
            let status = o.status.get_or_insert_with(Default::default);
            if status.lifecycle_operation.is_some() {
                return Err(StoreError::not_ready(
                    &env.id,
                    "lifecycle operation in progress",
                ));
            }
            let generation = status.grant_generation;
            if !(claim_matches_parts(&run, epoch, generation, rc)) {
                return Err(StoreError::conflict(&env.id, "run claim mismatch"));
            }
            if status.active_operation.is_some() {
                return Err(StoreError::fence(&env.id, "run has an active operation"));
            }
            status.active_run = None;
            let owns_commands = status
                .commands
                .iter()
                .any(|l| l.is_open() && l.claim_id == rc.claim_id);
            Ok(Decision::Write(owns_commands))
        })
        .await?;
        // The claim has ended: so do its commands (docs/commands.md §5.5). Should the
        // supervisor be unreachable, its own deadline kills them and the next claim's
        // acquisition records their ends. A claim without commands costs nothing more.
        if ended && let Err(error) = self.end_claim_commands_of(&written, &rc.claim_id).await {
            tracing::warn!(env = %env.id, %error, "claim's commands not ended yet");
        }
        Ok(())
    }
}

/// Epochs and generations on the wire are 1..2^63-1.
pub fn in_token_range(value: u64) -> bool {
    (1..=i64::MAX as u64).contains(&value)
}

fn claim_matches(o: &ExecutionEnvironment, run: &ActiveRun, epoch: u64, rc: &ClaimContext) -> bool {
    env_ref(o) == rc.env
        && claim_matches_parts(
            run,
            epoch,
            o.status.as_ref().and_then(|s| s.grant_generation),
            rc,
        )
}

fn claim_matches_parts(
    run: &ActiveRun,
    epoch: u64,
    status_generation: Option<u64>,
    rc: &ClaimContext,
) -> bool {
    run.binding_id == rc.binding_id
        && run.run_id == rc.run_id
        && run.claim_id == rc.claim_id
        && epoch == rc.epoch
        && run.grant_generation == rc.grant_generation
        && status_generation == Some(rc.grant_generation)
}

fn claim_of(o: &ExecutionEnvironment, run: &ActiveRun, epoch: u64) -> RunClaim {
    RunClaim {
        env: env_ref(o),
        binding_id: run.binding_id.clone(),
        run_id: run.run_id.clone(),
        claim_id: run.claim_id.clone(),
        epoch,
        grant_generation: run.grant_generation,
        expires_at: run.expires_at.to_system_time(),
    }
}
