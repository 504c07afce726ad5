//! The end-of-run checks on the history of what clients were told: every acknowledged
//! data-plane call ran under a claim that held its operation (§10.13); none was honoured under
//! a grant generation that an acknowledged revocation had already ended (§10.29); the executor
//! ran no command twice (at most once); every acknowledged ensure still exists; and no
//! definitively refused request left its operation id in the store (§10.6).
//!
//! Every history is kept per incarnation: an environment retired, deleted and ensured again
//! under the same name is a new object (new UID, new revision) whose epochs and grant
//! generations start afresh, so nothing recorded of one incarnation is judged against another.

use std::collections::BTreeSet;

use execution_provider::api::pb;

use crate::executor::MemExecutor;

use super::Checker;

/// One incarnation of an environment as the provider names it to clients: its name and the
/// revision drawn when it was created. The checker maps it to the UID of the object it saw
/// written with that name and revision.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Incarnation {
    /// The environment's name (its id on the wire).
    pub name: String,
    /// Its revision (`spec.revision`).
    pub revision: String,
}

impl Incarnation {
    /// The incarnation an `EnvironmentRef` names.
    pub fn of(env: &pb::EnvironmentRef) -> Self {
        Self {
            name: env.id.clone(),
            revision: env.revision.clone(),
        }
    }
}

impl std::fmt::Display for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (revision {})", self.name, self.revision)
    }
}

/// A data-plane call a client was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Acknowledged {
    /// The environment incarnation.
    pub environment: Incarnation,
    /// The claim it ran under.
    pub claim_id: String,
    /// The epoch of that claim.
    pub epoch: u64,
    /// The grant generation of that claim.
    pub grant_generation: u64,
    /// Simulated milliseconds when the call was sent.
    pub sent_ms: u128,
    /// What it was.
    pub what: String,
}

impl Acknowledged {
    /// A call sent at `sent_ms` under `claim`, described as `what`.
    pub fn under(claim: &pb::RunClaimResponse, sent_ms: u128, what: String) -> Self {
        Self {
            environment: claim
                .environment
                .as_ref()
                .map(Incarnation::of)
                .unwrap_or_else(|| Incarnation {
                    name: String::new(),
                    revision: String::new(),
                }),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            grant_generation: claim.grant_generation,
            sent_ms,
            what,
        }
    }
}

/// A revocation a client was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Revoked {
    /// The environment incarnation.
    pub environment: Incarnation,
    /// The generation it moved to.
    pub grant_generation: u64,
    /// Simulated milliseconds when the answer arrived.
    pub answered_ms: u128,
}

/// What the clients recorded, for the end-of-run checks.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Acknowledged data-plane calls.
    pub acknowledged: Vec<Acknowledged>,
    /// Acknowledged revocations.
    pub revoked: Vec<Revoked>,
    /// Environment incarnations some ensure was acknowledged for.
    pub ensured: BTreeSet<Incarnation>,
    /// Operation ids of requests refused with a definitive code (nothing may be written).
    pub refused: BTreeSet<String>,
    /// Environment incarnations whose DeleteRetiredEnvironment was acknowledged.
    pub deleted: BTreeSet<Incarnation>,
}

impl Checker {
    /// The history checks; `objects` are the environments stored at the end.
    pub fn finish(
        &mut self,
        history: &History,
        executor: &MemExecutor,
        objects: &[serde_json::Value],
    ) {
        let mut found = Vec::new();
        for ack in &history.acknowledged {
            let uid = self.uid_of(&ack.environment);
            let claim = (ack.claim_id.clone(), ack.epoch, ack.grant_generation);
            if !uid.is_some_and(|uid| self.admitted_under(uid).contains(&claim)) {
                found.push(format!(
                    "§10.13 no dispatch without a current claim: {} on {} was acknowledged under claim {} epoch {} generation {} that never held its operation",
                    ack.what, ack.environment, ack.claim_id, ack.epoch, ack.grant_generation
                ));
            }
            let revoked_before = history.revoked.iter().find(|r| {
                uid.is_some()
                    && self.uid_of(&r.environment) == uid
                    && r.grant_generation > ack.grant_generation
                    && r.answered_ms < ack.sent_ms
            });
            if let Some(revoked) = revoked_before {
                found.push(format!(
                    "§10.29 {} on {} sent at {} ms under generation {} succeeded after a revocation to generation {} was acknowledged at {} ms",
                    ack.what,
                    ack.environment,
                    ack.sent_ms,
                    ack.grant_generation,
                    revoked.grant_generation,
                    revoked.answered_ms
                ));
            }
        }
        for command in executor.duplicate_commands() {
            found.push(format!("command {command} was executed more than once"));
        }
        let present: BTreeSet<&str> = objects
            .iter()
            .filter_map(|o| o.pointer("/metadata/uid")?.as_str())
            .collect();
        let deleted: BTreeSet<&str> = history
            .deleted
            .iter()
            .filter_map(|d| self.uid_of(d))
            .collect();
        for env in &history.ensured {
            let kept = self
                .uid_of(env)
                .is_some_and(|uid| present.contains(uid) || deleted.contains(uid));
            if !kept {
                found.push(format!("acknowledged ensure of {env} was lost"));
            }
        }
        let leaked: Vec<String> = history
            .refused
            .intersection(&self.written_operations)
            .cloned()
            .collect();
        for operation in leaked {
            found.push(format!(
                "§10.6 the refused request {operation} wrote durable state"
            ));
        }
        self.violate_all(found);
    }
}
