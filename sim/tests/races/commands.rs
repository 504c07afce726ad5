//! A detached command whose claim ends while no replica can reach its supervisor
//! (docs/commands.md §5.2, §5.7): the client acquires a 30 s claim, starts `sleep 90` detached
//! and never renews; every replica is then partitioned from the executor node until long
//! after the claim's expiry, so neither a release nor the reconciler's command warden can end
//! the command. The supervisor's own claim deadline must: the command ends within the kill
//! bound of the claim's expiry, and the checker's "no command outlives its claim" holds. The
//! same script, built with the supervisor's deadline kill disabled (`supervisor-canary`), must
//! be caught by that checker (`sim/tests/canary.rs`).

use sim::Scenario;
use sim::invariants::CLAIM_KILL_BOUND;

use crate::support::*;

#[path = "detached_script.rs"]
pub mod script;

#[test]
fn a_claims_detached_command_is_killed_at_its_deadline_when_no_replica_can_reach_it() {
    use script::*;
    let steps = steps(3);
    for report in passes_for(Scenario::Smoke, 1..=1, WORKLOAD_SECS, &steps) {
        let lines = lines(&report);
        let detached = lines
            .iter()
            .find(|l| l.actor == HOST && l.event.starts_with(&format!("detach `{COMMAND}`")))
            .expect("the scripted start was traced");
        let command_id = detached
            .event
            .strip_prefix(&format!(
                "detach `{COMMAND}` {BINDING} via replica-0 -> ok "
            ))
            .unwrap_or_else(|| panic!("the detached start failed: {}", detached.event));
        let life = report
            .commands
            .iter()
            .find(|l| l.command_id == command_id)
            .expect("the node started the command");
        let ended = life.ended_ms.expect("the command ended") as u64;
        // The claim expires 30 s after the acquire was admitted (a little after it was sent);
        // the supervisor kills at its deadline, within the kill bound.
        let expiry = ACQUIRE_MS + CLAIM_TTL_MS;
        assert!(
            (expiry..expiry + 1_000 + CLAIM_KILL_BOUND.as_millis() as u64).contains(&ended),
            "the command ended at {ended} ms; its claim expired at about {expiry} ms"
        );
        assert!(
            ended < REPAIR_MS,
            "no replica could have ended it before {REPAIR_MS} ms"
        );
        let reacquired = lines
            .iter()
            .filter(|l| l.actor == HOST && l.event.starts_with("acquire "))
            .nth(1)
            .expect("the second acquire was traced");
        assert!(reacquired.ms >= REACQUIRE_MS, "{}", reacquired.event);
        assert!(reacquired.event.ends_with("-> ok"), "{}", reacquired.event);
    }
}
