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

/// A node cut off for good: an operation is live; its executor node loses its network (its
/// kubelet stops reporting, every replica is cut from it) and every replica crashes. The
/// operation is fenced at its lease deadline and the automatic recovery deletes the exact Pod,
/// but no kubelet confirms its end, so the environment stays fenced with the same operation,
/// its Pod stopped but not terminal, to the end of the run. The liveness phase accepts that
/// only because the script cut the node for good: the run's time-to-recover line names the
/// environment as not judged. (Without the cut the environment recovers automatically and the
/// fence assertion trips; `tests/invariants.rs` shows the phase failing a fence elsewhere.)
#[test]
fn an_environment_whose_node_is_cut_off_for_good_stays_fenced_and_is_not_judged() {
    const LOOKED_MS: u64 = 45_000;
    let mut then = orphan_the_live_operation();
    then.push((0, Action::CutNodeForGood(0)));
    then.extend((0..3).map(|i| (1_000, Action::Restart(i))));
    then.push((LOOKED_MS, Action::Snapshot));
    then.push((LOOKED_MS, Action::SnapshotRuntime));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::Smoke, 1..=1, 75, &script) {
        let lines = lines(&report);
        let (live_ms, id, name) = live_operation(&lines);
        let after = snapshot_of(&lines, live_ms + LOOKED_MS, &name);
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} ")),
            "not fenced with its operation while its node is cut off: {after}"
        );
        let owner = format!(" env={name} ");
        let stopped = lines.iter().any(|l| {
            l.ms == live_ms + LOOKED_MS
                && l.event.starts_with("snapshot pod ")
                && l.event.contains(&owner)
                && l.event.contains(" phase=Running deleting=yes ")
        });
        assert!(stopped, "the Pod of {name} is not stopped and unconfirmed");
        assert!(
            report
                .recovery
                .contains("not judged (executor node cut off for good): ")
                && report.recovery.contains(&name),
            "{}",
            report.recovery
        );
    }
}
