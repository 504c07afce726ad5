//! The end-of-run checks on the history of what clients were told: every acknowledged
//! data-plane call ran under a claim that held its operation (§10.13); none was honoured under
//! a grant generation that an acknowledged revocation had already ended (§10.29); the executor
//! ran no command twice (at most once); every acknowledged ensure still exists; and no
//! definitively refused request left its operation id in the store (§10.6).

use std::collections::BTreeSet;

use crate::executor::MemExecutor;

use super::Checker;

/// A data-plane call a client was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Acknowledged {
    /// The environment.
    pub environment: String,
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

/// A revocation a client was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Revoked {
    /// The environment.
    pub environment: String,
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
    /// Environments some ensure was acknowledged for.
    pub ensured: BTreeSet<String>,
    /// Operation ids of requests refused with a definitive code (nothing may be written).
    pub refused: BTreeSet<String>,
    /// Environments whose DeleteRetiredEnvironment was acknowledged.
    pub deleted: BTreeSet<String>,
}

impl Checker {
    /// The history checks; `objects` are the environments stored at the end.
    pub fn finish(
        &mut self,
        history: &History,
        executor: &MemExecutor,
        objects: &[serde_json::Value],
    ) {
        for ack in &history.acknowledged {
            let claim = (ack.claim_id.clone(), ack.epoch, ack.grant_generation);
            if !self.admitted_under(&ack.environment).contains(&claim) {
                self.violate(format!(
                    "§10.13 no dispatch without a current claim: {} on {} was acknowledged under claim {} epoch {} generation {} that never held its operation",
                    ack.what, ack.environment, ack.claim_id, ack.epoch, ack.grant_generation
                ));
            }
            let revoked_before = history.revoked.iter().find(|r| {
                r.environment == ack.environment
                    && r.grant_generation > ack.grant_generation
                    && r.answered_ms < ack.sent_ms
            });
            if let Some(revoked) = revoked_before {
                self.violate(format!(
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
            self.violate(format!("command {command} was executed more than once"));
        }
        let present: BTreeSet<String> = objects
            .iter()
            .filter_map(|o| o.pointer("/metadata/name")?.as_str().map(str::to_owned))
            .collect();
        for env in &history.ensured {
            if !present.contains(env) && !history.deleted.contains(env) {
                self.violate(format!("acknowledged ensure of {env} was lost"));
            }
        }
        let leaked: Vec<String> = history
            .refused
            .intersection(&self.written_operations)
            .cloned()
            .collect();
        for operation in leaked {
            self.violate(format!(
                "§10.6 the refused request {operation} wrote durable state"
            ));
        }
    }
}
