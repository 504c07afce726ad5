//! The checker: store.md §10 invariants judged on every version of every object the replicas
//! wrote (`environment`: one environment version against the one before; `runtime`: Pods, PVCs
//! and the capacity ledger), on the stored state after every step, and at the end on the
//! history of what clients were told and what the executor did (`history`). A violation names
//! the invariant, the environment and what was seen.

use std::collections::{BTreeMap, BTreeSet};

use execution_provider::kube::crd::ExecutionEnvironment;

use crate::writes::Written;

mod commands;
mod environment;
mod history;
mod runtime;
pub(crate) use runtime::ledger_entries;

pub use commands::{CLAIM_KILL_BOUND, CommandSlack};
pub use history::{Acknowledged, History, Incarnation, Revoked};

/// The invariant checker of one run.
#[derive(Debug, Default)]
pub struct Checker {
    /// What was seen of each environment incarnation, by UID.
    seen: BTreeMap<String, environment::Seen>,
    /// The UID of each incarnation clients can name (name and revision).
    incarnations: BTreeMap<Incarnation, String>,
    runtime: runtime::Runtime,
    /// Every operation id some environment version recorded.
    written_operations: BTreeSet<String>,
    /// The latest expiry any written version gave each claim (simulated ms), by claim id.
    claim_ends: BTreeMap<String, u128>,
    violations: Vec<String>,
    /// Object versions checked.
    pub versions_checked: u64,
}

impl Checker {
    /// A checker for templates with these capacity limits (by template id).
    pub fn new(limits: &BTreeMap<String, u32>) -> Self {
        Self {
            runtime: runtime::Runtime::new(limits),
            ..Self::default()
        }
    }

    fn violate(&mut self, what: String) {
        if !self.violations.contains(&what) {
            self.violations.push(what);
        }
    }

    fn violate_all(&mut self, found: Vec<String>) {
        for what in found {
            self.violate(what);
        }
    }

    /// Judges every committed write, in commit order.
    pub fn observe_writes(&mut self, writes: &[Written]) {
        for written in writes {
            let mut found = Vec::new();
            match written.kind() {
                "ExecutionEnvironment" => {
                    if written.method == "POST" {
                        self.runtime
                            .environment_created(&written.object, &mut found);
                    }
                    self.environment_version(&written.object);
                }
                "ConfigMap" => self.runtime.configmap_written(&written.object, &mut found),
                "Pod" => self
                    .runtime
                    .pod_written(&written.object, &self.seen, &mut found),
                _ => {}
            }
            if written.method == "DELETE" && written.path.contains("/persistentvolumeclaims/") {
                self.runtime
                    .pvc_deleted(&written.path, &written.object, &self.seen, &mut found);
            }
            self.versions_checked += 1;
            self.violate_all(found);
        }
    }

    /// Judges the stored state at one instant (after a step that changed it).
    pub fn observe_state(&mut self, envs: &[serde_json::Value], configmaps: &[serde_json::Value]) {
        let mut found = Vec::new();
        self.runtime.capacity(envs, configmaps, &mut found);
        self.violate_all(found);
    }

    fn environment_version(&mut self, value: &serde_json::Value) {
        let Ok(env) = serde_json::from_value::<ExecutionEnvironment>(value.clone()) else {
            self.violate("a stored object is not a valid ExecutionEnvironment".into());
            return;
        };
        let name = env.metadata.name.clone().unwrap_or_default();
        let uid = env.metadata.uid.clone().unwrap_or_default();
        let incarnation = Incarnation {
            name: name.clone(),
            revision: env.spec.revision.clone(),
        };
        self.incarnations.insert(incarnation, uid.clone());
        let Some(status) = env.status else {
            return;
        };
        // Keyed by UID: a new incarnation under the same name (deleted, then ensured again)
        // has a version history of its own, and calls acknowledged on the old one are judged
        // against the old one's claims at the end.
        self.note_claim_expiry(&status);
        let seen = self.seen.entry(uid).or_default();
        let found = environment::judge(&name, &status, seen);
        self.written_operations
            .extend(environment::operation_ids(&status));
        self.violate_all(found);
    }

    /// The UID of the incarnation clients named, if any version of it was written.
    fn uid_of(&self, incarnation: &Incarnation) -> Option<&str> {
        self.incarnations.get(incarnation).map(String::as_str)
    }

    /// Every (claim id, epoch, grant generation) under which the incarnation `uid` admitted
    /// an operation.
    fn admitted_under(&self, uid: &str) -> BTreeSet<(String, u64, u64)> {
        self.seen
            .get(uid)
            .map(|s| s.operation_claims.clone())
            .unwrap_or_default()
    }

    /// Every violation found so far, in the order found.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }
}
