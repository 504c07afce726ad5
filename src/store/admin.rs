//! The administrator's request and subject rules (store §7.1): which environments an actor
//! may administer (its own, or those of the creators it is `administratorFor`), and the exact
//! runtime identity (epoch, Pod UID, PVC UID) an epoch-based admin operation must name.
//! A subject mismatch is indistinguishable from an absent environment (`not_found`); every
//! compare-and-swap attempt re-runs these checks.

use super::naming::client_hash;
use super::predicates::{schema_current, valid_claim};
use super::{EnvRef, StoreError};
use crate::kube::crd::{ConditionStatus, ExecutionEnvironment};

/// An administrator's request on one exact environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRequest {
    /// The environment.
    pub env: EnvRef,
    /// The owner hash the environment must carry.
    pub owner_hash: String,
    /// The authenticated actor's canonical URI.
    pub actor: String,
    /// The creators this actor administers (empty: only itself).
    pub administrator_for: Vec<String>,
    /// The execution epoch the actor observed.
    pub expected_epoch: u64,
    /// The executor Pod UID the actor observed.
    pub expected_pod_uid: String,
    /// The workspace PVC UID the actor observed.
    pub expected_pvc_uid: String,
    /// The admin operation id (replays are idempotent).
    pub operation_id: String,
}

/// The actor may administer `o`: creator in scope, same owner, same revision; and the schema
/// is current.
pub fn admin_subject(o: &ExecutionEnvironment, q: &AdminRequest) -> Result<(), StoreError> {
    let creator = &o.spec.client_hash;
    let in_scope = *creator == client_hash(&q.actor)
        || q.administrator_for
            .iter()
            .any(|u| *creator == client_hash(u));
    if !in_scope || o.spec.owner_hash != q.owner_hash || o.spec.revision != q.env.revision {
        return Err(StoreError::not_found(&q.env.id, "environment not found"));
    }
    if !schema_current(o) {
        return Err(StoreError::not_ready(&q.env.id, "incompatible schema"));
    }
    Ok(())
}

/// [`admin_subject`] plus the exact runtime identity: epoch, Pod UID and PVC UID.
pub fn exact_admin_subject(o: &ExecutionEnvironment, q: &AdminRequest) -> Result<(), StoreError> {
    admin_subject(o, q)?;
    let status = o.status.as_ref();
    let epoch = status.and_then(|s| s.epoch);
    let pod = status.and_then(|s| s.pod.as_ref()).map(|p| p.uid.as_str());
    let pvc = status.and_then(|s| s.pvc.as_ref()).map(|p| p.uid.as_str());
    if epoch != Some(q.expected_epoch)
        || pod != Some(q.expected_pod_uid.as_str())
        || pvc != Some(q.expected_pvc_uid.as_str())
    {
        return Err(StoreError::conflict(
            &q.env.id,
            "execution identity changed",
        ));
    }
    Ok(())
}

/// The condition `type_` is True.
pub fn condition_true(o: &ExecutionEnvironment, type_: &str) -> bool {
    o.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
    })
}

/// The stored claim is well-formed, expired, and belongs to the expected epoch and the current
/// grant generation: an exact lifecycle admission may remove it.
pub fn expired_exact_claim(
    o: &ExecutionEnvironment,
    q: &AdminRequest,
    now: std::time::SystemTime,
) -> bool {
    let Some((run, epoch)) = valid_claim(o) else {
        return false;
    };
    let generation = o.status.as_ref().and_then(|s| s.grant_generation);
    now >= run.expires_at.to_system_time()
        && run.epoch == epoch
        && epoch == q.expected_epoch
        && Some(run.grant_generation) == generation
}

/// The recorded termination proof names exactly the expected Pod, PVC and epoch.
pub fn proof_matches(o: &ExecutionEnvironment, q: &AdminRequest) -> bool {
    o.status
        .as_ref()
        .and_then(|s| s.termination_proof.as_ref())
        .is_some_and(|p| {
            p.pod_uid == q.expected_pod_uid
                && p.pvc_uid == q.expected_pvc_uid
                && p.epoch == q.expected_epoch
        })
}

/// [`proof_matches`] and the proof was written by this very operation.
pub fn proof_op_matches(o: &ExecutionEnvironment, q: &AdminRequest) -> bool {
    proof_matches(o, q)
        && o.status
            .as_ref()
            .and_then(|s| s.termination_proof.as_ref())
            .is_some_and(|p| p.operation_id == q.operation_id)
}

/// The completed replacement receipt is this operation's, on the expected identities.
pub fn replacement_receipt(o: &ExecutionEnvironment, q: &AdminRequest) -> bool {
    o.status
        .as_ref()
        .and_then(|s| s.last_replacement.as_ref())
        .is_some_and(|r| {
            r.operation_id == q.operation_id
                && r.previous_pod_uid == q.expected_pod_uid
                && r.pvc_uid == q.expected_pvc_uid
                && r.previous_epoch == q.expected_epoch
        })
}

/// No live claim, no operation in flight, no command lease open (C4), and healthy.
pub fn idle(o: &ExecutionEnvironment, q: &AdminRequest, now: std::time::SystemTime) -> bool {
    let status = o.status.as_ref();
    let no_live_claim = status
        .and_then(|s| s.active_run.as_ref())
        .is_none_or(|r| r.claim_id.is_empty() || expired_exact_claim(o, q, now));
    no_live_claim
        && status.is_some_and(|s| s.active_operation.is_none())
        && super::command_leases::none_open(o)
        && super::predicates::healthy(o)
}
