//! `stopRevokedExecutor` (k8s-executor §2.3): when an environment's template revision is
//! revoked, removed or redefined, its executor Pod is stopped (grace 0, UID precondition). The
//! PVC is never touched, and the Pod keeps its termination finalizer until an admin lifecycle
//! operation proves it terminal.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};

use super::Context;
use super::error::ReconcileError;
use super::pod::pod_terminal;
use crate::kube::crd::{ExecutionEnvironment, LABEL_ALLOCATION_UID, pod_name};

/// Stops the environment's executor if it is verifiably this environment's.
pub async fn stop_revoked_executor(
    env: &ExecutionEnvironment,
    ctx: &Context,
) -> Result<(), ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let recorded = env.status.as_ref().and_then(|s| s.pod.as_ref());
    let target = recorded
        .map(|p| p.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| pod_name(&name));
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let Some(pod) = api
        .get_opt(&target)
        .await
        .map_err(ReconcileError::kube(&name, "read revoked executor"))?
    else {
        return Ok(());
    };
    let env_uid = env.metadata.uid.clone().unwrap_or_default();
    // The allocation-uid label (current shape) or the controller owner reference (previous
    // shape) names the environment the Pod belongs to.
    let labelled_uid = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ALLOCATION_UID))
        .map(String::as_str);
    let controller_uid = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str());
    let owner_uid = labelled_uid.or(controller_uid);
    let verified = !env_uid.is_empty()
        && owner_uid == Some(env_uid.as_str())
        && controller_uid.is_none_or(|uid| uid == env_uid)
        && recorded.is_none_or(|r| Some(&r.uid) == pod.metadata.uid.as_ref());
    if !verified {
        return Err(ReconcileError::mismatch(
            &name,
            "revoked executor identity cannot be verified",
        ));
    }
    if pod_terminal(&pod) || pod.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&target, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ReconcileError::kube(&name, "stop revoked executor")(e)),
    }
}
