//! `DeleteRetiredEnvironment` on the reconciler side (k8s-executor §2.8): delete the retained
//! PVC by exact UID, then release the capacity slot, remove the environment finalizer and
//! delete the resource with UID and resourceVersion preconditions. A peer replica racing any
//! step gets a conflict and never re-adds the finalizer.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Preconditions};

use super::error::ReconcileError;
use super::removal::{RemovalConflicts, remove_finalizer_and_delete};
use super::status::{Observation, fence_error, guarded};
use super::{Context, Next, ledger};
use crate::kube::crd::{
    ConditionStatus, ExecutionEnvironment, LifecycleOperation, LifecyclePhase, condition, pvc_name,
};
use crate::metrics::FenceReason;

/// Moves an admitted retained deletion on by one step.
pub async fn reconcile_retained_delete(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    op: &LifecycleOperation,
) -> Result<Next, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let has = |type_: &str| {
        env.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
        })
    };
    let phase_ok = matches!(
        op.phase,
        LifecyclePhase::DeletingPvc | LifecyclePhase::ReleasingSlot
    );
    if !phase_ok || !has(condition::RETIRED) || !has(condition::EXECUTOR_TERMINATED) {
        return Err(fence_error(
            envs,
            ctx,
            env,
            FenceReason::Retained,
            "retained deletion state is invalid",
        )
        .await);
    }
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let existing = pvcs
        .get_opt(&pvc_name(&name))
        .await
        .map_err(ReconcileError::kube(&name, "read PVC"))?;
    if let Some(pvc) = existing {
        if op.phase == LifecyclePhase::ReleasingSlot {
            return Err(fence_error(
                envs,
                ctx,
                env,
                FenceReason::Retained,
                "retained PVC reappeared after its deletion",
            )
            .await);
        }
        if pvc.metadata.uid != op.expected_pvc_uid {
            return Err(fence_error(
                envs,
                ctx,
                env,
                FenceReason::Retained,
                "retained PVC identity does not match",
            )
            .await);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pvc.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        return match pvcs.delete(&pvc_name(&name), &params).await {
            Ok(_) => Ok(Next::After(super::WAITING_REQUEUE)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Next::Wait),
            Err(e) => Err(ReconcileError::kube(&name, "delete PVC")(e)),
        };
    }
    if op.phase == LifecyclePhase::DeletingPvc {
        guarded(envs, ctx, env, |w| {
            if let Some(op) = w.status.lifecycle_operation.as_mut() {
                op.phase = LifecyclePhase::ReleasingSlot;
            }
        })
        .await?;
        return Ok(Next::Wait);
    }
    release_slot(envs, ctx, env, op).await
}

/// The last step: the slot, the finalizer, the resource, each exactly once.
async fn release_slot(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    op: &LifecycleOperation,
) -> Result<Next, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let conflict = |what| ReconcileError::Conflict {
        env: name.clone(),
        what,
    };
    let Some(live) = envs
        .get_opt(&name)
        .await
        .map_err(ReconcileError::kube(&name, "read environment"))?
    else {
        return Ok(Next::Wait);
    };
    let live_op = live
        .status
        .as_ref()
        .and_then(|s| s.lifecycle_operation.as_ref());
    let same = live.metadata.uid == env.metadata.uid
        && live_op.is_some_and(|o| {
            o.id == op.id && o.type_ == op.type_ && o.phase == LifecyclePhase::ReleasingSlot
        })
        && Observation::of(live.status.as_ref()) == Observation::of(env.status.as_ref());
    if !same {
        return Err(conflict("environment changed before its slot was released"));
    }
    ledger::release(ctx, &env.spec.template_id, &name).await?;
    let conflicts = RemovalConflicts {
        finalizer: "environment changed before its finalizer was removed",
        delete: "environment changed before it was deleted",
    };
    remove_finalizer_and_delete(envs, &name, live, &conflicts).await
}
