//! The invariants the runtime objects show: §10.21 capacity (the ledger never holds more than
//! the template's limit, a CR is created only after its slot is reserved, and the ledger
//! together with the live CRs never exceeds the limit), §10.26 (an executor Pod loses its
//! termination finalizer only after the proof of its termination is stored) and §10.27 (a
//! workspace PVC is deleted only by an admitted DeleteRetiredEnvironment).

use std::collections::{BTreeMap, BTreeSet};

use execution_provider::kube::crd::{
    EXECUTOR_FINALIZER, ExecutionEnvironmentStatus, LABEL_ENVIRONMENT, LEDGER_CONFIGMAP_NAME,
    LEDGER_SHARDS, LifecyclePhase, LifecycleType, ledger_key, ledger_shard_name,
};
use execution_provider::security::manager::DEFAULT_AUTHORITY_CONFIGMAP;
use execution_provider::store::ledger::ShardEntry;
use serde_json::Value;

use super::environment::Seen;

/// What the runtime checks remember.
#[derive(Debug, Default)]
pub(super) struct Runtime {
    /// Capacity limit by ledger key, and the template id of that key.
    limits: BTreeMap<String, (String, u32)>,
    /// Each ledger ConfigMap (root and shards) as last written, by name.
    ledger: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Whether each Pod (by UID) last carried the termination finalizer.
    pod_finalizer: BTreeMap<String, bool>,
    /// The security authority ledger as last written: generation and digest.
    authority: Option<(u64, String)>,
}

fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object.pointer("/metadata/labels")?.get(key)?.as_str()
}

/// The UID of the environment incarnation that owns a Pod or PVC (its controller owner
/// reference): objects are judged against their own incarnation, never a later one of the
/// same name.
fn owner_uid(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o["kind"] == "ExecutionEnvironment")?
        .get("uid")?
        .as_str()
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
}

/// Whether `name` is one of the capacity ledger's ConfigMaps (the root or a shard).
fn is_ledger(name: &str) -> bool {
    name == LEDGER_CONFIGMAP_NAME
        || (1..LEDGER_SHARDS).any(|index| name == ledger_shard_name(index))
}

/// The names holding a slot, by template key (the `.json` key of [`ledger_key`]), in one
/// ledger ConfigMap: arrays of the format before sharding and the slots of shard entries
/// (not their overflow marks). Unreadable entries hold nothing.
pub(crate) fn ledger_entries(configmap: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let Some(data) = configmap.get("data").and_then(|d| d.as_object()) else {
        return BTreeMap::new();
    };
    let mut entries: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (key, text) in data {
        let text = text.as_str();
        let (key, names): (String, BTreeSet<String>) = match key.strip_suffix(".slots") {
            Some(stem) => (
                format!("{stem}.json"),
                ShardEntry::decode(text)
                    .map(|e| e.slots.into_keys().collect())
                    .unwrap_or_default(),
            ),
            None => (
                key.clone(),
                text.and_then(|t| serde_json::from_str::<Vec<String>>(t).ok())
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
            ),
        };
        entries.entry(key).or_default().extend(names);
    }
    entries
}

/// The union of the entries of several ledger ConfigMaps.
fn union<'a>(
    maps: impl IntoIterator<Item = &'a BTreeMap<String, BTreeSet<String>>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for map in maps {
        for (key, names) in map {
            all.entry(key.clone())
                .or_default()
                .extend(names.iter().cloned());
        }
    }
    all
}

/// An environment whose create landed after its own deadline: void, it holds no slot
/// (store `ledger::proof`).
fn landed_late(env: &Value) -> bool {
    let seconds = |pointer: &str| {
        env.pointer(pointer)
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_second())
    };
    match (
        seconds("/spec/createDeadline"),
        seconds("/metadata/creationTimestamp"),
    ) {
        (Some(deadline), Some(created)) => created > deadline,
        _ => false,
    }
}

fn condition_true(env: &Value, kind: &str) -> bool {
    env.pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"].as_str() == Some(kind) && c["status"].as_str() == Some("True"))
        })
}

/// Retired, executor terminated and releasing its slot: no longer counted (spec §2.5).
fn deallocating(env: &Value) -> bool {
    condition_true(env, "Retired")
        && condition_true(env, "ExecutorTerminated")
        && env
            .pointer("/status/lifecycleOperation/type")
            .and_then(|t| t.as_str())
            == Some("DeleteRetiredEnvironment")
        && env
            .pointer("/status/lifecycleOperation/phase")
            .and_then(|t| t.as_str())
            == Some("ReleasingSlot")
}

impl Runtime {
    /// Checks against these capacity limits by template id.
    pub(super) fn new(limits: &BTreeMap<String, u32>) -> Self {
        Self {
            limits: limits
                .iter()
                .map(|(id, limit)| (ledger_key(id), (id.clone(), *limit)))
                .collect(),
            ..Self::default()
        }
    }

    /// A committed write of a ConfigMap: the capacity ledger or the security authority
    /// ledger.
    pub(super) fn configmap_written(&mut self, object: &Value, found: &mut Vec<String>) {
        match str_at(object, "/metadata/name") {
            DEFAULT_AUTHORITY_CONFIGMAP => self.authority_written(object, found),
            name if is_ledger(name) => self.ledger_written(object, found),
            _ => {}
        }
    }

    /// api-security §6.5: the authority ledger never moves to a lower generation (rollback)
    /// nor to other content under the same generation (drift).
    fn authority_written(&mut self, object: &Value, found: &mut Vec<String>) {
        let state = object
            .pointer("/data/state.json")
            .and_then(|s| s.as_str())
            .and_then(|s| serde_json::from_str::<Value>(s).ok());
        let Some(state) = state else {
            found.push("the security authority ledger was written unreadable".to_owned());
            return;
        };
        let generation = state["generation"].as_u64().unwrap_or(0);
        let digest = state["digest"].as_str().unwrap_or_default().to_owned();
        if let Some((last, last_digest)) = &self.authority {
            if generation < *last {
                found.push(format!(
                    "security: the authority ledger rolled back from generation {last} to {generation}"
                ));
            } else if generation == *last && digest != *last_digest {
                found.push(format!(
                    "security: the authority ledger drifted within generation {generation}"
                ));
            }
        }
        self.authority = Some((generation, digest));
    }

    fn ledger_written(&mut self, object: &Value, found: &mut Vec<String>) {
        let name = str_at(object, "/metadata/name").to_owned();
        self.ledger.insert(name, ledger_entries(object));
        for (key, names) in &union(self.ledger.values()) {
            if let Some((template, limit)) = self.limits.get(key)
                && names.len() > *limit as usize
            {
                found.push(format!(
                    "§10.21 the capacity ledger of template {template} holds {} environments, over its limit {limit}",
                    names.len()
                ));
            }
        }
    }

    /// A committed create of an environment: its slot must already be reserved (unless it
    /// landed after its deadline: void, it holds nothing and is removed).
    pub(super) fn environment_created(&self, object: &Value, found: &mut Vec<String>) {
        if landed_late(object) {
            return;
        }
        let name = str_at(object, "/metadata/name");
        let template = str_at(object, "/spec/templateID");
        let reserved = union(self.ledger.values())
            .get(&ledger_key(template))
            .is_some_and(|names| names.contains(name));
        if !reserved {
            found.push(format!(
                "§10.21 {name} was created before its capacity slot was reserved"
            ));
        }
    }

    /// A committed write of a Pod: losing the termination finalizer needs a stored proof.
    pub(super) fn pod_written(
        &mut self,
        object: &Value,
        envs: &BTreeMap<String, Seen>,
        found: &mut Vec<String>,
    ) {
        let uid = str_at(object, "/metadata/uid").to_owned();
        let has = object
            .pointer("/metadata/finalizers")
            .and_then(|f| f.as_array())
            .is_some_and(|f| f.iter().any(|f| f.as_str() == Some(EXECUTOR_FINALIZER)));
        let had = self.pod_finalizer.insert(uid.clone(), has);
        if had != Some(true) || has {
            return;
        }
        let env = label(object, LABEL_ENVIRONMENT).unwrap_or_default();
        let Some(seen) = owner_uid(object).and_then(|owner| envs.get(owner)) else {
            return;
        };
        let proven = seen
            .status
            .termination_proof
            .as_ref()
            .is_some_and(|p| p.pod_uid == uid);
        if !proven {
            found.push(format!(
                "§10.26 the termination finalizer of Pod {uid} of {env} was removed before its termination proof was stored"
            ));
        }
    }

    /// A committed delete of a PVC: only an admitted DeleteRetiredEnvironment of exactly
    /// that PVC deletes it.
    pub(super) fn pvc_deleted(
        &self,
        path: &str,
        object: &Value,
        envs: &BTreeMap<String, Seen>,
        found: &mut Vec<String>,
    ) {
        let name = path.rsplit('/').next().unwrap_or_default();
        let uid = object
            .pointer("/metadata/uid")
            .and_then(|u| u.as_str())
            .map(str::to_owned);
        // The incarnation that owns this very PVC is the one whose status recorded its UID
        // (several incarnations of one name share the PVC name); when none did (or the delete
        // was answered without the object), every incarnation of that PVC name is asked.
        let named = |s: &&Seen| s.status.pvc.as_ref().is_some_and(|p| p.name == name);
        let mut owners: Vec<&Seen> = envs
            .values()
            .filter(named)
            .filter(|s| s.status.pvc.as_ref().map(|p| &p.uid) == uid.as_ref())
            .collect();
        if owners.is_empty() {
            owners = envs.values().filter(named).collect();
        }
        if owners.is_empty() {
            return;
        }
        let admitted = owners
            .iter()
            .any(|seen| admitted_pvc_delete(&seen.status, uid.as_deref()));
        if !admitted {
            let env = label(object, LABEL_ENVIRONMENT).unwrap_or(name);
            found.push(format!(
                "§10.27 the workspace PVC {name} of {env} was deleted without an admitted DeleteRetiredEnvironment"
            ));
        }
    }

    /// Checks the stored state at one instant: the ledger together with the live
    /// environments never exceeds a template's limit.
    pub(super) fn capacity(&self, envs: &[Value], configmaps: &[Value], found: &mut Vec<String>) {
        let maps: Vec<_> = configmaps
            .iter()
            .filter(|c| is_ledger(str_at(c, "/metadata/name")))
            .map(ledger_entries)
            .collect();
        let ledger = union(&maps);
        for (key, (template, limit)) in &self.limits {
            let mut counted = ledger.get(key).cloned().unwrap_or_default();
            counted.extend(
                envs.iter()
                    .filter(|e| {
                        str_at(e, "/spec/templateID") == template
                            && !deallocating(e)
                            && !landed_late(e)
                    })
                    .map(|e| str_at(e, "/metadata/name").to_owned()),
            );
            if counted.len() > *limit as usize {
                found.push(format!(
                    "§10.21 template {template} has {} environments (ledger and live), over its limit {limit}",
                    counted.len()
                ));
            }
        }
    }
}

fn admitted_pvc_delete(status: &ExecutionEnvironmentStatus, uid: Option<&str>) -> bool {
    status.lifecycle_operation.as_ref().is_some_and(|op| {
        op.type_ == LifecycleType::DeleteRetiredEnvironment
            && op.phase == LifecyclePhase::DeletingPvc
            && uid.is_none_or(|uid| op.expected_pvc_uid.as_deref() == Some(uid))
    })
}
