//! Pure edits of `status.commands` (docs/commands.md §5.1): admitting a lease, finding the
//! caller's, recording an end from the supervisor's view, and ending every open lease when the
//! executor's end is proven. The compare-and-swap writes that use them are in
//! [`super::commands`]; the invariants they keep are [`super::command_invariants`].

use std::time::SystemTime;

use super::ClaimContext;
use crate::executor::protocol::CommandState;
use crate::executor::supervisor_protocol::{ClaimTuple, CommandView, JournalEntry};
use crate::kube::crd::{
    CommandEndReason, CommandEndState, CommandLease, CommandLeaseState, CommandOutcome,
    ExecutionEnvironment, ExecutionEnvironmentStatus, MAX_COMMAND_LEASES, RfcTime,
};

/// The lease `id`, if the status holds it.
pub fn find<'a>(o: &'a ExecutionEnvironment, id: &str) -> Option<&'a CommandLease> {
    o.status.as_ref()?.commands.iter().find(|l| l.id == id)
}

/// The lease `id` when it belongs to exactly the claim of `rc`; anything else looks absent.
pub fn find_owned<'a>(
    o: &'a ExecutionEnvironment,
    id: &str,
    rc: &ClaimContext,
) -> Option<&'a CommandLease> {
    find(o, id).filter(|l| owned_by(l, rc))
}

/// Whether the lease's tuple is exactly the claim of `rc`.
pub fn owned_by(lease: &CommandLease, rc: &ClaimContext) -> bool {
    lease.claim_id == rc.claim_id
        && lease.run_id == rc.run_id
        && lease.epoch == rc.epoch
        && lease.grant_generation == rc.grant_generation
}

/// The claim tuple the supervisor compares, from a validated context.
pub fn tuple_of(rc: &ClaimContext) -> ClaimTuple {
    ClaimTuple {
        claim_id: rc.claim_id.clone(),
        run_id: rc.run_id.clone(),
        epoch: rc.epoch,
        grant_generation: rc.grant_generation,
    }
}

/// Leases not ended.
pub fn open_count(status: &ExecutionEnvironmentStatus) -> usize {
    status.commands.iter().filter(|l| l.is_open()).count()
}

/// No lease is open: nothing supervised may be running.
pub fn none_open(o: &ExecutionEnvironment) -> bool {
    o.status
        .as_ref()
        .is_none_or(|s| !s.commands.iter().any(CommandLease::is_open))
}

/// The claim ids that own open leases.
pub fn open_claims(o: &ExecutionEnvironment) -> Vec<String> {
    let mut claims: Vec<String> = o
        .status
        .iter()
        .flat_map(|s| s.commands.iter())
        .filter(|l| l.is_open())
        .map(|l| l.claim_id.clone())
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

/// A new `Running` lease of `rc`'s claim.
pub fn new_lease(id: &str, rc: &ClaimContext, detached: bool, now: SystemTime) -> CommandLease {
    CommandLease {
        id: id.to_owned(),
        claim_id: rc.claim_id.clone(),
        run_id: rc.run_id.clone(),
        epoch: rc.epoch,
        grant_generation: rc.grant_generation,
        detached,
        started_at: RfcTime::from_system_time(now),
        state: CommandLeaseState::Running,
        cancel_operation_id: None,
        outcome: None,
    }
}

/// Appends `lease`, first removing the oldest ended leases past the bound of 32.
pub fn push(status: &mut ExecutionEnvironmentStatus, lease: CommandLease) {
    while status.commands.len() >= MAX_COMMAND_LEASES {
        let Some(oldest) = status
            .commands
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_open())
            .min_by_key(|(_, l)| l.outcome.as_ref().map(|o| o.ended_at))
            .map(|(i, _)| i)
        else {
            break;
        };
        status.commands.remove(oldest);
    }
    status.commands.push(lease);
}

/// The recorded end of a command whose supervisor view says it ended, or, when `view` still
/// runs after a claim end or cancel, a `fence_unknown` end (its end is not proven).
pub fn outcome_of(view: &CommandView, reason: CommandEndReason, now: SystemTime) -> CommandOutcome {
    let proven = view.proven && view.state != CommandState::Running;
    let state = if !proven {
        CommandEndState::FenceUnknown
    } else {
        end_state(view.state)
    };
    let receipt =
        (proven && !view.terminal_receipt.is_empty()).then(|| view.terminal_receipt.clone());
    CommandOutcome {
        state,
        exit_code: view.exit_code,
        terminal_receipt: receipt,
        ended_at: RfcTime::from_system_time(now),
        reason: if reason == CommandEndReason::Cancelled && state != CommandEndState::Cancelled {
            // It had ended by itself before the cancel reached it.
            CommandEndReason::Exited
        } else {
            reason
        },
    }
}

/// The recorded end of a command known only from the supervisor's journal.
pub fn outcome_of_journal(
    entry: Option<&JournalEntry>,
    reason: CommandEndReason,
    now: SystemTime,
) -> CommandOutcome {
    match entry {
        Some(e) if !e.never_started => outcome_of(
            &CommandView {
                command_id: e.command_id.clone(),
                state: e.state,
                exit_code: e.exit_code,
                proven: e.proven,
                terminal_receipt: e.terminal_receipt.clone(),
                ..CommandView::default()
            },
            reason,
            now,
        ),
        _ => CommandOutcome {
            state: CommandEndState::Failed,
            exit_code: -1,
            terminal_receipt: None,
            ended_at: RfcTime::from_system_time(now),
            reason: CommandEndReason::NeverStarted,
        },
    }
}

/// The outcome of a start the supervisor refused definitively: nothing ran.
pub fn refused(now: SystemTime) -> CommandOutcome {
    CommandOutcome {
        state: CommandEndState::Failed,
        exit_code: -1,
        terminal_receipt: None,
        ended_at: RfcTime::from_system_time(now),
        reason: CommandEndReason::Refused,
    }
}

fn end_state(state: CommandState) -> CommandEndState {
    match state {
        CommandState::Succeeded => CommandEndState::Succeeded,
        CommandState::Cancelled => CommandEndState::Cancelled,
        CommandState::FenceUnknown | CommandState::Running => CommandEndState::FenceUnknown,
        _ => CommandEndState::Failed,
    }
}

/// Ends the open lease `id` with `outcome`; an ended lease is left as it is (it never
/// changes). Returns whether anything changed.
pub fn end(status: &mut ExecutionEnvironmentStatus, id: &str, outcome: CommandOutcome) -> bool {
    let Some(lease) = status.commands.iter_mut().find(|l| l.id == id) else {
        return false;
    };
    if !lease.is_open() {
        return false;
    }
    lease.state = CommandLeaseState::Ended;
    lease.cancel_operation_id = None;
    lease.outcome = Some(outcome);
    true
}

/// Ends every open lease because the executor Pod's end is proven (replacement, retirement,
/// recovery): its processes are gone, its output with them, so there is no receipt.
pub fn end_all_by_executor_end(status: &mut ExecutionEnvironmentStatus, now: SystemTime) {
    for lease in status.commands.iter_mut().filter(|l| l.is_open()) {
        lease.state = CommandLeaseState::Ended;
        lease.cancel_operation_id = None;
        lease.outcome = Some(CommandOutcome {
            state: CommandEndState::Cancelled,
            exit_code: -1,
            terminal_receipt: None,
            ended_at: RfcTime::from_system_time(now),
            reason: CommandEndReason::ExecutorReplaced,
        });
    }
}

/// The supervisor's words for a lease's recorded state, for answers built from the status.
pub fn view_of_ended(lease: &CommandLease) -> Option<CommandView> {
    let outcome = lease.outcome.as_ref()?;
    let state = match outcome.state {
        CommandEndState::Succeeded => CommandState::Succeeded,
        CommandEndState::Failed => CommandState::Failed,
        CommandEndState::Cancelled => CommandState::Cancelled,
        CommandEndState::FenceUnknown => CommandState::FenceUnknown,
    };
    Some(CommandView {
        command_id: lease.id.clone(),
        state,
        exit_code: outcome.exit_code,
        proven: outcome.terminal_receipt.is_some(),
        terminal_receipt: outcome.terminal_receipt.clone().unwrap_or_default(),
        started_at_ms: unix_ms(lease.started_at.to_system_time()),
        ended_at_ms: unix_ms(outcome.ended_at.to_system_time()),
        ..CommandView::default()
    })
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
