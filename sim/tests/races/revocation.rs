//! Races of a template revision revoked in the registry (the operator edits the templates
//! file and rolls the replicas) with a crash mid-operation: the executor is stopped, the
//! orphaned operation is fenced at its deadline keeping its identity, recovery waits for the
//! exact Pod to be terminal, and then the environment can be retired and deleted.

use sim::Scenario;
use sim::script::Action;
use sim::workload::{ADMIN_HOST, AdminCall};

use crate::support::*;

/// Workload seconds (the clients finish after about 0.7 s per workload second): long enough
/// for every step of (b) to land before they do, and for every step of (a).
const DURATION_SECS: u64 = 110;
const FENCED_DURATION_SECS: u64 = 75;
// Every time below counts from the moment the operation is seen live.

/// When the first snapshot is taken: the replicas have
/// restarted with the revoked revision and stopped its executor.
const STOPPED_MS: u64 = 6_000;
/// After the operation's 30 s lease deadline.
const FENCED_MS: u64 = 33_000;
/// The Recover made while the Pod is still running.
const EARLY_RECOVER_MS: u64 = 33_500;
/// The fence, looked at again after that refusal.
const AFTER_REFUSAL_MS: u64 = 36_000;
/// The kubelet reports again: the stopped Pod becomes terminal.
const KUBELET_BACK_MS: u64 = 36_500;
/// Every replica crashes and restarts (fresh stores and reconcilers) before the recovery.
const ROLLED_MS: u64 = 37_000;
/// Then: the stopped Pod is seen terminal, recovered, its references released, retired,
/// deleted, and looked for (gone).
const TERMINAL_MS: u64 = 40_000;
const RECOVER_MS: u64 = 40_500;
const RELEASE_MS: u64 = 41_500;
const RETIRE_MS: u64 = 43_000;
const DELETE_MS: u64 = 50_000;
const GONE_MS: u64 = 58_000;

/// The operation's holders crash for good, the kubelet stops reporting, and the operator
/// revokes the environment's revision in the templates file; the replicas come back with it.
fn revoke_under_a_crash() -> Vec<(u64, Action)> {
    let mut then = orphan_the_live_operation();
    then.push((0, Action::KubeletHold));
    then.push((500, Action::RevokeRevision));
    then.extend((0..3).map(|i| (1_000, Action::Restart(i))));
    for ms in [STOPPED_MS, FENCED_MS, AFTER_REFUSAL_MS] {
        then.push((ms, Action::Snapshot));
        then.push((ms, Action::SnapshotRuntime));
    }
    then.push((EARLY_RECOVER_MS, Action::Admin(AdminCall::Recover)));
    then
}

/// The lines of the admin host: (ms, event).
fn admin_calls(lines: &[Line]) -> Vec<(u64, &str)> {
    lines
        .iter()
        .filter(|l| l.actor == ADMIN_HOST)
        .map(|l| (l.ms, l.event.as_str()))
        .collect()
}

/// The outcome of the admin call `what` (`Recover`, `Retire`, ...) on `name` made at `at`
/// (its answer comes later).
fn admin_outcome<'a>(lines: &'a [Line], what: &str, name: &str, at: u64) -> &'a str {
    let prefix = format!("{what} {name} ");
    let calls = admin_calls(lines);
    calls
        .iter()
        .find(|(ms, event)| *ms >= at && event.starts_with(&prefix))
        .and_then(|(_, event)| event.rsplit_once(" -> "))
        .map(|(_, outcome)| outcome)
        .unwrap_or_else(|| panic!("no {what} of {name} answered after {at} ms: {calls:?}"))
}

/// The runtime snapshot lines (`snapshot pod|pvc ...`) of environment `name` at `ms`.
fn runtime_of<'a>(lines: &'a [Line], ms: u64, kind: &str, name: &str) -> Vec<&'a str> {
    let prefix = format!("snapshot {kind} ");
    let owner = format!(" env={name} ");
    lines
        .iter()
        .filter(|l| l.ms == ms && l.event.starts_with(&prefix) && l.event.contains(&owner))
        .map(|l| l.event.as_str())
        .collect()
}

/// Asserts what (a) must show at `at`: still fenced with the same operation, the
/// Pod stopped but not terminal (kept by its finalizer, same UID), the PVC kept.
fn assert_fenced_and_stopped(lines: &[Line], at: u64, id: &str, name: &str, pod_uid: &str) {
    let env = snapshot_of(lines, at, name);
    assert!(
        env.contains(&format!("fence=FenceUnknown op={id} ")),
        "not fenced keeping its operation at {at}: {env}"
    );
    let pods = runtime_of(lines, at, "pod", name);
    assert!(
        pods.len() == 1
            && pods[0].contains(pod_uid)
            && pods[0].contains(" phase=Running deleting=yes ")
            && !pods[0].ends_with("finalizers=0"),
        "the executor is not the same Pod, stopped and kept by its finalizer, at {at}: {pods:?}"
    );
    let pvcs = runtime_of(lines, at, "pvc", name);
    assert!(
        pvcs.len() == 1 && pvcs[0].ends_with("deleting=no"),
        "the workspace is not kept at {at}: {pvcs:?}"
    );
}

/// The UID of the one Pod of `name` at `ms`.
fn pod_uid(lines: &[Line], ms: u64, name: &str) -> String {
    let pods = runtime_of(lines, ms, "pod", name);
    assert_eq!(
        pods.len(),
        1,
        "one executor Pod of {name} at {ms}: {pods:?}"
    );
    let uid = pods[0]
        .split(" uid=")
        .nth(1)
        .and_then(|r| r.split(' ').next());
    uid.expect("a Pod UID").to_owned()
}

/// (a) RevokedCrashExpiresOperationAndStopsExecutor: an operation is live; every replica
/// crashes; the operator revokes the environment's template revision in the registry and the
/// replicas come back with it. They stop the executor at once (the Pod is deleted under its
/// UID, its finalizer keeps it Terminating, the PVC is kept) while the operation stays,
/// unfenced, until its lease deadline; then it is FenceUnknown with the same id. The kubelet
/// does not report the Pod terminated yet, so a Recover naming the exact identities is refused
/// with fence_unknown (FAILED_PRECONDITION) and the fence does not change.
#[test]
fn a_revision_revoked_in_the_registry_under_a_crash_stops_the_executor_and_fences_until_the_pod_is_terminal()
 {
    let mut then = revoke_under_a_crash();
    then.push((AFTER_REFUSAL_MS + 100, Action::KubeletRelease));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::Smoke, 1..=2, FENCED_DURATION_SECS, &script) {
        stopped_then_fenced_until_terminal(&lines(&report));
    }
}

/// What (a) must show: once the replicas run the revoked revision, the environment is
/// InvalidTemplate, unfenced with its operation, its Pod being stopped; after the deadline it
/// is fenced with the same operation; a Recover then is refused with fence_unknown and
/// changes nothing.
fn stopped_then_fenced_until_terminal(lines: &[Line]) {
    let (live_ms, id, name) = live_operation(lines);
    let stopped = live_ms + STOPPED_MS;
    let before = snapshot_of(lines, stopped, &name);
    assert!(
        before.contains(&format!("fence=Healthy op={id} "))
            && before.ends_with("ready=False/InvalidTemplate"),
        "not InvalidTemplate, unfenced with its operation, before the deadline: {before}"
    );
    let uid = pod_uid(lines, stopped, &name);
    assert!(
        runtime_of(lines, stopped, "pod", &name)[0].contains(" deleting=yes "),
        "the executor is not being stopped once the replicas run the revoked revision"
    );
    assert_fenced_and_stopped(lines, live_ms + FENCED_MS, &id, &name, &uid);
    let outcome = admin_outcome(lines, "Recover", &name, live_ms + EARLY_RECOVER_MS);
    assert_eq!(
        outcome, "FailedPrecondition fence_unknown",
        "a Recover while the Pod runs"
    );
    assert_fenced_and_stopped(lines, live_ms + AFTER_REFUSAL_MS, &id, &name, &uid);
}

/// (b) RevokedCrashWithTerminalPodCanRecoverAndRetire: (a) (asserted again), then the kubelet reports the
/// stopped Pod terminated and every replica restarts (fresh stores and reconcilers); a Recover
/// naming the exact identities now succeeds, the references are released, the environment is
/// retired and its retained deletion completes: the environment, its PVC, its Pod and its
/// capacity slot are gone.
#[test]
fn once_the_stopped_executor_is_terminal_the_revoked_environment_recovers_retires_and_is_deleted() {
    let mut then = revoke_under_a_crash();
    then.push((KUBELET_BACK_MS, Action::KubeletRelease));
    then.extend((0..3).map(|i| (ROLLED_MS, Action::Crash(i))));
    then.extend((0..3).map(|i| (ROLLED_MS + 1_000, Action::Restart(i))));
    then.push((TERMINAL_MS, Action::SnapshotRuntime));
    then.push((RECOVER_MS, Action::Admin(AdminCall::Recover)));
    then.push((RELEASE_MS, Action::Admin(AdminCall::ReleaseReferences)));
    then.push((RETIRE_MS, Action::Admin(AdminCall::Retire)));
    then.push((DELETE_MS, Action::Admin(AdminCall::DeleteRetired)));
    then.push((GONE_MS, Action::Snapshot));
    then.push((GONE_MS, Action::SnapshotRuntime));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::Smoke, 1..=2, DURATION_SECS, &script) {
        let lines = lines(&report);
        stopped_then_fenced_until_terminal(&lines);
        let (live_ms, _, name) = live_operation(&lines);
        let terminal = runtime_of(&lines, live_ms + TERMINAL_MS, "pod", &name);
        assert!(
            terminal.len() == 1 && terminal[0].contains(" phase=Failed deleting=yes "),
            "the stopped Pod is not reported terminal: {terminal:?}"
        );
        for (what, ms) in [
            ("Recover", RECOVER_MS),
            ("Retire", RETIRE_MS),
            ("DeleteRetired", DELETE_MS),
        ] {
            let outcome = admin_outcome(&lines, what, &name, live_ms + ms);
            assert_eq!(outcome, "ok", "{what} of {name}");
        }
        let gone = live_ms + GONE_MS;
        assert!(
            lines
                .iter()
                .any(|l| l.ms == gone && l.event.starts_with("snapshot ledger ")),
            "no snapshot at {gone} ms (the workload ended before it?)"
        );
        let prefix = format!("snapshot {name} ");
        assert!(
            !lines
                .iter()
                .any(|l| l.ms == gone && l.event.starts_with(&prefix)),
            "the environment {name} is not gone"
        );
        for kind in ["pod", "pvc"] {
            let left = runtime_of(&lines, gone, kind, &name);
            assert!(left.is_empty(), "{name} left its {kind}: {left:?}");
        }
        assert!(
            !in_ledger(&lines, gone, &name),
            "{name} still holds its slot"
        );
    }
}
