//! Status writes of the reconciler (k8s-executor §2.6): read the live resource, apply a
//! mutation, skip the write when nothing changed, write by compare-and-swap. Lifecycle and
//! runtime writers are guarded by the *runtime observation*: the live object must still have
//! the lifecycle operation, epoch and Pod and PVC UIDs the decision was based on, otherwise
//! nothing is written and the reconcile ends with a conflict.

use crate::telemetry::events::EnvironmentEvent;
use kube::api::Api;

use super::Context;
use super::conditions::set_condition;
use super::error::ReconcileError;
use crate::kube::crd::{
    ActiveOperation, ConditionStatus, ExecutionEnvironment, ExecutionEnvironmentStatus, FenceState,
    LifecycleOperation, RfcTime, condition,
};
use crate::metrics::FenceReason;
use crate::store::cas::{self, Decision};

/// The parts of the status every lifecycle and runtime decision depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    lifecycle: Option<LifecycleOperation>,
    epoch: Option<u64>,
    pod_uid: Option<String>,
    pvc_uid: Option<String>,
}

impl Observation {
    /// What `status` shows.
    pub fn of(status: Option<&ExecutionEnvironmentStatus>) -> Self {
        Self {
            lifecycle: status.and_then(|s| s.lifecycle_operation.clone()),
            epoch: status.and_then(|s| s.epoch),
            pod_uid: status.and_then(|s| s.pod.as_ref()).map(|p| p.uid.clone()),
            pvc_uid: status.and_then(|s| s.pvc.as_ref()).map(|p| p.uid.clone()),
        }
    }
}

/// What a status mutation sees: the status, the resource generation and the time.
pub struct Write<'a> {
    /// The status to change.
    pub status: &'a mut ExecutionEnvironmentStatus,
    /// `metadata.generation`.
    pub generation: i64,
    /// Now, for condition times and proofs.
    pub now: RfcTime,
}

impl Write<'_> {
    /// Sets a condition with this write's generation and time.
    pub fn condition(&mut self, type_: &str, value: bool, reason: &str, message: &str) {
        let value = if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        set_condition(
            self.status,
            type_,
            value,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    /// Sets the Ready condition.
    pub fn ready(&mut self, value: bool, reason: &str, message: &str) {
        self.condition(condition::READY, value, reason, message);
    }
}

fn name_of(env: &ExecutionEnvironment) -> String {
    env.metadata.name.clone().unwrap_or_default()
}

/// Applies `mutate` to the live status unless the runtime observation changed since
/// `observed` was read; writes only when something changed.
pub async fn guarded(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    observed: &ExecutionEnvironment,
    mutate: impl FnMut(&mut Write<'_>),
) -> Result<(), ReconcileError> {
    guarded_while(envs, ctx, observed, |_| true, mutate).await
}

/// [`guarded`] that also requires `still(live)` of the live object before it writes.
pub(super) async fn guarded_while(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    observed: &ExecutionEnvironment,
    still: impl Fn(&ExecutionEnvironment) -> bool,
    mut mutate: impl FnMut(&mut Write<'_>),
) -> Result<(), ReconcileError> {
    let name = name_of(observed);
    let basis = Observation::of(observed.status.as_ref());
    let uid = observed.metadata.uid.clone();
    let now = RfcTime::from_system_time(ctx.runtime.clock.wall());
    let matched = cas::update_status(envs, &name, |live| {
        if live.metadata.uid != uid
            || Observation::of(live.status.as_ref()) != basis
            || !still(live)
        {
            return Ok(Decision::Keep(false));
        }
        Ok(apply(live, now, &mut mutate, true))
    })
    .await?;
    if matched {
        Ok(())
    } else {
        Err(ReconcileError::Conflict {
            env: name,
            what: "lifecycle operation changed concurrently",
        })
    }
}

/// Applies `mutate` to the live status without the observation guard (ordinary failure
/// conditions); writes only when something changed.
pub async fn unguarded(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    mut mutate: impl FnMut(&mut Write<'_>),
) -> Result<(), ReconcileError> {
    let name = name_of(env);
    let now = RfcTime::from_system_time(ctx.runtime.clock.wall());
    cas::update_status(envs, &name, |live| Ok(apply(live, now, &mut mutate, ())))
        .await
        .map_err(ReconcileError::from)
}

fn apply<T>(
    live: &mut ExecutionEnvironment,
    now: RfcTime,
    mutate: &mut impl FnMut(&mut Write<'_>),
    answer: T,
) -> Decision<T> {
    let generation = live.metadata.generation.unwrap_or(0);
    let status = live.status.get_or_insert_with(Default::default);
    let before = status.clone();
    mutate(&mut Write {
        status,
        generation,
        now,
    });
    if *status == before {
        Decision::Keep(answer)
    } else {
        Decision::Write(answer)
    }
}

/// Sets Ready=False with `reason` (unguarded).
pub async fn not_ready(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    unguarded(envs, ctx, env, |w| w.ready(false, reason, message)).await
}

/// Fences the environment (guarded): fenceState FenceUnknown and Ready=False/FenceUnknown.
/// Whatever operation identity is recorded stays, for recovery.
pub async fn fence(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    reason: FenceReason,
    message: &str,
) -> Result<(), ReconcileError> {
    guarded(envs, ctx, env, |w| {
        w.status.fence_state = Some(FenceState::FenceUnknown);
        w.ready(false, condition::reason::FENCE_UNKNOWN, message);
    })
    .await?;
    count_fence(ctx, env, reason);
    Ok(())
}

/// Counts a fence just written over `observed`, unless it was fenced already.
pub fn count_fence(ctx: &Context, observed: &ExecutionEnvironment, reason: FenceReason) {
    let already =
        observed.status.as_ref().and_then(|s| s.fence_state) == Some(FenceState::FenceUnknown);
    if !already {
        ctx.lifecycle.fence(reason);
        ctx.record_event(observed, EnvironmentEvent::Fenced(reason));
    }
}

/// Fences the environment because the operation lease `expired` ran out (guarded): besides
/// the runtime observation, the live object must still record that exact operation, with the
/// same id and the same expiry the decision judged. A completion (the operation cleared), a
/// renewal (a later expiry) or a `RecoverEnvironment` (operation cleared, fence lifted) that
/// landed after the decision is never overwritten; the reconcile ends with a conflict instead.
pub async fn fence_expired(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    expired: &ActiveOperation,
    message: &str,
) -> Result<(), ReconcileError> {
    let judged = |live: &ExecutionEnvironment| {
        live.status
            .as_ref()
            .and_then(|s| s.active_operation.as_ref())
            .is_some_and(|op| op.id == expired.id && op.expires_at == expired.expires_at)
    };
    guarded_while(envs, ctx, env, judged, |w| {
        w.status.fence_state = Some(FenceState::FenceUnknown);
        w.ready(false, condition::reason::FENCE_UNKNOWN, message);
    })
    .await?;
    count_fence(ctx, env, FenceReason::LeaseExpired);
    Ok(())
}

/// Fences and answers the fence as the reconcile error, so the retry is rate limited.
pub async fn fence_error(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    reason: FenceReason,
    what: &'static str,
) -> ReconcileError {
    let fenced = ReconcileError::Fenced {
        env: name_of(env),
        what,
    };
    ReconcileError::join(fenced, fence(envs, ctx, env, reason, what).await)
}
