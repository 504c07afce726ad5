//! Commands that ended by themselves (docs/commands.md §5.6): their leases still say
//! `Running` until a status write that touches the claim's commands asks the supervisor's
//! `list` first and ends each lease the supervisor reports ended (reason `Exited`, its state,
//! exit code and receipt) in that same write. A detached start and a cancel do it; a claim's
//! end records every lease of the claim anyway (§5.5). Asking costs one round trip and no
//! write; without an answer nothing is recorded and the caller goes on.

use std::time::SystemTime;

use super::ClaimContext;
use super::command_leases as leases;
use crate::executor::protocol::CommandState;
use crate::executor::supervisor_protocol::{
    CommandView, MAX_LIST, SupervisorReply, SupervisorRequest,
};
use crate::executor::transport::SupervisorSession;
use crate::kube::crd::{
    CommandEndReason, CommandLease, CommandLeaseState, ExecutionEnvironment,
    ExecutionEnvironmentStatus,
};

/// A lease of `rc`'s claim that the status still has running.
fn running_of(lease: &CommandLease, rc: &ClaimContext) -> bool {
    lease.state == CommandLeaseState::Running && leases::owned_by(lease, rc)
}

/// The commands of `rc`'s claim that the supervisor reports ended while `observed` still has
/// their leases `Running`. Asks only when there is such a lease.
pub(super) async fn self_ended(
    session: &mut SupervisorSession,
    observed: &ExecutionEnvironment,
    rc: &ClaimContext,
) -> Vec<CommandView> {
    let mut commands = observed.status.iter().flat_map(|s| s.commands.iter());
    if !commands.any(|l| running_of(l, rc)) {
        return Vec::new();
    }
    // The supervisor lists the claim's entries in no particular order (running and finished
    // alike), so the whole list is asked for: a limit of 16 (the open leases' bound) cut off
    // commands whose leases were still open once the claim had more entries than that.
    let request = SupervisorRequest::List {
        claim: leases::tuple_of(rc),
        limit: MAX_LIST as u64,
    };
    match session.call(&request).await {
        Ok(SupervisorReply::StatusList { commands }) => commands
            .into_iter()
            .filter(|view| view.state != CommandState::Running)
            .collect(),
        Ok(_) | Err(_) => Vec::new(),
    }
}

/// Ends each lease of `rc`'s claim that is still `Running` in `status` and that `ended`
/// reports ended, with its outcome; answers whether any changed.
pub(super) fn record_self_ended(
    status: &mut ExecutionEnvironmentStatus,
    rc: &ClaimContext,
    ended: &[CommandView],
    now: SystemTime,
) -> bool {
    let mut changed = false;
    for view in ended {
        let running = status
            .commands
            .iter()
            .any(|l| l.id == view.command_id && running_of(l, rc));
        if running {
            let outcome = leases::outcome_of(view, CommandEndReason::Exited, now);
            changed |= leases::end(status, &view.command_id, outcome);
        }
    }
    changed
}
