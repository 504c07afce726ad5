//! The enqueue rules of k8s-executor §2.2: which watch events put which environment on the
//! work queue.
//!
//! * An environment is reconciled when it first appears, and afterwards only when something a
//!   decision depends on changed: its generation, deletionTimestamp, finalizers, `spec`, or the
//!   status subtrees `activeOperation`, `lifecycleOperation`, `references` and `fenceState`,
//!   and the set of claims that own open command leases (so that a claim's first detached
//!   command puts the environment under the command warden's eye, docs/commands.md §5.5).
//!   What the reconciler itself writes (`status.pod`, `status.pvc`, conditions, the epoch, the
//!   observed generation) does not enqueue on its own, so its own writes never loop back.
//! * A labelled Pod or PVC event (add, update, delete) enqueues the environment its
//!   `execution.mecatl.dev/environment` label names, when the label is non-empty.
//! * A deleted environment enqueues nothing.
//!
//! The environment rule is a fingerprint ([`trigger_fingerprint`]) of exactly those fields:
//! the watch stream passes an event on only when the fingerprint of the object changed.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::kube::crd::{ExecutionEnvironment, LABEL_ENVIRONMENT};

/// The fields of an environment whose change enqueues it, as one JSON value.
pub fn trigger_view(env: &ExecutionEnvironment) -> Value {
    let status = env.status.as_ref();
    let part = |value: Option<Value>| value.unwrap_or(Value::Null);
    json!({
        "generation": env.metadata.generation,
        "deletionTimestamp": env.metadata.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        "finalizers": env.metadata.finalizers.clone().unwrap_or_default(),
        "spec": serde_json::to_value(&env.spec).unwrap_or(Value::Null),
        "activeOperation": part(status.and_then(|s| s.active_operation.as_ref())
            .and_then(|o| serde_json::to_value(o).ok())),
        "lifecycleOperation": part(status.and_then(|s| s.lifecycle_operation.as_ref())
            .and_then(|o| serde_json::to_value(o).ok())),
        "references": part(status.and_then(|s| serde_json::to_value(&s.references).ok())),
        "fenceState": part(status.and_then(|s| s.fence_state.as_ref())
            .and_then(|f| serde_json::to_value(f).ok())),
        "commandClaims": crate::store::command_leases::open_claims(env),
    })
}

/// A stable 64-bit fingerprint of [`trigger_view`] (the first 8 bytes of its SHA-256).
pub fn trigger_fingerprint(env: &ExecutionEnvironment) -> u64 {
    let text = trigger_view(env).to_string();
    let digest = Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// Whether an update from `old` to `new` enqueues the environment.
pub fn update_enqueues(old: &ExecutionEnvironment, new: &ExecutionEnvironment) -> bool {
    trigger_view(old) != trigger_view(new)
}

/// The environment a labelled Pod or PVC belongs to: its non-empty environment label.
pub fn environment_of(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels
        .and_then(|l| l.get(LABEL_ENVIRONMENT))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}
