//! The supervisor's promise, judged at the end of a run (docs/commands.md §5.2, §5.7): no
//! command outlives its claim. A claim's end is the latest expiry any committed write gave it
//! (an acquisition or renewal whose answer was lost still counts: its status write may have
//! reached the supervisor as a renewal); release and revocation end a claim earlier only when
//! a replica reaches the supervisor, so the promise that holds whatever fails is the expiry's.
//! Every command must have ended by that end plus [`CLAIM_KILL_BOUND`] and the run's slack:
//! how far a replica's clock strayed from true time (the lease it forwards is measured on it)
//! and how long the network held a message (a renewal delivered late extends the supervisor's
//! deadline by its transit). A command still running when the run ends is judged at the end.

use std::time::Duration;
#[cfg(test)]
use std::time::SystemTime;

use execution_provider::kube::crd::ExecutionEnvironmentStatus as EnvironmentStatus;

use crate::clock::sim_epoch;
use crate::supervision::CommandLife;

use super::Checker;

/// How long the supervisor's kill of an expired claim's commands may take: the kill grace
/// plus the sweep window (docs/commands.md §5.2).
pub const CLAIM_KILL_BOUND: Duration = Duration::from_secs(4);

/// What a run adds to a claim's end before a command still running is a violation.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandSlack {
    /// The largest distance of any replica's clock from true time during the run.
    pub clock: Duration,
    /// The longest a message could be held in the network.
    pub network: Duration,
}

impl Checker {
    /// Notes the expiry a written status gives its claim.
    pub(super) fn note_claim_expiry(&mut self, status: &EnvironmentStatus) {
        let Some(run) = &status.active_run else {
            return;
        };
        let expires = run.expires_at.to_system_time();
        let since_epoch = expires
            .duration_since(sim_epoch())
            .unwrap_or(Duration::ZERO)
            .as_millis();
        let end = self.claim_ends.entry(run.claim_id.clone()).or_default();
        *end = (*end).max(since_epoch);
    }

    /// Judges every command's life against its claim's end; `run_end_ms` is when the run
    /// ended (simulated milliseconds).
    pub fn judge_command_lives(
        &mut self,
        lives: &[CommandLife],
        slack: CommandSlack,
        run_end_ms: u128,
    ) {
        let allowed = (CLAIM_KILL_BOUND + slack.clock + slack.network).as_millis();
        let mut found = Vec::new();
        for life in lives {
            let ended = life.ended_ms.unwrap_or(run_end_ms);
            match self.claim_ends.get(&life.claim_id) {
                None => found.push(format!(
                    "§5.7 command {} ran under claim {} that no written status holds",
                    life.command_id, life.claim_id
                )),
                Some(&claim_end) if ended > claim_end + allowed => found.push(format!(
                    "§5.7 command {} outlived its claim {}: {} at {ended} ms, the claim ended at {claim_end} ms (allowed {allowed} ms more)",
                    life.command_id,
                    life.claim_id,
                    if life.ended_ms.is_some() { "ended" } else { "still running" },
                )),
                Some(_) => {}
            }
        }
        self.violate_all(found);
    }
}

/// Milliseconds since the simulation's epoch of `at` (0 before it).
#[cfg(test)]
fn sim_ms(at: SystemTime) -> u128 {
    at.duration_since(sim_epoch())
        .unwrap_or(Duration::ZERO)
        .as_millis()
}

#[cfg(test)]
mod tests {
    use execution_provider::kube::crd::{ActiveRun, RfcTime};

    use super::*;

    fn status(claim: &str, expires_ms: u64) -> EnvironmentStatus {
        let at = sim_epoch() + Duration::from_millis(expires_ms);
        assert_eq!(sim_ms(at), u128::from(expires_ms));
        EnvironmentStatus {
            active_run: Some(ActiveRun {
                binding_id: "b".into(),
                run_id: "r".into(),
                claim_id: claim.into(),
                operation_id: "o".into(),
                owner_hash: String::new(),
                client_hash: String::new(),
                epoch: 1,
                grant_generation: 1,
                expires_at: RfcTime::from_system_time(at),
            }),
            ..EnvironmentStatus::default()
        }
    }

    fn life(claim: &str, ended_ms: Option<u128>) -> CommandLife {
        CommandLife {
            node: "node-0".into(),
            command_id: "c1".into(),
            claim_id: claim.into(),
            started_ms: 0,
            ended_ms,
        }
    }

    #[test]
    fn a_command_may_run_to_its_claims_latest_expiry_plus_the_bounds_and_no_longer() {
        let slack = CommandSlack {
            clock: Duration::from_secs(1),
            network: Duration::from_secs(2),
        };
        let mut checker = Checker::default();
        checker.note_claim_expiry(&status("k", 30_000));
        checker.note_claim_expiry(&status("k", 60_000));
        // A later version with an earlier expiry does not shorten what was promised.
        checker.note_claim_expiry(&status("k", 40_000));
        checker.judge_command_lives(&[life("k", Some(67_000))], slack, 90_000);
        assert!(
            checker.violations().is_empty(),
            "{:?}",
            checker.violations()
        );
        checker.judge_command_lives(&[life("k", Some(67_001))], slack, 90_000);
        assert_eq!(checker.violations().len(), 1, "{:?}", checker.violations());
        let mut checker = Checker::default();
        checker.note_claim_expiry(&status("k", 30_000));
        checker.judge_command_lives(&[life("k", None)], slack, 37_001);
        assert!(checker.violations()[0].contains("still running"));
        checker.judge_command_lives(&[life("other", Some(1))], slack, 37_001);
        assert!(checker.violations()[1].contains("no written status holds"));
    }
}
