//! Moving an executor of an earlier release to the supervisor as its main process
//! (docs/commands.md §2). A Pod's command cannot change in place, so an adopted executor whose
//! main process is still the idle shell is replaced through the ordinary `ReplaceExecutor`
//! lifecycle (termination proven before anything else happens, a new epoch, a new Pod rendered
//! with the supervisor), which the reconciler admits itself, and only when the environment is
//! idle: Ready, healthy, no lifecycle operation, no active operation and no live run claim. A
//! claim holder or a running operation keeps the old executor (which still serves every
//! one-shot call) until it is done; an expired claim is cleared with the admission, as the
//! administrator's own replacement does.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::Context;
use super::error::ReconcileError;
use super::status::guarded_while;
use crate::kube::crd::{
    ConditionStatus, ExecutionEnvironment, FenceState, LifecycleOperation, LifecyclePhase,
    LifecycleType, RfcTime, condition,
};

/// The operation id of the upgrade of the Pod with this UID (one per Pod: a replay is the same).
pub const UPGRADE_OPERATION_PREFIX: &str = "executor-upgrade-";

/// The Ready message while the upgrade quiesces.
const UPGRADE_MESSAGE: &str = "replacing the executor to run the supervisor as its main process";

/// Whether `env` may have its executor replaced now (see the module header); `now` decides
/// whether a recorded claim has expired.
pub fn idle_for_upgrade(env: &ExecutionEnvironment, now: std::time::SystemTime) -> bool {
    let Some(status) = env.status.as_ref() else {
        return false;
    };
    let no_live_claim = status
        .active_run
        .as_ref()
        .is_none_or(|r| r.claim_id.is_empty() || now >= r.expires_at.to_system_time());
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::READY && c.status == ConditionStatus::True);
    no_live_claim
        && ready
        && status.active_operation.is_none()
        && status.lifecycle_operation.is_none()
        && status.fence_state == Some(FenceState::Healthy)
        && status.epoch.is_some()
        && status.pvc.as_ref().is_some_and(|p| !p.uid.is_empty())
}

/// Admits the replacement of `pod`, whose main process is not the supervisor, if the
/// environment is idle in the live object; true when the admission was written.
pub async fn admit_upgrade(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    pod: &Pod,
) -> Result<bool, ReconcileError> {
    let now = ctx.runtime.clock.wall();
    let status = env.status.clone().unwrap_or_default();
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let recorded = status.pod.as_ref().map(|p| p.uid.as_str());
    if pod_uid.is_empty() || recorded != Some(pod_uid.as_str()) || !idle_for_upgrade(env, now) {
        return Ok(false);
    }
    let operation = LifecycleOperation {
        id: format!("{UPGRADE_OPERATION_PREFIX}{pod_uid}"),
        type_: LifecycleType::ReplaceExecutor,
        phase: LifecyclePhase::Quiescing,
        expected_epoch: status.epoch,
        expected_pod_uid: Some(pod_uid),
        expected_pvc_uid: status.pvc.as_ref().map(|p| p.uid.clone()),
        created_at: RfcTime::from_system_time(now),
    };
    let admitted = guarded_while(
        envs,
        ctx,
        env,
        |live| idle_for_upgrade(live, now),
        |w| {
            if w.status
                .active_run
                .as_ref()
                .is_some_and(|r| now >= r.expires_at.to_system_time())
            {
                w.status.active_run = None;
            }
            w.status.lifecycle_operation = Some(operation.clone());
            w.ready(false, condition::reason::QUIESCING, UPGRADE_MESSAGE);
        },
    )
    .await;
    match admitted {
        Ok(()) => Ok(true),
        // The environment stopped being idle (a claim, an operation) or moved on: next pass.
        Err(ReconcileError::Conflict { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}
