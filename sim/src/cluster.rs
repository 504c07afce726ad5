//! What the cluster operator provides before the provider starts (the capacity-ledger
//! ConfigMap, RuntimeClasses and StorageClasses the templates name), and the convergence
//! judgement of the liveness phase.

use std::collections::BTreeSet;

use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::crd::LABEL_ENVIRONMENT;
use execution_provider::kube::seed::seed_cluster;
use execution_provider::templates::TemplateRegistry;

use crate::invariants::Incarnation;
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

fn str_at<'a>(object: &'a serde_json::Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
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

/// A short account of an environment that is not Ready: its Ready condition's reason and
/// message, or that its status was never initialized.
fn why_not_ready(env: &serde_json::Value) -> String {
    let Some(status) = env.get("status").filter(|s| !s.is_null()) else {
        return "status never initialized".to_owned();
    };
    let ready = status
        .get("conditions")
        .and_then(|c| c.as_array())
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("type").and_then(|t| t.as_str()) == Some("Ready"))
        });
    match ready {
        Some(c) => format!(
            "Ready={} {}: {}",
            c.get("status").and_then(|s| s.as_str()).unwrap_or("?"),
            c.get("reason").and_then(|s| s.as_str()).unwrap_or(""),
            c.get("message").and_then(|s| s.as_str()).unwrap_or("")
        ),
        None => format!(
            "no Ready condition; epoch {}",
            status
                .get("epoch")
                .map(|e| e.to_string())
                .unwrap_or_default()
        ),
    }
}

/// Whether the environment's template revision is revoked (or gone) in `templates`.
fn revoked(env: &serde_json::Value, templates: &TemplateRegistry) -> bool {
    let spec = |field: &str| env["spec"][field].as_str().unwrap_or_default();
    templates
        .for_environment(
            spec("templateID"),
            spec("templateRevision"),
            spec("templateDigest"),
        )
        .is_err()
}

/// A revoked environment not yet Ready=False/InvalidTemplate, or whose executor Pod is still
/// running (not being deleted).
fn revoked_unconverged(
    env: &serde_json::Value,
    name: &str,
    pods: &[serde_json::Value],
) -> Option<String> {
    let ready = env["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let invalid = ready.is_some_and(|c| c["status"] == "False" && c["reason"] == "InvalidTemplate");
    if !invalid {
        return Some(format!(
            "revoked environment {name} not Ready=False/InvalidTemplate ({})",
            why_not_ready(env)
        ));
    }
    let running = pods.iter().any(|pod| {
        pod["metadata"]["labels"][LABEL_ENVIRONMENT] == name
            && pod["metadata"]["deletionTimestamp"].is_null()
    });
    running.then(|| format!("revoked environment {name}: its executor Pod is not stopped"))
}

/// What has not converged yet: environments that are neither Ready nor legitimately held
/// (fenced, in a lifecycle operation, deleting, or created by an ensure whose answer was lost
/// and that no client retried: the store keeps such a pending ensure, uninitialized, for the
/// client's retry), and Pods or PVCs of missing environments. `ensured` names the
/// environment incarnations some ensure was acknowledged for (an earlier incarnation's
/// acknowledged ensure says nothing of a later one under the same name). An environment whose template revision is
/// revoked in `templates` (the registry the replicas run) has converged when it is
/// Ready=False/InvalidTemplate with its executor stopped (k8s-executor §2.3).
pub fn unconverged(
    api: &ApiServer,
    ensured: &BTreeSet<Incarnation>,
    templates: &TemplateRegistry,
) -> Vec<String> {
    let envs = api.objects_of_kind("ExecutionEnvironment");
    let pods = api.objects_of_kind("Pod");
    let mut names = BTreeSet::new();
    let mut uids = BTreeSet::new();
    let mut pending = Vec::new();
    for env in &envs {
        let name = env
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_owned();
        names.insert(name.clone());
        uids.insert(str_at(env, "/metadata/uid").to_owned());
        let incarnation = Incarnation {
            name: name.clone(),
            revision: str_at(env, "/spec/revision").to_owned(),
        };
        let held = env.pointer("/status/fenceState").and_then(|f| f.as_str())
            == Some("FenceUnknown")
            || env
                .pointer("/status/lifecycleOperation")
                .is_some_and(|l| !l.is_null())
            || env.pointer("/metadata/deletionTimestamp").is_some()
            || condition_true(env, "Retired")
            || (env.pointer("/status/epoch").is_none_or(|e| e.is_null())
                && !ensured.contains(&incarnation));
        if !held && revoked(env, templates) {
            pending.extend(revoked_unconverged(env, &name, &pods));
        } else if !held && !condition_true(env, "Ready") {
            pending.push(format!(
                "environment {name} not Ready ({})",
                why_not_ready(env)
            ));
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
            // A Pod of an earlier incarnation outliving it, beside a later one of the same
            // name, is orphaned too (PVCs carry no owner reference: the workspace outlives
            // its Pods by design).
            let owner_uid = object
                .pointer("/metadata/ownerReferences/0/uid")
                .and_then(|u| u.as_str());
            if let (Some(owner), Some(uid)) = (owner, owner_uid)
                && names.contains(owner)
                && !uids.contains(uid)
            {
                pending.push(format!(
                    "orphaned {kind} of an earlier incarnation of {owner}"
                ));
            }
        }
    }
    pending
}
