//! Hand-driven races from the store, security and reconciler catalogues (spec/store.md §12,
//! the DS entries, api-security.md §9): turmoil's hold/release and partition controls, replica
//! crashes, clock steps and security manifest changes at fixed times or when an operation is
//! live, on top of a scenario, judged by every invariant and the liveness phase, and each by
//! the outcome its race must produce (refusal codes in the trace, the state in a snapshot).

use std::time::Duration;

use sim::script::{Action, Scripted};
use sim::{Config, Report, Scenario, replay_command, run_scripted};

const SEEDS: std::ops::RangeInclusive<u64> = 1..=3;

fn at(ms: u64, action: Action) -> Scripted {
    Scripted {
        at: Duration::from_millis(ms),
        action,
    }
}

fn hosts(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

fn passes(scenario: Scenario, script: &[Scripted]) -> Vec<Report> {
    passes_for(scenario, SEEDS, 8, script)
}

/// Runs `script` on each seed of `seeds` for `duration_secs` of workload; every run must pass
/// (invariants, history, liveness).
fn passes_for(
    scenario: Scenario,
    seeds: std::ops::RangeInclusive<u64>,
    duration_secs: u64,
    script: &[Scripted],
) -> Vec<Report> {
    seeds
        .map(|seed| {
            let config = Config {
                scenario,
                seed,
                replicas: 3,
                duration_secs,
            };
            let report = run_scripted(&config, script);
            assert!(
                report.passed(),
                "seed {seed} of {scenario} with {script:?} failed (replay the seed without the script: {})\n{:#?} {:?} {:?}",
                replay_command(&config),
                report.violations,
                report.liveness,
                report.host_error
            );
            report
        })
        .collect()
}

/// Stale observations (LifecycleStatusWritersRejectStaleObservations,
/// StaleReplacementObservationCannotOverwriteCompletion, ExpiredOperationFenceRevalidates…):
/// one replica's link to the API server is held for 8 s while the others carry on with
/// lifecycle operations, then everything it sent arrives at once.
#[test]
fn a_replica_whose_api_traffic_is_held_then_released_at_once_writes_nothing_stale() {
    let (a, b) = hosts("replica-0", "apiserver");
    let script = [
        at(1_000, Action::Hold(a.clone(), b.clone())),
        at(9_000, Action::Release(a, b)),
    ];
    for report in passes(Scenario::LifecycleRace, &script) {
        let trace = report.trace.text();
        assert!(trace.contains("script     Hold"), "{trace}");
        assert!(trace.contains("script     Release"), "{trace}");
    }
}

/// Answers held past the client's deadline (CancelledOperationStaysActiveUntilBackendStops…):
/// every replica's link to one client is held for 7 s (beyond the client's 5 s deadline), so
/// the client gives up on calls the replicas complete; nothing runs twice and every ensure or
/// dispatch the client was told about holds.
#[test]
fn answers_held_past_the_client_deadline_never_make_an_operation_run_twice() {
    let mut script = Vec::new();
    for replica in ["replica-0", "replica-1", "replica-2"] {
        let (a, b) = hosts(replica, "client-0");
        script.push(at(1_500, Action::Hold(a.clone(), b.clone())));
        script.push(at(8_500, Action::Release(a, b)));
    }
    passes(Scenario::Smoke, &script);
}

/// A replica crashes while its dispatches are in flight and the API server is cut from a
/// second one (operation lease and fencing between replicas, §8.4): the survivors and the
/// restarted replica keep every invariant and converge.
#[test]
fn a_replica_crash_during_dispatch_with_a_peer_cut_from_the_api_server_converges() {
    let (a, b) = hosts("replica-1", "apiserver");
    let script = [
        at(1_200, Action::Crash(0)),
        at(1_500, Action::Partition(a.clone(), b.clone())),
        at(4_000, Action::Restart(0)),
        at(5_000, Action::Repair(a, b)),
    ];
    passes(Scenario::Smoke, &script);
}

/// One trace line: simulated milliseconds, actor, event.
struct Line {
    ms: u64,
    actor: String,
    event: String,
}

fn lines(report: &Report) -> Vec<Line> {
    report
        .trace
        .lines()
        .iter()
        .filter_map(|line| {
            let (ms, rest) = line.trim_start().split_once(' ')?;
            let (actor, event) = rest.split_once(' ')?;
            Some(Line {
                ms: ms.parse().ok()?,
                actor: actor.to_owned(),
                event: event.trim_start().to_owned(),
            })
        })
        .collect()
}

/// A client call's outcome (`... -> OUTCOME`), with what was called.
fn call(line: &Line) -> Option<(&str, &str)> {
    if !line.actor.starts_with("client-") {
        return None;
    }
    line.event.rsplit_once(" -> ")
}

fn is_data_plane(what: &str) -> bool {
    what.starts_with("file ") || what.starts_with("command ") || what.starts_with("renew ")
}

/// The environment and operation id of the first `WHAT live ID on NAME` line and its time.
fn live(lines: &[Line], what: &str) -> (u64, String, String) {
    let prefix = format!("{what} live ");
    lines
        .iter()
        .find_map(|l| {
            let rest = l.event.strip_prefix(&prefix)?;
            let (id, name) = rest.split_once(" on ")?;
            Some((l.ms, id.to_owned(), name.to_owned()))
        })
        .unwrap_or_else(|| panic!("the script saw no live {what}"))
}

/// [`live`] for `WhenOperationLive`.
fn live_operation(lines: &[Line]) -> (u64, String, String) {
    live(lines, "operation")
}

/// The snapshot line of environment `name` taken at `ms`.
fn snapshot_of<'a>(lines: &'a [Line], ms: u64, name: &str) -> &'a str {
    let prefix = format!("snapshot {name} ");
    lines
        .iter()
        .find(|l| l.ms == ms && l.event.starts_with(&prefix))
        .map(|l| l.event.as_str())
        .unwrap_or_else(|| {
            let tail: Vec<String> = lines
                .iter()
                .rev()
                .take(12)
                .map(|l| format!("{} {} {}", l.ms, l.actor, l.event))
                .collect();
            panic!("no snapshot of {name} at {ms} ms; the trace ends (newest first): {tail:#?}")
        })
}

/// Every replica crashes at once, cut from the API server (so that nothing it had in flight
/// lands), and comes back a second later: the live operation's holder is gone for good.
fn orphan_the_live_operation() -> Vec<(u64, Action)> {
    let mut then = Vec::new();
    for i in 0..3 {
        let (a, b) = hosts(&format!("replica-{i}"), "apiserver");
        then.push((0, Action::Partition(a.clone(), b.clone())));
        then.push((0, Action::Crash(i)));
        then.push((900, Action::Repair(a, b)));
    }
    then
}

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
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} ")),
            "not fenced at its deadline, or its identity lost: {after}"
        );
    }
}

/// Claims expired under the replicas (every replica's clock steps 31 s forward, past the
/// clients' 30 s claims): over mTLS, every file operation, command and renewal with a claim
/// taken before the step is refused ABORTED, until a new claim is acquired for the binding
/// (DurableRunAuthorizationOverMTLS, an expired lease over the wire).
#[test]
fn claims_expired_by_a_clock_step_are_refused_over_the_wire_until_a_new_claim() {
    const STEP_MS: u64 = 3_000;
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
            } else if is_data_plane(what) {
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

/// Replicas reload the security directory every 2 s; a change is in force everywhere this
/// long after it is written.
const RELOADED_MS: u64 = 2_600;

/// Client calls that completed in `[from, to)`: (ms, what, outcome).
fn calls_between(lines: &[Line], from: u64, to: u64) -> Vec<(u64, String, String)> {
    lines
        .iter()
        .filter(|l| l.ms >= from && l.ms < to)
        .filter_map(|l| call(l).map(|(what, outcome)| (l.ms, what.to_owned(), outcome.to_owned())))
        .collect()
}

/// Every template withdrawn from the client's policy at a higher generation while commands,
/// claims and revocations are in flight (template change mid-dispatch, CancelsWhenPolicyAuthorityChanges,
/// MatchingOwnerSeesActualState): once the replicas reloaded, ensure answers NOT_FOUND and no
/// file operation or command succeeds, until the templates come back at the next generation;
/// no operation runs twice and every environment converges.
#[test]
fn withdrawing_every_template_refuses_ensure_and_the_data_plane_until_reinstated() {
    use sim::script::Change;
    const WITHDRAW_MS: u64 = 1_500;
    const REINSTATE_MS: u64 = 6_000;
    let script = [
        at(WITHDRAW_MS, Action::Security(Change::WithdrawTemplates)),
        at(REINSTATE_MS, Action::Security(Change::Reinstate)),
    ];
    for report in passes_for(Scenario::RevocationRace, 1..=2, 10, &script) {
        let lines = lines(&report);
        let window = calls_between(&lines, WITHDRAW_MS + RELOADED_MS, REINSTATE_MS);
        let mut refused = 0;
        for (ms, what, outcome) in &window {
            if what.starts_with("ensure ") {
                assert_eq!(outcome, "NotFound", "{ms} {what}");
                refused += 1;
            } else if what.starts_with("file ") || what.starts_with("command ") {
                assert_ne!(outcome, "ok", "{ms} {what}");
                refused += 1;
            }
        }
        assert!(
            refused > 0,
            "no ensure or data-plane call while withdrawn: {window:?}"
        );
    }
}

/// The client CA removed from the manifest at a higher generation (its certificate no longer
/// verifies, as if it had expired: OriginalPeerWithdrawal, CA removal and certificate expiry):
/// once the replicas reloaded, every client call is refused UNAUTHENTICATED, until the CA comes back at the next
/// generation; nothing admitted before runs twice and every environment converges.
#[test]
fn distrusting_the_client_ca_refuses_every_call_until_the_ca_is_back() {
    use sim::script::Change;
    const DISTRUST_MS: u64 = 1_500;
    const REINSTATE_MS: u64 = 5_000;
    let script = [
        at(DISTRUST_MS, Action::Security(Change::DistrustClientCa)),
        at(REINSTATE_MS, Action::Security(Change::Reinstate)),
    ];
    for report in passes_for(Scenario::RevocationRace, 1..=2, 14, &script) {
        let lines = lines(&report);
        let window = calls_between(&lines, DISTRUST_MS + RELOADED_MS, REINSTATE_MS);
        for (ms, what, outcome) in &window {
            assert_eq!(outcome, "Unauthenticated", "{ms} {what}");
        }
        assert!(
            window.len() > 2,
            "too few calls while distrusted: {window:?}"
        );
        let after = calls_between(&lines, REINSTATE_MS + RELOADED_MS, u64::MAX);
        assert!(
            after.iter().any(|(_, _, outcome)| outcome == "ok"),
            "nothing succeeded after the CA came back: {after:?}"
        );
    }
}

/// Revocation racing a crash (RevokedCrashExpiresOperation…, the policy form): while an
/// operation is in flight, every replica crashes and every template is withdrawn from the
/// client's policy, with the scenario's revocations and security rotations going on; the
/// replicas come back, the templates come back 3 s later. The orphaned operation is fenced
/// at its lease deadline keeping its identity, whatever revocations came in between, and
/// nothing runs twice.
#[test]
fn a_policy_withdrawal_racing_a_crash_mid_operation_still_fences_it_at_its_deadline() {
    use sim::script::Change;
    let mut then = orphan_the_live_operation();
    then.push((0, Action::Security(Change::WithdrawTemplates)));
    then.extend((0..3).map(|i| (1_000, Action::Restart(i))));
    then.push((3_000, Action::Security(Change::Reinstate)));
    then.push((33_000, Action::Snapshot));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::RevocationRace, 1..=1, 64, &script) {
        let lines = lines(&report);
        let (live_ms, id, name) = live_operation(&lines);
        let after = snapshot_of(&lines, live_ms + 33_000, &name);
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} ")),
            "not fenced at its deadline, or its identity lost: {after}"
        );
    }
}

/// How long the commands of a withdrawal-while-a-command-runs race run.
const SLOW_COMMAND_MS: u64 = 3_500;

/// Commands run 3.5 s; as soon as one is live, `change` is written (in force within 2.1 s,
/// before the command ends) and reverted 2 s after the command ends. The completion write
/// must find the caller's policy withdrawn: the caller is refused FAILED_PRECONDITION (the
/// code of `fence_unknown`; the trace keeps no error details) and the environment is
/// FenceUnknown with the same operation on record, instead of the result being acknowledged.
fn a_change_landing_while_a_command_runs_fences_it(change: sim::script::Change) {
    use sim::script::Change;
    let then = vec![
        (0, Action::Security(change)),
        (1_000, Action::CommandTime(0)),
        (SLOW_COMMAND_MS + 1_000, Action::Snapshot),
        (SLOW_COMMAND_MS + 2_000, Action::Security(Change::Reinstate)),
    ];
    let script = [
        at(1_000, Action::CommandTime(SLOW_COMMAND_MS)),
        at(1_000, Action::WhenCommandLive(then)),
    ];
    for report in passes_for(Scenario::RevocationRace, 1..=2, 10, &script) {
        let lines = lines(&report);
        let (live_ms, id, name) = live(&lines, "command");
        let after = snapshot_of(&lines, live_ms + SLOW_COMMAND_MS + 1_000, &name);
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} ")),
            "not fenced, or its operation lost: {after}"
        );
        let window = calls_between(&lines, live_ms, live_ms + SLOW_COMMAND_MS + 1_000);
        let fenced = window
            .iter()
            .filter(|(_, what, _)| what.starts_with("command "))
            .filter(|(_, _, outcome)| outcome == "FailedPrecondition")
            .count();
        assert!(fenced > 0, "no command was refused as fenced: {window:?}");
    }
}

/// Every template withdrawn from the caller's policy while its command runs
/// (CancelsWhenPolicyAuthorityChanges, §8.2 `policyCurrent` at the completion write): the
/// command's result is not acknowledged; fence_unknown, FenceUnknown, the operation kept.
#[test]
fn a_template_withdrawal_landing_while_a_command_runs_fences_it_keeping_its_operation() {
    a_change_landing_while_a_command_runs_fences_it(sim::script::Change::WithdrawTemplates);
}

/// The client CA removed while a command runs (OriginalPeerWithdrawal: the caller's
/// certificate no longer verifies, checked again at the completion write): fence_unknown,
/// FenceUnknown, the operation kept.
#[test]
fn a_client_ca_removal_landing_while_a_command_runs_fences_it_keeping_its_operation() {
    a_change_landing_while_a_command_runs_fences_it(sim::script::Change::DistrustClientCa);
}

/// The capacity ledger's ConfigMap, whose writes the outage race refuses.
const LEDGER: &str = "mecatl-execution-profile-allocations";

/// Whether the `snapshot ledger ...` lines at `ms` list environment `name`.
fn in_ledger(lines: &[Line], ms: u64, name: &str) -> bool {
    let quoted = format!("\"{name}\"");
    lines
        .iter()
        .filter(|l| l.ms == ms && l.event.starts_with("snapshot ledger "))
        .any(|l| l.event.contains(&quoted))
}

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
