//! Races with security changes: templates withdrawn from the policy and the client CA
//! distrusted, between calls, racing a crash, and while a command runs.

use sim::Scenario;
use sim::script::Action;

use crate::support::*;

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
/// once the replicas reloaded, every client call is refused UNAUTHENTICATED (the handshake
/// does not check the chain, each call does: api-security §2.1, §2.2 step 3), until the CA
/// comes back at the next generation; nothing admitted before runs twice and every
/// environment converges. The distrusting anchor is a real CA certificate: a leaf there
/// would fail the reload's bundle check and refuse the connection instead.
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
    let mut then = vec![(0, Action::Snapshot)];
    then.extend(orphan_the_live_operation());
    then.push((0, Action::Security(Change::WithdrawTemplates)));
    then.extend((0..3).map(|i| (1_000, Action::Restart(i))));
    then.push((3_000, Action::Security(Change::Reinstate)));
    then.push((33_000, Action::Snapshot));
    let script = [at(1_000, Action::WhenOperationLive(then))];
    for report in passes_for(Scenario::RevocationRace, 1..=1, 64, &script) {
        let lines = lines(&report);
        let (live_ms, id, name) = live_operation(&lines);
        let before = snapshot_of(&lines, live_ms, &name);
        let after = snapshot_of(&lines, live_ms + 33_000, &name);
        // Fenced at the deadline, identity kept; or already recovered automatically.
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} "))
                || recovered_since(before, after),
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
        (0, Action::Snapshot),
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
        let before = snapshot_of(&lines, live_ms, &name);
        let after = snapshot_of(&lines, live_ms + SLOW_COMMAND_MS + 1_000, &name);
        // Fenced with the operation kept; or, by the time it is looked at, already recovered
        // automatically at a new epoch (the checker's §10.25 proves the fence was left only by
        // a termination proof of the exact executor).
        assert!(
            after.contains(&format!("fence=FenceUnknown op={id} "))
                || recovered_since(before, after),
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
