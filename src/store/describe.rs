//! `DescribeEnvironment`: a read-only view of one environment for its creator and for the
//! administrators in scope (the recovery issue's operator tooling). It reads the resource once
//! and writes nothing. The subject rules are those of every other operation: a caller outside
//! the creator's scope, another owner or another incarnation sees exactly what an absent
//! environment looks like (`not_found`). The view carries no grant and no claim id.

use std::time::SystemTime;

use super::naming::{allocation_name, client_hash};
use super::predicates::{env_ref, ready};
use super::{EnvRef, Store, StoreError, cas};
use crate::kube::crd::{
    ActiveOperation, ConditionStatus, EnvironmentCondition, ExecutionEnvironment, FenceState,
    LifecycleOperation, LifecycleType, ObjectIdentity, condition,
};

/// Which environment a description is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescribeTarget {
    /// An exact name; `revision` empty means whichever incarnation exists now.
    Environment {
        /// The resource name.
        id: String,
        /// `spec.revision`, or empty.
        revision: String,
    },
    /// A binding of the calling client.
    Binding(String),
}

/// A request for a description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeRequest {
    /// What to describe.
    pub target: DescribeTarget,
    /// The owner hash the environment must carry.
    pub owner_hash: String,
    /// The authenticated caller's canonical URI.
    pub actor: String,
    /// The creators whose environments the caller administers (only when it is an
    /// administrator; empty otherwise).
    pub administrator_for: Vec<String>,
}

/// One word for where an environment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for its workspace or executor.
    Provisioning,
    /// Serving.
    Ready,
    /// An operation of unknown outcome is outstanding.
    Fenced,
    /// An admitted `ReplaceExecutor` is under way.
    Replacing,
    /// An admitted `RetireEnvironment` is under way.
    Retiring,
    /// Retired: no executor, the workspace kept.
    Retired,
    /// An admitted `DeleteRetiredEnvironment` is under way, or the resource is being deleted.
    Deleting,
    /// The resource was deleted outside the exact lifecycle and is held.
    Blocked,
}

impl Phase {
    /// Every phase, in a fixed order.
    pub const ALL: [Phase; 8] = [
        Phase::Provisioning,
        Phase::Ready,
        Phase::Fenced,
        Phase::Replacing,
        Phase::Retiring,
        Phase::Retired,
        Phase::Deleting,
        Phase::Blocked,
    ];

    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "Provisioning",
            Self::Ready => "Ready",
            Self::Fenced => "Fenced",
            Self::Replacing => "Replacing",
            Self::Retiring => "Retiring",
            Self::Retired => "Retired",
            Self::Deleting => "Deleting",
            Self::Blocked => "Blocked",
        }
    }
}

/// The run claim as a description shows it (no claim id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSummary {
    /// The binding that holds it.
    pub binding_id: String,
    /// The holder's run id.
    pub run_id: String,
    /// Its epoch.
    pub epoch: u64,
    /// Its grant generation.
    pub grant_generation: u64,
    /// When it expires.
    pub expires_at: SystemTime,
    /// Whether it had expired when the description was taken.
    pub expired: bool,
}

/// What one environment looks like now.
#[derive(Debug, Clone, PartialEq)]
pub struct Description {
    /// The exact incarnation.
    pub env: EnvRef,
    /// The binding it was created for.
    pub binding_id: String,
    /// Its template.
    pub template_id: String,
    /// Its template revision.
    pub template_revision: String,
    /// Where it stands.
    pub phase: Phase,
    /// The Ready condition is True.
    pub ready: bool,
    /// The fence state, when written.
    pub fence_state: Option<FenceState>,
    /// Reason and message of a Ready condition that is not True.
    pub not_ready: Option<(String, String)>,
    /// Execution epoch.
    pub epoch: u64,
    /// Grant generation.
    pub grant_generation: u64,
    /// The recorded executor Pod.
    pub pod: Option<ObjectIdentity>,
    /// The recorded workspace PVC.
    pub pvc: Option<ObjectIdentity>,
    /// Operations in flight.
    pub operations: Vec<ActiveOperation>,
    /// The run claim, if one is stored.
    pub claim: Option<ClaimSummary>,
    /// The admitted lifecycle operation.
    pub lifecycle: Option<LifecycleOperation>,
    /// Every condition.
    pub conditions: Vec<EnvironmentCondition>,
    /// The status's schema version (0 before the first status write).
    pub schema_version: i64,
    /// The resource carries a deletion timestamp.
    pub deleting: bool,
}

impl Store {
    /// DescribeEnvironment: one read, no write.
    pub async fn describe(&self, q: &DescribeRequest) -> Result<Description, StoreError> {
        let name = match &q.target {
            DescribeTarget::Environment { id, .. } => id.clone(),
            DescribeTarget::Binding(binding) => allocation_name(&q.actor, &q.owner_hash, binding),
        };
        let absent = || StoreError::not_found(&name, "environment not found");
        let o = cas::get(&self.api, &name).await?.ok_or_else(absent)?;
        if !may_describe(&o, q) {
            return Err(absent());
        }
        Ok(describe(&o, self.now()))
    }
}

/// The subject rule: the caller created it (or administers its creator), for this owner, and
/// the named incarnation (if any) is the one that exists.
pub fn may_describe(o: &ExecutionEnvironment, q: &DescribeRequest) -> bool {
    let creator = &o.spec.client_hash;
    let in_scope = *creator == client_hash(&q.actor)
        || q.administrator_for
            .iter()
            .any(|u| *creator == client_hash(u));
    let revision_ok = match &q.target {
        DescribeTarget::Environment { revision, .. } => {
            revision.is_empty() || *revision == o.spec.revision
        }
        DescribeTarget::Binding(binding) => *binding == o.spec.binding_id,
    };
    in_scope && o.spec.owner_hash == q.owner_hash && revision_ok
}

/// The description of `o` at `now`.
pub fn describe(o: &ExecutionEnvironment, now: SystemTime) -> Description {
    let status = o.status.clone().unwrap_or_default();
    let ready_condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY);
    let not_ready = ready_condition
        .filter(|c| c.status != ConditionStatus::True)
        .map(|c| (c.reason.clone(), c.message.clone()));
    let claim = status
        .active_run
        .as_ref()
        .filter(|r| !r.claim_id.is_empty())
        .map(|r| {
            let expires_at = r.expires_at.to_system_time();
            ClaimSummary {
                binding_id: r.binding_id.clone(),
                run_id: r.run_id.clone(),
                epoch: r.epoch,
                grant_generation: r.grant_generation,
                expires_at,
                expired: now >= expires_at,
            }
        });
    Description {
        env: env_ref(o),
        binding_id: o.spec.binding_id.clone(),
        template_id: o.spec.template_id.clone(),
        template_revision: o.spec.template_revision.clone(),
        phase: phase(o),
        ready: ready(o),
        fence_state: status.fence_state,
        not_ready,
        epoch: status.epoch.unwrap_or(0),
        grant_generation: status.grant_generation.unwrap_or(0),
        pod: status.pod.clone(),
        pvc: status.pvc.clone(),
        operations: status.active_operation.clone().into_iter().collect(),
        claim,
        lifecycle: status.lifecycle_operation.clone(),
        conditions: status.conditions.clone(),
        schema_version: status.schema_version.unwrap_or(0),
        deleting: o.metadata.deletion_timestamp.is_some(),
    }
}

/// Where `o` stands, most specific first: a held deletion, an admitted lifecycle operation,
/// retirement, a fence, readiness.
pub fn phase(o: &ExecutionEnvironment) -> Phase {
    let status = o.status.as_ref();
    let condition_true = |type_: &str| {
        status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
        })
    };
    if condition_true(condition::DELETION_BLOCKED) {
        return Phase::Blocked;
    }
    if let Some(op) = status.and_then(|s| s.lifecycle_operation.as_ref()) {
        return match op.type_ {
            LifecycleType::ReplaceExecutor => Phase::Replacing,
            LifecycleType::RetireEnvironment => Phase::Retiring,
            LifecycleType::DeleteRetiredEnvironment => Phase::Deleting,
        };
    }
    if o.metadata.deletion_timestamp.is_some() {
        return Phase::Deleting;
    }
    if condition_true(condition::RETIRED) {
        return Phase::Retired;
    }
    if status.and_then(|s| s.fence_state) == Some(FenceState::FenceUnknown) {
        return Phase::Fenced;
    }
    if ready(o) {
        Phase::Ready
    } else {
        Phase::Provisioning
    }
}
