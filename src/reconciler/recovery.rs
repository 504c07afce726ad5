//! Automatic recovery of a fenced environment (DECISIONS 15 as amended by the recovery issue):
//! when nothing the executor could say can be trusted any more, the provider proves the end of
//! every process itself instead of waiting for an administrator.
//!
//! The proof needs nobody's word: the reconciler deletes the exact executor Pod (UID
//! precondition, the ordinary 30 s grace, never a force delete), waits until the kubelet reports
//! every container terminated while the Pod's `verify-termination` finalizer still holds the
//! object, and records that as the termination proof in the same write that clears the fence,
//! the retained operation and the run claim (the claim's holder then gets ABORTED and acquires
//! again). The rest is the ordinary `ReplaceExecutor` lifecycle, admitted by the reconciler with
//! an operation id of its own ([`RECOVERY_OPERATION_PREFIX`] + the Pod's UID, so a replay is the
//! same operation): the finalizer is released, the Pod goes, and a new executor starts on the
//! same PVC at epoch + 1.
//!
//! What is not recovered, honestly, with the `Recovering` condition saying why:
//! * a revision whose template sets `recovery: manual` (only the administrator lifecycle);
//! * a Pod that vanished or is not the recorded one (nothing proves its processes gone);
//! * a Pod whose kubelet never confirms the end (a partitioned node): the environment stays
//!   fenced and the condition names the operator's way out (docs/operating.md, "Recovery").

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::error::ReconcileError;
use super::lifecycle::reconcile_lifecycle;
use super::status::{guarded, guarded_while};
use super::{Context, Next, WAITING_REQUEUE};
use crate::kube::crd::{
    ConditionStatus, ExecutionEnvironment, FenceState, LifecycleOperation, LifecyclePhase,
    LifecycleType, RfcTime, condition, pod_name,
};
use crate::telemetry::events::EnvironmentEvent;
use crate::templates::{RecoveryMode, TemplateRevision};

/// The operation id of the automatic recovery of the Pod with this UID.
pub const RECOVERY_OPERATION_PREFIX: &str = "executor-recovery-";

/// How long after the end of its deletion grace a Pod may still run before the environment
/// reports that its end is unconfirmed (the kubelet may be cut off from the API server).
pub const TERMINATION_UNCONFIRMED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// How often a blocked recovery looks again without an event.
const BLOCKED_REQUEUE: std::time::Duration = std::time::Duration::from_secs(30);

/// The `Recovering` condition type and its reasons.
pub mod reason {
    /// The condition type.
    pub const RECOVERING: &str = "Recovering";
    /// True: the exact executor Pod is being deleted and its end awaited.
    pub const AWAITING_TERMINAL_EXECUTOR: &str = "AwaitingTerminalExecutor";
    /// True: the end is proven; a new executor is starting on the same workspace.
    pub const STARTING_REPLACEMENT: &str = "StartingReplacement";
    /// False: a new executor serves; the previous one's end is on record.
    pub const RECOVERED: &str = "Recovered";
    /// False: the kubelet has not confirmed the Pod's end; the environment stays fenced.
    pub const TERMINATION_UNCONFIRMED: &str = "TerminationUnconfirmed";
    /// False: the Pod is gone or not the recorded one; nothing proves its processes ended.
    pub const EXECUTOR_IDENTITY_LOST: &str = "ExecutorIdentityLost";
    /// False: the template revision chooses manual recovery.
    pub const MANUAL_RECOVERY: &str = "ManualRecovery";
}

/// What an operator can do when the kubelet never confirms the end (the condition's message).
pub const UNCONFIRMED_MESSAGE: &str = "the executor Pod was deleted but its kubelet has not \
    confirmed that every container terminated (its node may be unreachable); the environment \
    stays fenced. Restore the node's connection, or power the node off, confirm it is down and \
    follow the manual recovery of docs/operating.md";

/// Whether `op` is an automatic recovery admitted by the reconciler.
pub fn is_recovery(op: &LifecycleOperation) -> bool {
    op.type_ == LifecycleType::ReplaceExecutor && op.id.starts_with(RECOVERY_OPERATION_PREFIX)
}

fn fenced(env: &ExecutionEnvironment) -> bool {
    env.status.as_ref().and_then(|s| s.fence_state) == Some(FenceState::FenceUnknown)
}

fn retired(env: &ExecutionEnvironment) -> bool {
    env.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == condition::RETIRED && c.status == ConditionStatus::True)
    })
}

/// Reconciles a fenced environment: drives its automatic recovery when one is admitted,
/// admits one when the template allows it and the exact executor Pod is there to be proven
/// ended, and otherwise says on the `Recovering` condition why it stays fenced.
pub async fn reconcile_fenced(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    revision: Option<&TemplateRevision>,
) -> Result<Next, ReconcileError> {
    let status = env.status.clone().unwrap_or_default();
    if let Some(op) = status.lifecycle_operation.as_ref() {
        if is_recovery(op) {
            return reconcile_lifecycle(envs, ctx, env, revision).await;
        }
        // Any other lifecycle operation moves only once the fence is cleared by its proof.
        return Ok(Next::Wait);
    }
    let Some(revision) = revision else {
        return Ok(Next::Wait);
    };
    if retired(env) || env.spec.desired == crate::kube::crd::Desired::Retiring {
        return Ok(Next::Wait);
    }
    // The simulator's liveness canary build removes exactly the automatic recovery (every
    // revision is treated as manual); the simulator must then find an environment left fenced.
    let mode = if cfg!(feature = "sim-recovery-canary") {
        RecoveryMode::Manual
    } else {
        revision.execution().recovery()
    };
    if mode == RecoveryMode::Manual {
        blocked(
            envs,
            ctx,
            env,
            reason::MANUAL_RECOVERY,
            "the template revision sets recovery: manual; an administrator recovers, replaces \
             or retires the environment (docs/operating.md)",
        )
        .await?;
        return Ok(Next::Wait);
    }
    let name = env.metadata.name.clone().unwrap_or_default();
    let (Some(recorded), Some(pvc), Some(epoch)) = (
        status.pod.as_ref(),
        status.pvc.as_ref(),
        status.epoch.filter(|e| *e > 0),
    ) else {
        return lost(envs, ctx, env).await;
    };
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let pod = pods
        .get_opt(&pod_name(&name))
        .await
        .map_err(ReconcileError::kube(&name, "read Pod"))?;
    let pod_uid = pod.and_then(|p| p.metadata.uid).unwrap_or_default();
    if recorded.uid.is_empty() || pod_uid != recorded.uid || pvc.uid.is_empty() {
        return lost(envs, ctx, env).await;
    }
    let now = ctx.runtime.clock.wall();
    let operation = LifecycleOperation {
        id: format!("{RECOVERY_OPERATION_PREFIX}{pod_uid}"),
        type_: LifecycleType::ReplaceExecutor,
        phase: LifecyclePhase::Quiescing,
        expected_epoch: Some(epoch),
        expected_pod_uid: Some(pod_uid),
        expected_pvc_uid: Some(pvc.uid.clone()),
        created_at: RfcTime::from_system_time(now),
    };
    // Guarded on the observation (epoch, Pod and PVC UIDs, no lifecycle operation) and on the
    // fence still standing: an administrator's recovery that landed first is never undone.
    guarded_while(
        envs,
        ctx,
        env,
        |live| fenced(live) && !retired(live),
        |w| {
            w.status.lifecycle_operation = Some(operation.clone());
            w.condition(
                reason::RECOVERING,
                true,
                reason::AWAITING_TERMINAL_EXECUTOR,
                "deleting the exact executor Pod; waiting for its kubelet to confirm that every \
                 container terminated",
            );
        },
    )
    .await?;
    ctx.record_event(env, EnvironmentEvent::RecoveryStarted);
    Ok(Next::Wait)
}

/// The recovery cannot prove anything: the condition says so and the fence stays.
async fn lost(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
) -> Result<Next, ReconcileError> {
    blocked(
        envs,
        ctx,
        env,
        reason::EXECUTOR_IDENTITY_LOST,
        "the executor Pod is gone or is not the recorded one, so nothing proves that its \
         processes ended; an operator who knows they did follows the manual recovery of \
         docs/operating.md",
    )
    .await?;
    Ok(Next::Wait)
}

/// Sets `Recovering=False` with `why` (guarded on the observation and the fence).
pub async fn blocked(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    why: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    guarded_while(envs, ctx, env, fenced, |w| {
        w.condition(reason::RECOVERING, false, why, message);
    })
    .await?;
    record_blocked(ctx, env, why, message);
    Ok(())
}

/// A `RecoveryBlocked` event when the `Recovering` condition was not already `why`.
fn record_blocked(ctx: &Context, env: &ExecutionEnvironment, why: &str, message: &str) {
    let repeated = env.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == reason::RECOVERING && c.reason == why)
    });
    if !repeated {
        ctx.record_event(env, EnvironmentEvent::RecoveryBlocked { why, message });
    }
}

/// The event of an automatic recovery that gave up because `what` no longer matched.
pub fn gave_up(what: &str) -> EnvironmentEvent<'_> {
    EnvironmentEvent::RecoveryBlocked {
        why: reason::EXECUTOR_IDENTITY_LOST,
        message: what,
    }
}

/// While the deleted Pod has not terminated: how long to wait before looking again, after
/// saying on the condition whether its end is overdue.
pub async fn awaiting_end(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    pod: &Pod,
) -> Result<Next, ReconcileError> {
    let now = ctx.runtime.clock.wall();
    let overdue = pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| {
        let due = RfcTime(t.0).to_system_time() + TERMINATION_UNCONFIRMED_AFTER;
        now >= due
    });
    if overdue {
        guarded(envs, ctx, env, |w| {
            w.condition(
                reason::RECOVERING,
                false,
                reason::TERMINATION_UNCONFIRMED,
                UNCONFIRMED_MESSAGE,
            );
        })
        .await?;
        record_blocked(
            ctx,
            env,
            reason::TERMINATION_UNCONFIRMED,
            UNCONFIRMED_MESSAGE,
        );
        return Ok(Next::After(BLOCKED_REQUEUE));
    }
    Ok(Next::After(WAITING_REQUEUE))
}

/// The status changes of the proof write of an automatic recovery: the fence, the retained
/// operation and the run claim go (the claim's holder acquires again), every command lease
/// ends by the executor's end.
pub fn clear_fence_on_proof(w: &mut super::status::Write<'_>, now: std::time::SystemTime) {
    crate::store::command_leases::end_all_by_executor_end(w.status, now);
    w.status.active_operation = None;
    w.status.active_run = None;
    w.status.fence_state = Some(FenceState::Healthy);
    w.condition(
        reason::RECOVERING,
        true,
        reason::STARTING_REPLACEMENT,
        "the previous executor's end is proven and recorded; a new executor is starting on \
         the same workspace",
    );
}
