//! The start-up preflight (k8s-executor §2.1): every RuntimeClass and StorageClass that any
//! template revision names (deprecated and revoked included) must exist, and a RuntimeClass
//! must not carry scheduling of its own, since the template decides where executors run.
//! Preflight only reads; it creates and changes nothing.

use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;

use super::error::InitError;
use crate::templates::TemplateRegistry;

/// Checks every class the registry names, in sorted order; the first problem is the error.
pub async fn preflight(
    client: &kube::Client,
    templates: &TemplateRegistry,
) -> Result<(), InitError> {
    let resources = templates.cluster_resources();
    let runtime_classes = Api::<RuntimeClass>::all(client.clone());
    for name in &resources.runtime_classes {
        let class = runtime_classes
            .get_opt(name)
            .await
            .map_err(|e| InitError::Preflight(format!("RuntimeClass {name:?} unavailable: {e}")))?
            .ok_or_else(|| {
                InitError::Preflight(format!("RuntimeClass {name:?} unavailable: not found"))
            })?;
        if defines_scheduling(&class) {
            return Err(InitError::Preflight(format!(
                "RuntimeClass {name:?} must not define scheduling"
            )));
        }
    }
    let storage_classes = Api::<StorageClass>::all(client.clone());
    for name in &resources.storage_classes {
        storage_classes
            .get_opt(name)
            .await
            .map_err(|e| InitError::Preflight(format!("StorageClass {name:?} unavailable: {e}")))?
            .ok_or_else(|| {
                InitError::Preflight(format!("StorageClass {name:?} unavailable: not found"))
            })?;
    }
    Ok(())
}

/// Whether the RuntimeClass would add a node selector or tolerations to executor Pods.
fn defines_scheduling(class: &RuntimeClass) -> bool {
    class.scheduling.as_ref().is_some_and(|s| {
        s.node_selector.as_ref().is_some_and(|n| !n.is_empty())
            || s.tolerations.as_ref().is_some_and(|t| !t.is_empty())
    })
}
