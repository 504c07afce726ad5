//! One reconcile of one environment, in the exact order of k8s-executor §2.3: revocation,
//! schema gate, operation-lease expiry (ask the supervisor, else fence), template validity, retained deletion, deletion block,
//! finalizer, lifecycle, retirement, then the PVC, the Pod and the runtime status.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::error::ReconcileError;
use super::late::remove_landed_late;
use super::lifecycle::reconcile_lifecycle;
use super::pod::{ensure_pod, pod_ready, pod_terminal};
use super::pvc::ensure_pvc;
use super::recovery;
use super::revoke::stop_revoked_executor;
use super::status::{count_fence, fence_expired, guarded, not_ready, unguarded};
use super::validate_pod::runs_supervisor;
use super::{Context, Next, upgrade};
use crate::kube::crd::{
    ActiveOperation, ConditionStatus, Desired, ENVIRONMENT_FINALIZER, ExecutionEnvironment,
    FenceState, LifecycleType, ObjectIdentity, SCHEMA_VERSION, condition,
};
use crate::metrics::FenceReason;
use crate::store::cas;
use crate::store::expiry::Settled;
use crate::store::ledger::landed_late;

use condition::reason;

/// Reconciles the live state of `name`.
pub async fn reconcile(ctx: &Context, name: &str) -> Result<Next, ReconcileError> {
    let envs = Api::<ExecutionEnvironment>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let Some(mut env) = cas::get(&envs, name).await? else {
        return Ok(Next::Wait);
    };
    // First the commands whose claim lapsed (docs/commands.md §5.5): before a revoked
    // template's executor is stopped, so that their ends are proven by the supervisor.
    let mut recheck = None;
    if let Some(warden) = ctx.commands.get() {
        let enforced = warden.enforce(&env).await;
        recheck = enforced.recheck;
        if enforced.wrote {
            let Some(written) = cas::get(&envs, name).await? else {
                return Ok(Next::Wait);
            };
            env = written;
        }
    }
    let next = reconcile_env(&envs, ctx, &env).await?;
    Ok(match recheck {
        Some(after) => next.at_most(after),
        None => next,
    })
}

async fn reconcile_env(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
) -> Result<Next, ReconcileError> {
    if landed_late(env) {
        return remove_landed_late(envs, env).await;
    }
    let revision = ctx
        .templates
        .for_environment(
            &env.spec.template_id,
            &env.spec.template_revision,
            &env.spec.template_digest,
        )
        .ok();
    let stop_error = match revision {
        None => stop_revoked_executor(env, ctx).await.err(),
        Some(_) => None,
    };
    let status = env.status.clone().unwrap_or_default();
    if env.spec.schema_version != SCHEMA_VERSION || status.schema_version != Some(SCHEMA_VERSION) {
        let written = not_ready(
            envs,
            ctx,
            env,
            reason::INCOMPATIBLE_SCHEMA,
            "only schema version 2 is supported",
        )
        .await;
        return match stop_error {
            Some(e) => Err(ReconcileError::join(e, written)),
            None => written.map(|()| Next::Wait),
        };
    }
    let mut lease = None;
    let fenced = status.fence_state == Some(FenceState::FenceUnknown);
    // A fenced environment keeps its operation's identity for the record; its lease no
    // longer decides anything (the recovery below does).
    if let Some(op) = status.active_operation.as_ref().filter(|_| !fenced) {
        let remaining = op
            .expires_at
            .to_system_time()
            .duration_since(ctx.runtime.clock.wall())
            .unwrap_or_default();
        if remaining.is_zero() {
            return settle_or_fence(envs, ctx, env, op).await;
        }
        lease = Some(remaining);
    }
    let next = provision(envs, ctx, env, revision, stop_error).await?;
    Ok(match lease {
        Some(remaining) => next.at_most(remaining),
        None => next,
    })
}

/// The operation `expired`'s holder is gone: ask the executor's supervisor before fencing
/// (the recovery issue, item 1; [`crate::store::expiry`]). A proven end is recorded and the
/// operation cleared, a call still running under a current claim is adopted by this replica,
/// one whose claim ended is cancelled and its proven end recorded; whatever the supervisor
/// cannot answer (or a reconciler without a store) fences, keeping the operation's identity.
async fn settle_or_fence(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    expired: &ActiveOperation,
) -> Result<Next, ReconcileError> {
    let settled = match ctx.commands.get() {
        Some(warden) => warden.store().settle_expired(env, expired).await?,
        None => Settled::Fence("no store to ask the supervisor with"),
    };
    match settled {
        Settled::Recorded => Ok(Next::Wait),
        Settled::Adopted(lease) => Ok(Next::After(lease)),
        Settled::Fence(why) => {
            tracing::info!(env = ?env.metadata.name, operation = expired.id, why, "fencing an operation whose holder is gone");
            fence_expired(
                envs,
                ctx,
                env,
                expired,
                "operation holder lease expired; operation identity retained for recovery",
            )
            .await?;
            Ok(Next::Wait)
        }
    }
}

async fn provision(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    revision: Option<&crate::templates::TemplateRevision>,
    stop_error: Option<ReconcileError>,
) -> Result<Next, ReconcileError> {
    let status = env.status.clone().unwrap_or_default();
    let lifecycle = status.lifecycle_operation.as_ref();
    if revision.is_none() {
        let message = "template revision is missing, revoked or redefined";
        if let Some(e) = stop_error {
            let written = not_ready(envs, ctx, env, reason::INVALID_TEMPLATE, message).await;
            return Err(ReconcileError::join(e, written));
        }
        if lifecycle.is_none() {
            not_ready(envs, ctx, env, reason::INVALID_TEMPLATE, message).await?;
            return Ok(Next::Wait);
        }
    }
    if lifecycle.is_some_and(|op| op.type_ == LifecycleType::DeleteRetiredEnvironment) {
        return reconcile_lifecycle(envs, ctx, env, revision).await;
    }
    if env.metadata.deletion_timestamp.is_some() {
        unguarded(envs, ctx, env, |w| {
            w.condition(
                condition::DELETION_BLOCKED,
                true,
                reason::EXACT_LIFECYCLE_REQUIRED,
                "deletion requires the exact DeleteRetiredEnvironment operation",
            );
        })
        .await?;
        return Ok(Next::Wait);
    }
    if !env.finalizers().iter().any(|f| f == ENVIRONMENT_FINALIZER) {
        add_finalizer(envs, env).await?;
        return Ok(Next::Wait);
    }
    if status.fence_state == Some(FenceState::FenceUnknown) {
        // Nothing is provisioned meanwhile: either the provider proves the executor's end
        // itself (automatic recovery), or an administrator's recovery clears the fence.
        return recovery::reconcile_fenced(envs, ctx, env, revision).await;
    }
    if lifecycle.is_some_and(|op| !op.id.is_empty()) {
        return reconcile_lifecycle(envs, ctx, env, revision).await;
    }
    let retired = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::RETIRED && c.status == ConditionStatus::True);
    if retired {
        return Ok(Next::Wait);
    }
    if env.spec.desired == Desired::Retiring {
        not_ready(
            envs,
            ctx,
            env,
            reason::UNSUPPORTED_RETIREMENT_REQUEST,
            "retirement requires the RetireEnvironment operation",
        )
        .await?;
        return Ok(Next::Wait);
    }
    let Some(revision) = revision else {
        return Ok(Next::Wait);
    };
    ensure_runtime(envs, ctx, env, revision.execution()).await
}

async fn ensure_runtime(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    spec: &crate::templates::ExecutionSpec,
) -> Result<Next, ReconcileError> {
    let pvc = match ensure_pvc(env, spec, ctx).await {
        Ok(pvc) => pvc,
        Err(e) => {
            let written = not_ready(
                envs,
                ctx,
                env,
                reason::PVC_UNAVAILABLE,
                "the workspace PVC is unavailable",
            )
            .await;
            return Err(ReconcileError::join(e, written));
        }
    };
    let pod = match ensure_pod(envs, env, spec, ctx).await {
        Ok(pod) => pod,
        Err(e) if e.code() == crate::errors::ErrorCode::FenceUnknown => return Err(e),
        Err(e) => {
            let written = not_ready(
                envs,
                ctx,
                env,
                reason::EXECUTOR_UNAVAILABLE,
                "the executor Pod is unavailable",
            )
            .await;
            return Err(ReconcileError::join(e, written));
        }
    };
    let exited = pod_terminal(&pod);
    let proven = status_proves_exit(env, &pod);
    let ready = pod_ready(&pod);
    record_runtime(envs, ctx, env, &pvc, &pod, ready, exited && !proven).await?;
    if ready && !exited && !runs_supervisor(&pod) {
        // Read again: the write above may have just made the environment Ready.
        let name = env.metadata.name.clone().unwrap_or_default();
        if let Some(live) = cas::get(envs, &name).await? {
            upgrade::admit_upgrade(envs, ctx, &live, &pod).await?;
        }
    }
    Ok(if ready || exited {
        Next::Wait
    } else {
        Next::PodNotReady
    })
}

fn identity(meta: &kube::core::ObjectMeta) -> ObjectIdentity {
    ObjectIdentity {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

/// `updateRuntimeStatus`: the identities, the observed generation and Ready (guarded).
async fn record_runtime(
    envs: &Api<ExecutionEnvironment>,
    ctx: &Context,
    env: &ExecutionEnvironment,
    pvc: &PersistentVolumeClaim,
    pod: &Pod,
    ready: bool,
    fence_exit: bool,
) -> Result<(), ReconcileError> {
    let message = if ready {
        "PVC and executor Pod are ready"
    } else {
        "waiting for executor Pod readiness"
    };
    let first_ready = ready && !fence_exit && never_ready(env);
    guarded(envs, ctx, env, |w| {
        w.status.pvc = Some(identity(&pvc.metadata));
        w.status.pod = Some(identity(&pod.metadata));
        w.status.observed_generation = Some(w.generation);
        if fence_exit {
            // DECISIONS 15: an exited executor is never restarted; nothing in flight can be
            // trusted, and only the admin lifecycle moves the environment on.
            w.status.fence_state = Some(FenceState::FenceUnknown);
            w.ready(
                false,
                reason::FENCE_UNKNOWN,
                "executor exited; only the admin lifecycle may replace it",
            );
        } else {
            w.ready(ready, reason::RECONCILED, message);
        }
    })
    .await?;
    if fence_exit {
        count_fence(ctx, env, FenceReason::ExecutorExited);
    }
    if first_ready {
        record_first_ready(ctx, env);
    }
    Ok(())
}

/// Whether `env` was never Ready: not Ready now, and no replacement or recovery is on record
/// (after those, its age is not an ensure-to-ready latency).
fn never_ready(env: &ExecutionEnvironment) -> bool {
    let status = env.status.as_ref();
    let ready_now = status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == condition::READY && c.status == ConditionStatus::True)
    });
    !ready_now
        && status.is_none_or(|s| s.last_replacement.is_none() && s.termination_proof.is_none())
}

/// Observes the environment's age (creation to now, wall clock) as its ensure-to-ready.
fn record_first_ready(ctx: &Context, env: &ExecutionEnvironment) {
    let Some(created) = env.metadata.creation_timestamp.as_ref() else {
        return;
    };
    let created = crate::kube::crd::RfcTime(created.0).to_system_time();
    if let Ok(age) = ctx.runtime.clock.wall().duration_since(created) {
        ctx.metrics.first_ready(age.as_secs_f64());
    }
}

/// Whether a recorded termination proof already covers this exited Pod (after recovery), so
/// its exit must not fence the environment again.
fn status_proves_exit(env: &ExecutionEnvironment, pod: &Pod) -> bool {
    let proof = env
        .status
        .as_ref()
        .and_then(|s| s.termination_proof.as_ref());
    proof.is_some_and(|p| Some(&p.pod_uid) == pod.metadata.uid.as_ref())
}

async fn add_finalizer(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
) -> Result<(), ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let mut updated = env.clone();
    updated
        .metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push(ENVIRONMENT_FINALIZER.to_owned());
    match envs.replace(&name, &PostParams::default(), &updated).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(ReconcileError::Conflict {
            env: name,
            what: "environment changed before its finalizer was added",
        }),
        Err(e) => Err(ReconcileError::kube(&name, "add finalizer")(e)),
    }
}
