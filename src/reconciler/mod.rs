//! The reconciler: turns each `ExecutionEnvironment` into a retained workspace PVC and a
//! hardened executor Pod, records their identities in the status by compare-and-swap, and
//! reports readiness. A missing executor Pod whose identity was recorded fences the
//! environment and is never re-created (DECISIONS 15); an expired operation lease fences it.
//!
//! Every replica reconciles every environment; safety comes from compare-and-swap status
//! writes, not leader election. Start-up never mutates environments.

pub mod conditions;
pub mod render;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::kube::crd::{
    ConditionStatus, ENVIRONMENT_FINALIZER, ExecutionEnvironment, FenceState, LABEL_ENVIRONMENT,
    ObjectIdentity, RfcTime, SCHEMA_VERSION, condition, pod_name, pvc_name,
};
use crate::runtime::Runtime;
use crate::store::StoreError;
use crate::store::cas::{self, Decision};
use crate::templates::{ExecutionSpec, TemplateRegistry};
use conditions::set_condition;

/// How soon an environment whose Pod is not ready yet is looked at again (events usually
/// come first).
const NOT_READY_REQUEUE: Duration = Duration::from_secs(2);
/// Longest wait before a failed reconcile is retried.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What the reconciler needs.
#[derive(Clone)]
pub struct ReconcilerConfig {
    /// The provider namespace.
    pub namespace: String,
    /// The service account executor Pods run as (dedicated, never `default`).
    pub executor_service_account: String,
}

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A status write or read failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Kubernetes API failed on a runtime object.
    #[error("environment {env}: {what}: {source}")]
    Kube {
        /// The environment.
        env: String,
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: kube::Error,
    },
    /// An existing runtime object does not belong to this environment.
    #[error("environment {env}: {what}")]
    Mismatch {
        /// The environment.
        env: String,
        /// What does not match.
        what: &'static str,
    },
}

struct Context {
    client: kube::Client,
    config: ReconcilerConfig,
    templates: Arc<TemplateRegistry>,
    runtime: Runtime,
    failures: std::sync::Mutex<std::collections::BTreeMap<String, u32>>,
}

/// Runs the reconciler until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: ReconcilerConfig,
    templates: Arc<TemplateRegistry>,
    runtime: Runtime,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = config.namespace.clone();
    let envs = Api::<ExecutionEnvironment>::namespaced(client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let labelled = || watcher::Config::default().labels(LABEL_ENVIRONMENT);
    let context = Arc::new(Context {
        client,
        config,
        templates,
        runtime,
        failures: Default::default(),
    });
    let by_label = move |labels: Option<&std::collections::BTreeMap<String, String>>, ns: &str| {
        labels
            .and_then(|l| l.get(LABEL_ENVIRONMENT))
            .filter(|v| !v.is_empty())
            .map(|v| ObjectRef::<ExecutionEnvironment>::new(v).within(ns))
    };
    let (pod_ns, pvc_ns) = (ns.clone(), ns.clone());
    Controller::new(envs, watcher::Config::default())
        .watches(pods, labelled(), move |pod: Pod| {
            by_label(pod.metadata.labels.as_ref(), &pod_ns)
        })
        .watches(pvcs, labelled(), move |pvc: PersistentVolumeClaim| {
            by_label(pvc.metadata.labels.as_ref(), &pvc_ns)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile failed");
            }
        })
        .await;
}

fn error_policy(
    env: Arc<ExecutionEnvironment>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let name = env.metadata.name.clone().unwrap_or_default();
    let mut failures = ctx.failures.lock().expect("failure counts lock");
    let count = failures.entry(name.clone()).or_insert(0);
    *count = count.saturating_add(1);
    let backoff = Duration::from_millis(100)
        .saturating_mul(1u32 << (*count).min(12))
        .min(MAX_BACKOFF);
    tracing::warn!(env = %name, %error, ?backoff, "reconcile failed; retrying");
    Action::requeue(backoff)
}

async fn reconcile(
    cached: Arc<ExecutionEnvironment>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let name = cached.metadata.name.clone().unwrap_or_default();
    let envs = Api::<ExecutionEnvironment>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let Some(env) = cas::get(&envs, &name).await? else {
        return Ok(Action::await_change());
    };
    let action = reconcile_live(&envs, &env, &ctx).await?;
    ctx.failures
        .lock()
        .expect("failure counts lock")
        .remove(&name);
    Ok(action)
}

async fn reconcile_live(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    use condition::reason;
    let revision = ctx.templates.for_environment(
        &env.spec.template_id,
        &env.spec.template_revision,
        &env.spec.template_digest,
    );
    let status = env.status.clone().unwrap_or_default();
    if env.spec.schema_version != SCHEMA_VERSION || status.schema_version != Some(SCHEMA_VERSION) {
        write_ready(
            envs,
            env,
            ctx,
            false,
            reason::INCOMPATIBLE_SCHEMA,
            "only schema version 2 is supported",
        )
        .await?;
        return Ok(Action::await_change());
    }
    if let Some(op) = &status.active_operation {
        let remaining = op
            .expires_at
            .to_system_time()
            .duration_since(ctx.runtime.clock.wall())
            .unwrap_or_default();
        if remaining.is_zero() {
            fence(
                envs,
                env,
                ctx,
                "operation holder lease expired; operation identity retained for recovery",
            )
            .await?;
            return Ok(Action::await_change());
        }
        // Look again when the lease would expire.
        let action = Action::requeue(remaining);
        if status.fence_state == Some(FenceState::FenceUnknown) {
            return Ok(action);
        }
    }
    let Ok(revision) = revision else {
        write_ready(
            envs,
            env,
            ctx,
            false,
            reason::INVALID_TEMPLATE,
            "template revision unavailable",
        )
        .await?;
        return Ok(Action::await_change());
    };
    if env.metadata.deletion_timestamp.is_some() {
        write_condition(
            envs,
            env,
            ctx,
            condition::DELETION_BLOCKED,
            ConditionStatus::True,
            reason::EXACT_LIFECYCLE_REQUIRED,
            "deletion requires DeleteRetiredEnvironment",
        )
        .await?;
        return Ok(Action::await_change());
    }
    if !env.finalizers().iter().any(|f| f == ENVIRONMENT_FINALIZER) {
        add_finalizer(envs, env).await?;
        return Ok(Action::await_change());
    }
    if status.lifecycle_operation.is_some() || status.fence_state == Some(FenceState::FenceUnknown)
    {
        // The admin lifecycle moves fenced and transitioning environments on.
        return Ok(Action::await_change());
    }
    if env.spec.desired != crate::kube::crd::Desired::Active {
        write_ready(
            envs,
            env,
            ctx,
            false,
            reason::UNSUPPORTED_RETIREMENT_REQUEST,
            "retirement requires RetireEnvironment",
        )
        .await?;
        return Ok(Action::await_change());
    }
    let spec = revision.execution();
    let pvc = match ensure_pvc(env, spec, ctx).await {
        Ok(pvc) => pvc,
        Err(e) => {
            write_ready(
                envs,
                env,
                ctx,
                false,
                reason::PVC_UNAVAILABLE,
                "workspace volume unavailable",
            )
            .await?;
            return Err(e);
        }
    };
    let pod = match ensure_pod(envs, env, spec, ctx).await {
        Ok(Some(pod)) => pod,
        Ok(None) => return Ok(Action::await_change()),
        Err(e) => {
            write_ready(
                envs,
                env,
                ctx,
                false,
                reason::EXECUTOR_UNAVAILABLE,
                "executor unavailable",
            )
            .await?;
            return Err(e);
        }
    };
    let ready = pod_ready(&pod);
    record_runtime(envs, env, ctx, &pvc, &pod, ready).await?;
    Ok(if ready {
        Action::await_change()
    } else {
        Action::requeue(NOT_READY_REQUEUE)
    })
}

/// Whether the Pod is running and Ready.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn identity(meta: &kube::core::ObjectMeta) -> ObjectIdentity {
    ObjectIdentity {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

async fn ensure_pvc(
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    ctx: &Context,
) -> Result<PersistentVolumeClaim, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let kube_err = |what| kube_failure(&name, what);
    let recorded = env
        .status
        .as_ref()
        .and_then(|s| s.pvc.as_ref())
        .map(|p| p.uid.clone());
    let pvc = match api
        .get_opt(&pvc_name(&name))
        .await
        .map_err(kube_err("read PVC"))?
    {
        Some(pvc) => pvc,
        None if recorded.is_some() => {
            return Err(ReconcileError::Mismatch {
                env: name.clone(),
                what: "authoritative PVC disappeared; replacement is forbidden",
            });
        }
        None => match api
            .create(&PostParams::default(), &render::workspace_pvc(env, spec))
            .await
        {
            Ok(pvc) => pvc,
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&pvc_name(&name))
                .await
                .map_err(kube_err("read PVC"))?,
            Err(e) => return Err(kube_err("create PVC")(e)),
        },
    };
    let labels = pvc.metadata.labels.clone().unwrap_or_default();
    let owned = labels.get(LABEL_ENVIRONMENT) == Some(&name)
        && pvc
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
        && recorded
            .as_ref()
            .is_none_or(|uid| Some(uid) == pvc.metadata.uid.as_ref());
    if !owned {
        return Err(ReconcileError::Mismatch {
            env: name,
            what: "PVC ownership or immutable specification mismatch",
        });
    }
    Ok(pvc)
}

/// The executor Pod, created if absent. `None` when the environment was fenced because a
/// recorded Pod vanished.
async fn ensure_pod(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    ctx: &Context,
) -> Result<Option<Pod>, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let account = &ctx.config.executor_service_account;
    if account.is_empty() || account == "default" {
        return Err(ReconcileError::Mismatch {
            env: name,
            what: "executor ServiceAccount must be dedicated",
        });
    }
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let kube_err = |what| kube_failure(&name, what);
    let recorded = env
        .status
        .as_ref()
        .and_then(|s| s.pod.as_ref())
        .map(|p| p.uid.clone());
    let pod = match api
        .get_opt(&pod_name(&name))
        .await
        .map_err(kube_err("read Pod"))?
    {
        Some(pod) => pod,
        None if recorded.is_some() => {
            fence(
                envs,
                env,
                ctx,
                "previous executor disappearance is not externally fenced",
            )
            .await?;
            return Ok(None);
        }
        None => match api
            .create(
                &PostParams::default(),
                &render::executor_pod(env, spec, account),
            )
            .await
        {
            Ok(pod) => pod,
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&pod_name(&name))
                .await
                .map_err(kube_err("read Pod"))?,
            Err(e) => return Err(kube_err("create Pod")(e)),
        },
    };
    let controller_uid = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.iter().find(|r| r.controller == Some(true)))
        .map(|r| r.uid.clone());
    let owned = controller_uid.is_some()
        && controller_uid == env.metadata.uid
        && recorded
            .as_ref()
            .is_none_or(|uid| Some(uid) == pod.metadata.uid.as_ref());
    if !owned {
        return Err(ReconcileError::Mismatch {
            env: name,
            what: "executor Pod does not belong to this environment",
        });
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(ReconcileError::Mismatch {
            env: name,
            what: "pod is terminating",
        });
    }
    Ok(Some(pod))
}

fn kube_failure(env: &str, what: &'static str) -> impl FnOnce(kube::Error) -> ReconcileError {
    let env = env.to_owned();
    move |source| ReconcileError::Kube { env, what, source }
}

async fn add_finalizer(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
) -> Result<(), ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let mut finalizers = env.finalizers().to_vec();
    finalizers.push(ENVIRONMENT_FINALIZER.to_owned());
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": env.metadata.resource_version}
    });
    envs.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|source| ReconcileError::Kube {
            env: name,
            what: "add finalizer",
            source,
        })
}

/// Writes the runtime identities and the Ready condition, skipping a write that would change
/// nothing. Refused when a recorded identity or the epoch changed since the decision.
async fn record_runtime(
    envs: &Api<ExecutionEnvironment>,
    observed: &ExecutionEnvironment,
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    pod: &Pod,
    ready: bool,
) -> Result<(), ReconcileError> {
    let name = observed.metadata.name.clone().unwrap_or_default();
    let basis = observed.status.clone().unwrap_or_default();
    let now = RfcTime::from_system_time(ctx.runtime.clock.wall());
    let message = if ready {
        "PVC and executor Pod are ready"
    } else {
        "waiting for executor Pod readiness"
    };
    cas::update_status(envs, &name, |o| {
        let generation = o.metadata.generation.unwrap_or(0);
        let status = o.status.get_or_insert_with(Default::default);
        let same_basis = status.lifecycle_operation == basis.lifecycle_operation
            && status.epoch == basis.epoch
            && status.pod.as_ref().map(|p| &p.uid) == basis.pod.as_ref().map(|p| &p.uid)
            && status.pvc.as_ref().map(|p| &p.uid) == basis.pvc.as_ref().map(|p| &p.uid)
            && status.fence_state != Some(FenceState::FenceUnknown);
        if !same_basis {
            return Err(StoreError::conflict(
                &name,
                "lifecycle operation changed concurrently",
            ));
        }
        let before = status.clone();
        status.pvc = Some(identity(&pvc.metadata));
        status.pod = Some(identity(&pod.metadata));
        status.observed_generation = Some(generation);
        let value = if ready {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        set_condition(
            status,
            condition::READY,
            value,
            condition::reason::RECONCILED,
            message,
            generation,
            now,
        );
        Ok(if *status == before {
            Decision::Keep(())
        } else {
            Decision::Write(())
        })
    })
    .await?;
    Ok(())
}

async fn fence(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    ctx: &Context,
    message: &'static str,
) -> Result<(), ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let now = RfcTime::from_system_time(ctx.runtime.clock.wall());
    cas::update_status(envs, &name, |o| {
        let generation = o.metadata.generation.unwrap_or(0);
        let status = o.status.get_or_insert_with(Default::default);
        let before = status.clone();
        status.fence_state = Some(FenceState::FenceUnknown);
        set_condition(
            status,
            condition::READY,
            ConditionStatus::False,
            condition::reason::FENCE_UNKNOWN,
            message,
            generation,
            now,
        );
        Ok(if *status == before {
            Decision::Keep(())
        } else {
            Decision::Write(())
        })
    })
    .await?;
    Ok(())
}

async fn write_ready(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    ctx: &Context,
    ready: bool,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    let value = if ready {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    write_condition(envs, env, ctx, condition::READY, value, reason, message).await
}

async fn write_condition(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    ctx: &Context,
    type_: &str,
    value: ConditionStatus,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let now = RfcTime::from_system_time(ctx.runtime.clock.wall());
    cas::update_status(envs, &name, |o| {
        let generation = o.metadata.generation.unwrap_or(0);
        let status = o.status.get_or_insert_with(Default::default);
        let before = status.clone();
        set_condition(status, type_, value, reason, message, generation, now);
        Ok(if *status == before {
            Decision::Keep(())
        } else {
            Decision::Write(())
        })
    })
    .await?;
    Ok(())
}
