//! `ensurePVC` (k8s-executor §2.4): the retained workspace PVC, created once and adopted only
//! when it has exactly the expected labels and immutable specification. A recorded PVC that
//! vanished is never re-created.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::api::{Api, PostParams};

use super::Context;
use super::error::ReconcileError;
use super::render;
use crate::kube::crd::{ExecutionEnvironment, pvc_name};
use crate::templates::{ExecutionSpec, Quantity};

const MISMATCH: &str = "PVC ownership or immutable specification mismatch";

/// The environment's workspace PVC: read, or created when it never existed, then validated.
pub async fn ensure_pvc(
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    ctx: &Context,
) -> Result<PersistentVolumeClaim, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let recorded = env.status.as_ref().and_then(|s| s.pvc.as_ref());
    let pvc = match api
        .get_opt(&pvc_name(&name))
        .await
        .map_err(ReconcileError::kube(&name, "read PVC"))?
    {
        Some(pvc) => pvc,
        None if recorded.is_some() => {
            return Err(ReconcileError::mismatch(
                &name,
                "authoritative PVC disappeared; replacement is forbidden",
            ));
        }
        None => match api
            .create(&PostParams::default(), &render::workspace_pvc(env, spec))
            .await
        {
            Ok(pvc) => pvc,
            Err(kube::Error::Api(s)) if s.code == 409 => api
                .get(&pvc_name(&name))
                .await
                .map_err(ReconcileError::kube(&name, "read PVC"))?,
            Err(e) => return Err(ReconcileError::kube(&name, "create PVC")(e)),
        },
    };
    validate_pvc(env, spec, &pvc)
        .map_err(|what| ReconcileError::mismatch(&name, format!("{MISMATCH}: {what}")))?;
    Ok(pvc)
}

/// Whether `pvc` is exactly the environment's workspace; the error names the first mismatch.
pub fn validate_pvc(
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    pvc: &PersistentVolumeClaim,
) -> Result<(), &'static str> {
    let expected = render::workspace_pvc(env, spec);
    if pvc.metadata.labels != expected.metadata.labels {
        return Err("labels differ");
    }
    if pvc
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty())
    {
        return Err("has owner references");
    }
    let recorded = env.status.as_ref().and_then(|s| s.pvc.as_ref());
    if recorded.is_some_and(|r| Some(&r.uid) != pvc.metadata.uid.as_ref()) {
        return Err("UID differs from the recorded one");
    }
    let Some(pvc_spec) = pvc.spec.as_ref() else {
        return Err("no spec");
    };
    if pvc_spec.storage_class_name.as_deref() != Some(spec.storage_class()) {
        return Err("storage class differs");
    }
    if pvc_spec.access_modes.as_deref() != Some(&["ReadWriteOnce".to_owned()][..]) {
        return Err("access modes are not exactly ReadWriteOnce");
    }
    if pvc_spec.volume_mode.as_deref() != Some("Filesystem") {
        return Err("volume mode is not Filesystem");
    }
    let requested = pvc_spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    if !requested.is_some_and(|q| same_quantity(q, spec.storage_size())) {
        return Err("storage request differs");
    }
    Ok(())
}

/// Whether a Kubernetes quantity has the template quantity's value (DECISIONS 14).
pub fn same_quantity(actual: &K8sQuantity, expected: &Quantity) -> bool {
    Quantity::parse(&actual.0).is_ok_and(|q| q.nano_units() == expected.nano_units())
}
