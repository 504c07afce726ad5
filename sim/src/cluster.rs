//! What the cluster operator provides before the provider starts (the capacity-ledger
//! ConfigMap, RuntimeClasses and StorageClasses the templates name), and the convergence
//! judgement of the liveness phase.

use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::crd::LABEL_ENVIRONMENT;
use execution_provider::kube::seed::seed_cluster;
use execution_provider::templates::TemplateRegistry;

use crate::world::NAMESPACE;

/// Creates the cluster objects the provider expects (idempotent: the API server host may
/// restart).
pub async fn seed(kube: &kube::Client, templates: &TemplateRegistry) -> Result<(), kube::Error> {
    seed_cluster(
        kube,
        NAMESPACE,
        templates,
        "sim.execution.mecatl.dev/memory",
    )
    .await
}

fn condition_true(env: &serde_json::Value, kind: &str) -> bool {
    env.pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(|t| t.as_str()) == Some(kind)
                    && c.get("status").and_then(|s| s.as_str()) == Some("True")
            })
        })
}

/// What has not converged yet: environments that are neither Ready nor legitimately held
/// (fenced, in a lifecycle operation, deleting), and Pods or PVCs of missing environments.
pub fn unconverged(api: &ApiServer) -> Vec<String> {
    let envs = api.objects_of_kind("ExecutionEnvironment");
    let mut names = std::collections::BTreeSet::new();
    let mut pending = Vec::new();
    for env in &envs {
        let name = env
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_owned();
        names.insert(name.clone());
        let held = env.pointer("/status/fenceState").and_then(|f| f.as_str())
            == Some("FenceUnknown")
            || env
                .pointer("/status/lifecycleOperation")
                .is_some_and(|l| !l.is_null())
            || env.pointer("/metadata/deletionTimestamp").is_some()
            || condition_true(env, "Retired");
        if !held && !condition_true(env, "Ready") {
            pending.push(format!("environment {name} not Ready"));
        }
    }
    for kind in ["Pod", "PersistentVolumeClaim"] {
        for object in api.objects_of_kind(kind) {
            let owner = object
                .pointer("/metadata/labels")
                .and_then(|l| l.get(LABEL_ENVIRONMENT))
                .and_then(|v| v.as_str());
            if let Some(owner) = owner
                && !names.contains(owner)
            {
                pending.push(format!("orphaned {kind} of {owner}"));
            }
        }
    }
    pending
}
