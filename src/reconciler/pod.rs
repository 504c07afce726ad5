//! `ensurePod` (k8s-executor §2.5) and the Pod predicates the reconciler and the lifecycle
//! rely on: `pod_ready` and `pod_terminal` (§2.7).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, PostParams};

use super::error::ReconcileError;
use super::validate_pod::{PodShape, validate_pod};
use super::{Context, render, status};
use crate::kube::crd::{ExecutionEnvironment, pod_name};
use crate::metrics::FenceReason;
use crate::templates::ExecutionSpec;

/// The environment's executor Pod: read, or created when none was ever recorded, then
/// validated. A recorded Pod that vanished fences the environment and is never re-created.
pub async fn ensure_pod(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    ctx: &Context,
) -> Result<Pod, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let account = ctx.config.executor_service_account.as_str();
    if account.is_empty() || account == "default" {
        return Err(ReconcileError::mismatch(
            &name,
            "executor ServiceAccount must be dedicated",
        ));
    }
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let recorded = env.status.as_ref().and_then(|s| s.pod.as_ref());
    let pod = match api
        .get_opt(&pod_name(&name))
        .await
        .map_err(ReconcileError::kube(&name, "read Pod"))?
    {
        Some(pod) => pod,
        None if recorded.is_some() => {
            let fenced = status::fence(
                envs,
                ctx,
                env,
                FenceReason::ExecutorIdentity,
                "previous executor disappearance is not externally fenced",
            )
            .await;
            return Err(ReconcileError::join(
                ReconcileError::Fenced {
                    env: name,
                    what: "previous executor termination unconfirmed",
                },
                fenced,
            ));
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
                .map_err(ReconcileError::kube(&name, "read Pod"))?,
            Err(e) => return Err(ReconcileError::kube(&name, "create Pod")(e)),
        },
    };
    if deleted_and_exited(env, &pod) {
        return Ok(pod);
    }
    let shape = validate_pod(env, spec, account, &pod)
        .map_err(|what| ReconcileError::mismatch(&name, what))?;
    match shape {
        PodShape::Current => Ok(pod),
        // Boxed: the reconcile future stays small enough for a 2 MiB stack in debug builds.
        PodShape::Previous => Box::pin(move_to_current_shape(&api, env, spec, account, pod)).await,
    }
}

/// Whether `pod` is the recorded executor, deleted by someone other than the provider's
/// lifecycle (an eviction, a node drain, `kubectl delete pod`) and reported terminal by its
/// kubelet while the finalizer still holds it. It exited: the caller fences the environment
/// (DECISIONS 15) and the automatic recovery proves that end and starts a new executor. A
/// deleted Pod whose containers still run stays unavailable ("pod is terminating").
fn deleted_and_exited(env: &ExecutionEnvironment, pod: &Pod) -> bool {
    let recorded = env
        .status
        .as_ref()
        .and_then(|s| s.pod.as_ref())
        .map(|p| p.uid.as_str())
        .filter(|uid| !uid.is_empty());
    pod.metadata.deletion_timestamp.is_some()
        && recorded.is_some()
        && pod.metadata.uid.as_deref() == recorded
        && pod_terminal(pod)
}

/// Moves an adopted previous-shape executor's metadata to the current shape, by
/// compare-and-swap on its resourceVersion: the controller owner reference goes (the garbage
/// collector could otherwise delete the Pod ahead of the provider's lifecycle under a
/// foreground cascading delete of the environment) and the allocation-uid label arrives. The
/// Pod and its UID stay; the result must validate as the current shape.
async fn move_to_current_shape(
    api: &Api<Pod>,
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    account: &str,
    pod: Pod,
) -> Result<Pod, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let mut moved = pod;
    moved.metadata.owner_references = None;
    moved.metadata.labels = Some(render::executor_labels(env));
    let moved = api
        .replace(&pod_name(&name), &PostParams::default(), &moved)
        .await
        .map_err(ReconcileError::kube(
            &name,
            "move executor Pod to the current shape",
        ))?;
    match validate_pod(env, spec, account, &moved) {
        Ok(PodShape::Current) => Ok(moved),
        Ok(PodShape::Previous) => Err(ReconcileError::mismatch(
            &name,
            "pod kept its owner reference",
        )),
        Err(what) => Err(ReconcileError::mismatch(&name, what)),
    }
}

/// Whether the Pod is not terminating and its Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the kubelet reports the Pod as finished for good: phase Succeeded or Failed, and
/// every declared container (init, regular, ephemeral) has exactly one terminated status.
pub fn pod_terminal(pod: &Pod) -> bool {
    let (Some(spec), Some(status)) = (pod.spec.as_ref(), pod.status.as_ref()) else {
        return false;
    };
    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
        || spec.containers.is_empty()
    {
        return false;
    }
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    let regular: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let ephemeral: Vec<&str> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    all_terminated(&init, status.init_container_statuses.as_deref())
        && all_terminated(&regular, status.container_statuses.as_deref())
        && all_terminated(&ephemeral, status.ephemeral_container_statuses.as_deref())
}

fn all_terminated(declared: &[&str], statuses: Option<&[ContainerStatus]>) -> bool {
    let statuses = statuses.unwrap_or_default();
    if statuses.len() != declared.len() {
        return false;
    }
    let declared: BTreeSet<&str> = declared.iter().copied().collect();
    let mut seen = BTreeSet::new();
    statuses.iter().all(|s| {
        declared.contains(s.name.as_str())
            && seen.insert(s.name.as_str())
            && s.state.as_ref().is_some_and(|st| st.terminated.is_some())
    })
}
