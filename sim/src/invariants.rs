//! The checker: store.md §10 invariants judged on the API server's objects after every
//! simulation step that changed them, plus history checks on what clients were told and what
//! the executor did. A violation names the invariant, the environment and what was seen.

use std::collections::{BTreeMap, BTreeSet};

use execution_provider::kube::crd::{ExecutionEnvironment, FenceState};

use crate::executor::MemExecutor;

/// What the checker remembers of one environment incarnation.
#[derive(Debug, Clone, Default)]
struct Seen {
    uid: String,
    epoch: u64,
    grant_generation: u64,
    fenced: bool,
    /// Every (claim id, epoch) an activeOperation was admitted under while its run was current.
    operation_claims: BTreeSet<(String, u64)>,
    /// Every activeOperation id seen (each is judged when it first appears).
    operations: BTreeSet<String>,
}

/// A data-plane call a client was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Acknowledged {
    /// The environment.
    pub environment: String,
    /// The claim it ran under.
    pub claim_id: String,
    /// The epoch of that claim.
    pub epoch: u64,
    /// What it was.
    pub what: String,
}

/// The invariant checker of one run.
#[derive(Debug, Default)]
pub struct Checker {
    seen: BTreeMap<String, Seen>,
    violations: Vec<String>,
    /// Object versions checked.
    pub versions_checked: u64,
}

impl Checker {
    /// Checks every environment object now stored.
    pub fn observe(&mut self, objects: &[serde_json::Value]) {
        for value in objects {
            let Ok(env) = serde_json::from_value::<ExecutionEnvironment>(value.clone()) else {
                self.violate("the stored object is not a valid ExecutionEnvironment".into());
                continue;
            };
            self.versions_checked += 1;
            self.observe_one(&env);
        }
    }

    fn violate(&mut self, what: String) {
        if !self.violations.contains(&what) {
            self.violations.push(what);
        }
    }

    fn observe_one(&mut self, env: &ExecutionEnvironment) {
        let name = env.metadata.name.clone().unwrap_or_default();
        let uid = env.metadata.uid.clone().unwrap_or_default();
        let status = env.status.clone().unwrap_or_default();
        let epoch = status.epoch.unwrap_or(0);
        let grant_generation = status.grant_generation.unwrap_or(0);
        let fenced = status.fence_state == Some(FenceState::FenceUnknown);
        let previous = self.seen.get(&name).filter(|s| s.uid == uid).cloned();
        let mut found = Vec::new();
        if let Some(before) = &previous {
            if epoch < before.epoch {
                found.push(format!(
                    "§10.8 epoch decreased on {name}: {} -> {epoch}",
                    before.epoch
                ));
            }
            if grant_generation < before.grant_generation {
                found.push(format!(
                    "§10.9 grantGeneration decreased on {name}: {} -> {grant_generation}",
                    before.grant_generation
                ));
            }
            if before.fenced && !fenced {
                found.push(format!(
                    "§10.15 {name} left FenceUnknown without RecoverEnvironment"
                ));
            }
        }
        if let Some(run) = &status.active_run
            && run.epoch != epoch
        {
            found.push(format!(
                "§10.10 {name}: activeRun epoch {} differs from status epoch {epoch}",
                run.epoch
            ));
        }
        let mut operation_claims = previous
            .as_ref()
            .map(|s| s.operation_claims.clone())
            .unwrap_or_default();
        let mut operations = previous
            .as_ref()
            .map(|s| s.operations.clone())
            .unwrap_or_default();
        // An operation is judged when it first appears (its admission): later, revocation or
        // a fence may legitimately end the run while the operation stays on record.
        let admitted = status
            .active_operation
            .as_ref()
            .filter(|op| operations.insert(op.id.clone()));
        if let Some(op) = admitted {
            let run_matches = status.active_run.as_ref().is_some_and(|run| {
                run.claim_id == op.claim_id && run.run_id == op.run_id && run.epoch == op.epoch
            });
            if !run_matches || op.epoch != epoch {
                found.push(format!(
                    "§10.13 {name}: activeOperation {} admitted under claim {} epoch {} while the current claim is {:?} at epoch {epoch}",
                    op.operation,
                    op.claim_id,
                    op.epoch,
                    status.active_run.as_ref().map(|r| r.claim_id.clone()),
                ));
            } else {
                operation_claims.insert((op.claim_id.clone(), op.epoch));
            }
        }
        let mut bindings = BTreeSet::new();
        for reference in &status.references {
            if !bindings.insert(reference.binding_id.clone()) {
                found.push(format!(
                    "§10.23 {name}: reference {} recorded twice",
                    reference.binding_id
                ));
            }
        }
        if status.references.len() > 64 {
            found.push(format!("§10.23 {name}: more than 64 references"));
        }
        for what in found {
            self.violate(what);
        }
        self.seen.insert(
            name,
            Seen {
                uid,
                epoch,
                grant_generation,
                fenced,
                operation_claims,
                operations,
            },
        );
    }

    /// History checks at the end: every acknowledged data-plane call ran under a claim that was
    /// current when its operation was admitted; the executor ran no command twice; every
    /// acknowledged ensure still exists.
    pub fn finish(
        &mut self,
        acknowledged: &[Acknowledged],
        ensured: &BTreeSet<String>,
        executor: &MemExecutor,
        objects: &[serde_json::Value],
    ) {
        for ack in acknowledged {
            let admitted = self.seen.get(&ack.environment).is_some_and(|s| {
                s.operation_claims
                    .contains(&(ack.claim_id.clone(), ack.epoch))
            });
            if !admitted {
                self.violate(format!(
                    "no dispatch without a current claim: {} on {} was acknowledged under claim {} epoch {} that never held its operation",
                    ack.what, ack.environment, ack.claim_id, ack.epoch
                ));
            }
        }
        for command in executor.duplicate_commands() {
            self.violate(format!("command {command} was executed more than once"));
        }
        let present: BTreeSet<String> = objects
            .iter()
            .filter_map(|o| o.pointer("/metadata/name")?.as_str().map(str::to_owned))
            .collect();
        for env in ensured {
            if !present.contains(env) {
                self.violate(format!("acknowledged ensure of {env} was lost"));
            }
        }
    }

    /// Every violation found so far, in the order found.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }
}
