//! Races where the caller's authority is lost while a command outlives its operation-lease
//! renewal (the cancel-at-renewal form of CancelsWhenPolicyAuthorityChanges,
//! OriginalPeerWithdrawal and CancelsWhenExecutionAuthorityIsLost, spec/store.md §8.3): the
//! holder renews the lease 10 s after dispatch, finds the caller's policy or client CA
//! withdrawn (or the claim revoked), cancels the executor call, the node stops the command
//! without its effect, and the dispatch fences keeping its operation.
//!
//! `revocation-race` loses authority by itself too (client revocations, security rollback
//! attempts). The withdrawal races therefore cut every client from every replica while the
//! command runs (no revocation can land), use seeds whose drawn rollbacks stay clear of the
//! window (checked), and run each seed without the withdrawal as well, where the command must
//! run to its end unfenced: the withdrawal is the cause. The claim-lost race uses the
//! scenario's own revocations.

use sim::script::{Action, Change};
use sim::{Report, Scenario};

use crate::support::*;

/// How long the slow commands run: past the first lease renewal (10 s after dispatch) and
/// within the caller's deadline (the workload's 10 s command timeout plus the node's 3 s
/// grace), so that only a renewal can stop them early.
const SLOW_COMMAND_MS: u64 = 12_000;
/// The lease renewal period (`store::lease::RENEW_PERIOD`).
const RENEWAL_MS: u64 = 10_000;
/// A look at the state before the renewal, after the live command was first seen.
const BEFORE_RENEWAL_MS: u64 = 9_000;
/// A look at the state after the renewal, before the command would have ended by itself.
const AFTER_RENEWAL_MS: u64 = 11_500;
/// A rollback attempt this long after the command went live may still be in force at the
/// renewal (10 s after): the good manifest comes back within 3.3 s (the drawn partition
/// time) and is reloaded within 2 s.
const ROLLBACK_CLEAR_MS: u64 = 4_000;
/// How long the workload runs (the command goes live in its first 2 s).
const WORKLOAD_SECS: u64 = 16;

/// The executor nodes' `EVENT command ID on NAME` lines: (ms, event, command id).
fn node_lines<'a>(lines: &'a [Line], name: &str) -> Vec<(u64, &'a str, &'a str)> {
    let suffix = format!(" on {name}");
    lines
        .iter()
        .filter(|l| l.actor.starts_with("node-"))
        .filter_map(|l| {
            let rest = l.event.strip_suffix(&suffix)?;
            let (event, id) = rest.split_once(" command ")?;
            Some((l.ms, event, id))
        })
        .collect()
}

/// What became of the live command: its operation id, the node's events for it (ms after
/// it started, event) and its environment's snapshots when it went live, before and after
/// the renewal.
struct Fate {
    /// A security rollback attempt (or drift) late enough to matter: the replicas may be
    /// failing closed at the renewal by themselves.
    rollback: Option<String>,
    operation: String,
    events: Vec<(u64, String)>,
    at_live: String,
    before: String,
    after: String,
}

fn fate(report: &Report) -> Fate {
    let lines = lines(report);
    let (live_ms, operation, name) = live(&lines, "command");
    let on_node = node_lines(&lines, &name);
    let (started_ms, _, command) = *on_node
        .iter()
        .rfind(|(ms, event, _)| *event == "started" && *ms <= live_ms + 500)
        .unwrap_or_else(|| panic!("the live command never started on a node: {on_node:?}"));
    let events = on_node
        .iter()
        .filter(|(_, _, c)| *c == command)
        .map(|(ms, event, _)| (ms - started_ms, (*event).to_owned()))
        .collect();
    let rollback = lines
        .iter()
        .filter(|l| l.actor == "world" && l.ms >= live_ms + ROLLBACK_CLEAR_MS)
        .filter(|l| l.ms < live_ms + RENEWAL_MS)
        .filter(|l| l.event.starts_with("security "))
        .find(|l| l.event.contains("rollback") || l.event.contains("drift"))
        .map(|l| format!("{} {}", l.ms, l.event));
    Fate {
        rollback,
        operation,
        events,
        at_live: snapshot_of(&lines, live_ms, &name).to_owned(),
        before: snapshot_of(&lines, live_ms + BEFORE_RENEWAL_MS, &name).to_owned(),
        after: snapshot_of(&lines, live_ms + AFTER_RENEWAL_MS, &name).to_owned(),
    }
}

/// The grant generation of a snapshot line.
fn grants(snapshot: &str) -> &str {
    snapshot
        .split(' ')
        .find_map(|field| field.strip_prefix("grants="))
        .unwrap_or_else(|| panic!("no grants in {snapshot}"))
}

/// The scenario's client hosts and replicas.
const CLIENTS: u32 = 3;
const REPLICAS: u32 = 3;

/// Slow commands from 1 s on; once one is live, `change` (if any) is written at once, the
/// clients are cut from the replicas when `quiet`, and commands are fast again 1 s later;
/// snapshots then, before and after the renewal; the cut is repaired and the change undone
/// after the last one.
fn script(change: Option<Change>, quiet: bool) -> Vec<sim::script::Scripted> {
    let mut then = vec![
        (0, Action::Snapshot),
        (1_000, Action::CommandTime(0)),
        (BEFORE_RENEWAL_MS, Action::Snapshot),
        (AFTER_RENEWAL_MS, Action::Snapshot),
    ];
    if let Some(change) = change {
        then.push((0, Action::Security(change)));
        then.push((AFTER_RENEWAL_MS + 500, Action::Security(Change::Reinstate)));
    }
    let pairs = (0..CLIENTS).flat_map(|c| (0..REPLICAS).map(move |r| (c, r)));
    for (c, r) in quiet.then_some(pairs).into_iter().flatten() {
        let (a, b) = hosts(&format!("client-{c}"), &format!("replica-{r}"));
        then.push((0, Action::Partition(a.clone(), b.clone())));
        then.push((AFTER_RENEWAL_MS + 500, Action::Repair(a, b)));
    }
    vec![
        at(1_000, Action::CommandTime(SLOW_COMMAND_MS)),
        at(1_000, Action::WhenCommandLive(then)),
    ]
}

/// The renewal cancelled the command: the node stopped it at the renewal (10 s after it
/// started, give or take the renewal's read and the network) and never ran it (no effect),
/// and the environment is FenceUnknown with the same operation, before the command would
/// have ended by itself, or already recovered automatically from that fence (unfenced at a
/// new epoch: the checker's §10.25 proves the fence was left only by a termination proof).
fn assert_cancelled_at_the_renewal(fate: &Fate) {
    let events = &fate.events;
    assert!(
        events.iter().all(|(_, event)| event != "ran"),
        "the cancelled command took effect: {events:?}"
    );
    let (after, _) = events
        .iter()
        .find(|(_, event)| event == "cancelled")
        .unwrap_or_else(|| panic!("the node never stopped the command: {events:?}"));
    assert!(
        (RENEWAL_MS - 200..RENEWAL_MS + 1_000).contains(after),
        "stopped {after} ms after it started, not at the renewal: {events:?}"
    );
    let operation = &fate.operation;
    assert!(
        fate.after
            .contains(&format!("fence=FenceUnknown op={operation} "))
            || recovered_since(&fate.at_live, &fate.after),
        "neither fenced with its operation nor recovered at a new epoch: {}",
        fate.after
    );
}

/// The seeds of the withdrawal races: their drawn rollback attempts stay clear of the window.
const QUIET_SEEDS: [u64; 2] = [1, 5];

/// Runs `script` on `seed` (which must pass every invariant and liveness) and reads the fate
/// of its live command.
fn run(seed: u64, script: &[sim::script::Scripted]) -> Fate {
    let reports = passes_for(Scenario::RevocationRace, seed..=seed, WORKLOAD_SECS, script);
    let fate = fate(&reports[0]);
    if let Some(rollback) = &fate.rollback {
        panic!(
            "seed {seed} attempts a rollback around the renewal (pick another seed): {rollback}"
        );
    }
    fate
}

/// Commands run 12 s; as soon as one is live, `change` is written (in force within 2.1 s,
/// long before the renewal) and the clients are cut from the replicas until after the
/// renewal. The renewal finds the change: the command is cancelled at the renewal, stops on
/// the node without its effect, and the environment is FenceUnknown with the same operation,
/// its claim not revoked. The same seed without the change runs the command to its end,
/// unfenced.
fn a_change_before_the_renewal_cancels_the_running_command(change: Change) {
    for seed in QUIET_SEEDS {
        let control = run(seed, &script(None, true));
        assert!(
            control
                .events
                .iter()
                .any(|(ms, event)| event == "ran" && *ms >= SLOW_COMMAND_MS),
            "seed {seed}: without the change the command did not run to its end: {:?}",
            control.events
        );
        let live = format!("fence=Healthy op={} ", control.operation);
        assert!(control.after.contains(&live), "{}", control.after);
        let fate = run(seed, &script(Some(change), true));
        assert_cancelled_at_the_renewal(&fate);
        assert_eq!(
            grants(&fate.at_live),
            grants(&fate.after),
            "seed {seed}: the claim was revoked too"
        );
    }
}

/// Every template withdrawn from the caller's policy while its command runs past a lease
/// renewal (CancelsWhenPolicyAuthorityChanges, §8.3 `policyCurrent` at renewal): the renewal
/// cancels the executor call, the command stops on the node without its effect, and the
/// environment is FenceUnknown with the operation kept.
#[test]
fn a_template_withdrawal_before_a_lease_renewal_cancels_the_running_command_and_fences() {
    a_change_before_the_renewal_cancels_the_running_command(Change::WithdrawTemplates);
}

/// The client CA removed while a command runs past a lease renewal (OriginalPeerWithdrawal:
/// the caller's certificate no longer verifies at the renewal): the renewal cancels, the
/// node stops the command without its effect, FenceUnknown with the operation kept.
#[test]
fn a_client_ca_removal_before_a_lease_renewal_cancels_the_running_command_and_fences() {
    a_change_before_the_renewal_cancels_the_running_command(Change::DistrustClientCa);
}

/// The claim revoked while its command runs (CancelsWhenExecutionAuthorityIsLost, the
/// revocation form): in these seeds a client of the scenario revokes the live command's
/// claim before the renewal (its grant generation rises while the operation is still live
/// and unfenced); the renewal finds the claim gone, cancels, the node stops the command
/// without its effect, and the environment is FenceUnknown with the operation kept.
#[test]
fn a_claim_revoked_while_its_command_runs_is_cancelled_at_the_next_renewal_and_fenced() {
    for seed in [1, 6] {
        let script = script(None, false);
        let reports = passes_for(
            Scenario::RevocationRace,
            seed..=seed,
            WORKLOAD_SECS,
            &script,
        );
        let fate = fate(&reports[0]);
        let live = format!("fence=Healthy op={} ", fate.operation);
        assert!(
            fate.before.contains(&live),
            "seed {seed}: the operation was not live and unfenced before the renewal: {}",
            fate.before
        );
        assert_ne!(
            grants(&fate.at_live),
            grants(&fate.before),
            "seed {seed} no longer revokes the claim before the renewal (pick another seed)"
        );
        assert_cancelled_at_the_renewal(&fate);
    }
}
