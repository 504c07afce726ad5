//! Races on operation and claim leases: an orphaned operation fenced at its deadline keeping
//! its identity, claims expired by a clock step refused over the wire.

use sim::Scenario;
use sim::script::{Action, Scripted};

use crate::support::*;

/// Every replica crashes at once while an operation is in flight (its holder is gone for
/// good), and they come back a second later (ActiveOperationExpiryRequeuesWithoutAnotherEvent,
/// RevokedCrashExpiresOperation…, ExpiredOperationLeaseFencesWithoutClearingIdentity): the
/// operation stays, unfenced, until its 30 s lease deadline, with no event to wake a
/// reconciler; then a restarted replica fences it, keeping its identity, and it never runs
/// twice.
#[test]
fn an_operation_whose_holder_crashed_is_fenced_at_its_lease_deadline_keeping_its_identity() {
    let mut then = orphan_the_live_operation();
    then.extend((0..3).map(|i| (1_000, Action::Restart(i))));
    then.push((20_000, Action::Snapshot));
    then.push((33_000, Action::Snapshot));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::Smoke, 1..=2, 64, &script) {
        let lines = lines(&report);
        let (live_ms, id, name) = live_operation(&lines);
        let before = snapshot_of(&lines, live_ms + 20_000, &name);
        assert!(
            before.contains(&format!("fence=Healthy op={id} ")),
            "not kept, unfenced, until its deadline: {before}"
        );
        let after = snapshot_of(&lines, live_ms + 33_000, &name);
        // Fenced at the deadline, identity kept; or already recovered automatically.
        let recovered = recovered_since(before, after);
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} ")) || recovered,
            "not fenced at its deadline, or its identity lost: {after}"
        );
    }
}

/// Claims expired under the replicas (every replica's clock steps 31 s forward, past the
/// clients' 30 s claims): over mTLS, every file operation, command and renewal with a claim
/// taken before the step is refused ABORTED, until a new claim is acquired for the binding
/// (DurableRunAuthorizationOverMTLS, an expired lease over the wire). Calls answered within
/// `IN_FLIGHT_MS` of the step may have been admitted before it, and are not judged.
#[test]
fn claims_expired_by_a_clock_step_are_refused_over_the_wire_until_a_new_claim() {
    const STEP_MS: u64 = 3_000;
    const IN_FLIGHT_MS: u64 = 500;
    let script: Vec<Scripted> = (0..3)
        .map(|i| at(STEP_MS, Action::ClockStep(i, 31_000)))
        .collect();
    for report in passes_for(Scenario::Smoke, 1..=2, 8, &script) {
        let lines = lines(&report);
        let mut reacquired = std::collections::BTreeSet::new();
        let mut refused = 0;
        for line in lines.iter().filter(|l| l.ms > STEP_MS) {
            let Some((what, outcome)) = call(line) else {
                continue;
            };
            let mut words = what.split_whitespace();
            if what.starts_with("acquire ") && outcome == "ok" {
                reacquired.extend(words.nth(1).map(str::to_owned));
            } else if is_data_plane(what) && line.ms > STEP_MS + IN_FLIGHT_MS {
                let Some(binding) = words.find(|w| w.starts_with("binding-")) else {
                    continue;
                };
                if !reacquired.contains(binding) {
                    assert_eq!(outcome, "Aborted", "{} {what}", line.ms);
                    refused += 1;
                }
            }
        }
        assert!(refused > 0, "no call used an expired claim");
    }
}
