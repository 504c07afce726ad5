//! Races on the capacity ledger: an outage while a retained deletion releases its slot.

use sim::Scenario;
use sim::script::Action;

use crate::support::*;

/// A capacity ledger outage while a retained deletion releases its slot
/// (RetainedDeleteWaitsForSlotRelease, k8s-executor §2.8): once an environment is retired,
/// every write of the ledger is refused (503) for 6 s while the lifecycle race goes on and
/// retired environments are deleted. A deletion that reached ReleasingSlot does not complete
/// while the ledger is unavailable (its environment is still stored, in ReleasingSlot, and
/// still holds its slot); 6 s after the repair it has completed: the environment is gone
/// with its slot, or (its binding ensured again) a new incarnation holds a slot of its own,
/// so the old one's slot was released once; §10.21 on every version and the liveness phase
/// (no orphaned PVC or Pod) judge the rest.
#[test]
fn a_ledger_outage_holds_a_retained_deletion_in_releasing_slot_until_repaired() {
    const OUTAGE_MS: u64 = 6_000;
    const SETTLED_MS: u64 = OUTAGE_MS + 6_000;
    let then = vec![
        (0, Action::ApiOutage(LEDGER.to_owned())),
        (OUTAGE_MS - 100, Action::Snapshot),
        (OUTAGE_MS, Action::ApiRestore),
        (SETTLED_MS, Action::Snapshot),
    ];
    let script = [at(500, Action::WhenRetired(then))];
    let mut held = 0;
    for report in passes_for(Scenario::LifecycleRace, 1..=3, 32, &script) {
        let lines = lines(&report);
        let retired_ms = lines
            .iter()
            .find(|l| l.event.starts_with("retired on "))
            .map(|l| l.ms)
            .expect("the script saw a retired environment");
        let refused = lines
            .iter()
            .filter(|l| l.event.starts_with("outage 503 ") && l.event.ends_with(LEDGER))
            .count();
        assert!(refused > 0, "no ledger write was refused");
        let during = retired_ms + OUTAGE_MS - 100;
        let stuck: Vec<String> = lines
            .iter()
            .filter(|l| l.ms == during)
            .filter(|l| {
                l.event
                    .contains(" lifecycle=DeleteRetiredEnvironment/ReleasingSlot ")
            })
            .filter_map(|l| l.event.split_whitespace().nth(1).map(str::to_owned))
            .collect();
        let settled = retired_ms + SETTLED_MS;
        for ms in [during, settled] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.ms == ms && l.event.starts_with("snapshot ledger ")),
                "no snapshot of the ledger at {ms} ms (the workload ended before it?)"
            );
        }
        for name in &stuck {
            assert!(
                in_ledger(&lines, during, name),
                "{name} lost its slot while the ledger was unavailable"
            );
            let prefix = format!("snapshot {name} ");
            match lines
                .iter()
                .find(|l| l.ms == settled && l.event.starts_with(&prefix))
            {
                None => assert!(
                    !in_ledger(&lines, settled, name),
                    "{name} was deleted but kept its slot"
                ),
                // Deleted, then ensured again by its binding: a new incarnation, which must
                // hold its own slot (a second release of the old one would have taken it).
                Some(line) => {
                    assert!(
                        !line.event.contains("lifecycle=DeleteRetiredEnvironment/"),
                        "{name}'s deletion never completed after the repair: {}",
                        line.event
                    );
                    assert!(
                        in_ledger(&lines, settled, name),
                        "{name} was created again without a slot (released twice?)"
                    );
                }
            }
        }
        held += stuck.len();
    }
    assert!(
        held > 0,
        "no deletion reached ReleasingSlot during the outage"
    );
}
