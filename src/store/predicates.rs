//! Derived predicates over an environment, used by every operation.

use std::time::SystemTime;

use super::naming::client_hash;
use super::{Caller, ClaimContext, EnvRef};
use crate::kube::crd::{
    ActiveRun, ConditionStatus, Desired, ExecutionEnvironment, ExecutionEnvironmentStatus,
    FenceState, ReferenceState, SCHEMA_VERSION,
};
use crate::templates::TemplateRegistry;

/// The environment's status, or the empty status when none was written yet.
pub fn status(o: &ExecutionEnvironment) -> ExecutionEnvironmentStatus {
    o.status.clone().unwrap_or_default()
}

/// The exact reference of `o`.
pub fn env_ref(o: &ExecutionEnvironment) -> EnvRef {
    EnvRef {
        id: o.metadata.name.clone().unwrap_or_default(),
        revision: o.spec.revision.clone(),
    }
}

/// Spec and status are both at the current schema version.
pub fn schema_current(o: &ExecutionEnvironment) -> bool {
    o.spec.schema_version == SCHEMA_VERSION
        && o.status.as_ref().and_then(|s| s.schema_version) == Some(SCHEMA_VERSION)
}

/// The Ready condition is True.
pub fn ready(o: &ExecutionEnvironment) -> bool {
    o.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .is_some_and(|c| c.status == ConditionStatus::True)
    })
}

/// No operation of unknown outcome is outstanding.
pub fn healthy(o: &ExecutionEnvironment) -> bool {
    o.status.as_ref().and_then(|s| s.fence_state) == Some(FenceState::Healthy)
}

/// Desired state is Active.
pub fn active(o: &ExecutionEnvironment) -> bool {
    o.spec.desired == Desired::Active
}

/// The caller created this environment for this owner.
pub fn creator_matches(o: &ExecutionEnvironment, caller: &Caller) -> bool {
    o.spec.client_hash == client_hash(&caller.client) && o.spec.owner_hash == caller.owner_hash
}

/// The registry still holds the environment's exact, unrevoked template revision.
pub fn template_retained(o: &ExecutionEnvironment, templates: &TemplateRegistry) -> bool {
    templates
        .for_environment(
            &o.spec.template_id,
            &o.spec.template_revision,
            &o.spec.template_digest,
        )
        .is_ok()
}

/// The binding has a Published reference record.
pub fn published(o: &ExecutionEnvironment, binding_id: &str) -> bool {
    reference_state(o, binding_id) == Some(ReferenceState::Published)
}

/// The state of the binding's reference record, if any.
pub fn reference_state(o: &ExecutionEnvironment, binding_id: &str) -> Option<ReferenceState> {
    o.status
        .as_ref()?
        .references
        .iter()
        .find(|r| r.binding_id == binding_id)
        .map(|r| r.state)
}

/// The stored run claim if it is well-formed: ids present, generations positive, hashes
/// equal to the spec's, and the environment initialized. Its epoch is `status.epoch`.
pub fn valid_claim(o: &ExecutionEnvironment) -> Option<(ActiveRun, u64)> {
    let status = o.status.as_ref()?;
    let run = status.active_run.clone()?;
    let epoch = status.epoch.filter(|e| *e >= 1)?;
    let well_formed = run.grant_generation > 0
        && !run.binding_id.is_empty()
        && !run.run_id.is_empty()
        && !run.claim_id.is_empty()
        && run.owner_hash == o.spec.owner_hash
        && run.client_hash == o.spec.client_hash;
    well_formed.then_some((run, epoch))
}

/// The presented tuple is the current, unexpired claim under the current grant generation.
pub fn claim_current(o: &ExecutionEnvironment, rc: &ClaimContext, now: SystemTime) -> bool {
    let Some((run, epoch)) = valid_claim(o) else {
        return false;
    };
    let generation = o.status.as_ref().and_then(|s| s.grant_generation);
    now < run.expires_at.to_system_time()
        && env_ref(o) == rc.env
        && run.binding_id == rc.binding_id
        && run.run_id == rc.run_id
        && run.claim_id == rc.claim_id
        && epoch == rc.epoch
        && run.grant_generation == rc.grant_generation
        && generation == Some(rc.grant_generation)
}
