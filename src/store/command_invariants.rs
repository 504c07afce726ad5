//! The command-lease invariants of docs/commands.md §5.7 ([C1]-[C4]) over one status document
//! or one compare-and-swap transition; [`super::invariants`] checks them on every write.

use std::collections::{BTreeMap, BTreeSet};

use crate::kube::crd::{
    CommandLease, CommandLeaseState, ExecutionEnvironmentStatus, FenceState, MAX_COMMAND_LEASES,
    MAX_RUNNING_COMMANDS,
};

/// Why the leases of one status break an invariant.
pub fn violation(status: &ExecutionEnvironmentStatus) -> Option<&'static str> {
    let leases = &status.commands;
    let mut ids = BTreeSet::new();
    if leases.len() > MAX_COMMAND_LEASES || !leases.iter().all(|l| ids.insert(&l.id)) {
        return Some("[C1] at most 32 command leases, unique by id");
    }
    if leases.iter().filter(|l| l.is_open()).count() > MAX_RUNNING_COMMANDS {
        return Some("[C1] at most 16 command leases not ended");
    }
    if !leases.iter().all(well_shaped) {
        return Some(
            "[C1] an ended lease has an outcome, a cancelling one its cancel id, no other",
        );
    }
    let epoch = status.epoch.unwrap_or(0);
    let generation = status.grant_generation.unwrap_or(0);
    if leases
        .iter()
        .any(|l| l.epoch > epoch || l.grant_generation > generation)
    {
        return Some("[C2] a command lease is never newer than the environment");
    }
    let fenced = status.fence_state == Some(FenceState::FenceUnknown);
    if !fenced && leases.iter().any(|l| l.is_open() && l.epoch < epoch) {
        return Some("[C2] an open lease of an older epoch exists only while fenced");
    }
    let healthy = status.fence_state == Some(FenceState::Healthy);
    if healthy && status.lifecycle_operation.is_some() && leases.iter().any(CommandLease::is_open) {
        return Some("[C4] a lifecycle operation is admitted only with every command ended");
    }
    None
}

fn well_shaped(l: &CommandLease) -> bool {
    match l.state {
        CommandLeaseState::Running => l.outcome.is_none() && l.cancel_operation_id.is_none(),
        CommandLeaseState::Cancelling => l.outcome.is_none() && l.cancel_operation_id.is_some(),
        CommandLeaseState::Ended => l.outcome.is_some(),
    }
}

/// Why the leases' change from `before` to `after` breaks an invariant.
pub fn transition_violation(
    before: Option<&ExecutionEnvironmentStatus>,
    after: Option<&ExecutionEnvironmentStatus>,
) -> Option<&'static str> {
    let old: BTreeMap<&str, &CommandLease> = before
        .map(|s| s.commands.iter().map(|l| (l.id.as_str(), l)).collect())
        .unwrap_or_default();
    let new: &[CommandLease] = after.map(|s| s.commands.as_slice()).unwrap_or_default();
    let kept: BTreeSet<&str> = new.iter().map(|l| l.id.as_str()).collect();
    if old
        .values()
        .any(|l| l.is_open() && !kept.contains(l.id.as_str()))
    {
        return Some("[C3] a lease is removed only once ended");
    }
    for lease in new {
        match old.get(lease.id.as_str()) {
            Some(was) if was.state == CommandLeaseState::Ended && *was != lease => {
                return Some("[C3] an ended lease never changes");
            }
            Some(was) if !same_tuple(was, lease) => {
                return Some("[C3] a lease's claim tuple never changes");
            }
            Some(was)
                if was.state == CommandLeaseState::Cancelling
                    && lease.state == CommandLeaseState::Running =>
            {
                return Some("[C3] a cancelling lease never runs again");
            }
            Some(_) => {}
            None if !admissible(after, lease) => {
                return Some(
                    "[C3] a lease is admitted only Running, under the current claim, healthy, idle",
                );
            }
            None => {}
        }
    }
    None
}

fn same_tuple(a: &CommandLease, b: &CommandLease) -> bool {
    (
        &a.claim_id,
        &a.run_id,
        a.epoch,
        a.grant_generation,
        a.detached,
        &a.started_at,
    ) == (
        &b.claim_id,
        &b.run_id,
        b.epoch,
        b.grant_generation,
        b.detached,
        &b.started_at,
    )
}

/// A new lease: `Running`
/// under the status's current claim with the same tuple, Healthy, no lifecycle operation.
fn admissible(after: Option<&ExecutionEnvironmentStatus>, lease: &CommandLease) -> bool {
    let Some(status) = after else { return false };
    let current = status.active_run.as_ref().is_some_and(|run| {
        (
            run.claim_id.as_str(),
            run.run_id.as_str(),
            run.epoch,
            run.grant_generation,
        ) == (
            lease.claim_id.as_str(),
            lease.run_id.as_str(),
            lease.epoch,
            lease.grant_generation,
        )
    });
    current
        && lease.state == CommandLeaseState::Running
        && status.fence_state == Some(FenceState::Healthy)
        && status.lifecycle_operation.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::crd::{
        ActiveRun, CommandEndReason, CommandEndState, CommandOutcome, LifecycleOperation,
        LifecyclePhase, LifecycleType, RfcTime,
    };

    fn status() -> ExecutionEnvironmentStatus {
        ExecutionEnvironmentStatus {
            schema_version: Some(2),
            epoch: Some(3),
            grant_generation: Some(2),
            fence_state: Some(FenceState::Healthy),
            active_run: Some(ActiveRun {
                binding_id: "b".into(),
                run_id: "run".into(),
                claim_id: "claim".into(),
                operation_id: "op".into(),
                owner_hash: "o".into(),
                client_hash: "c".into(),
                epoch: 3,
                grant_generation: 2,
                expires_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
            }),
            ..ExecutionEnvironmentStatus::default()
        }
    }

    fn lease(id: &str) -> CommandLease {
        CommandLease {
            id: id.into(),
            claim_id: "claim".into(),
            run_id: "run".into(),
            epoch: 3,
            grant_generation: 2,
            detached: true,
            started_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
            state: CommandLeaseState::Running,
            cancel_operation_id: None,
            outcome: None,
        }
    }

    fn ended(id: &str) -> CommandLease {
        CommandLease {
            state: CommandLeaseState::Ended,
            outcome: Some(CommandOutcome {
                state: CommandEndState::Succeeded,
                exit_code: 0,
                terminal_receipt: None,
                ended_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
                reason: CommandEndReason::Exited,
            }),
            ..lease(id)
        }
    }

    fn with(leases: Vec<CommandLease>) -> ExecutionEnvironmentStatus {
        ExecutionEnvironmentStatus {
            commands: leases,
            ..status()
        }
    }

    #[test]
    fn c1_bounds_uniqueness_and_shape() {
        assert_eq!(violation(&with(vec![lease("a"), ended("b")])), None);
        assert!(violation(&with(vec![lease("a"), lease("a")])).is_some());
        let open: Vec<_> = (0..17).map(|i| lease(&format!("c{i}"))).collect();
        assert!(violation(&with(open)).is_some());
        let many: Vec<_> = (0..33).map(|i| ended(&format!("c{i}"))).collect();
        assert!(violation(&with(many)).is_some());
        let mut shapeless = lease("a");
        shapeless.state = CommandLeaseState::Cancelling;
        assert!(violation(&with(vec![shapeless])).is_some());
    }

    #[test]
    fn c2_leases_are_never_newer_and_older_open_ones_only_while_fenced() {
        let mut newer = lease("a");
        newer.epoch = 4;
        assert!(violation(&with(vec![newer])).is_some());
        let mut older = lease("a");
        older.epoch = 2;
        assert!(violation(&with(vec![older.clone()])).is_some());
        let mut fenced = with(vec![older]);
        fenced.fence_state = Some(FenceState::FenceUnknown);
        assert_eq!(violation(&fenced), None);
    }

    #[test]
    fn c3_admission_ends_and_immutability() {
        let before = with(vec![]);
        assert_eq!(
            transition_violation(Some(&before), Some(&with(vec![lease("a")]))),
            None
        );
        let mut other_claim = lease("a");
        other_claim.claim_id = "other".into();
        assert!(transition_violation(Some(&before), Some(&with(vec![other_claim]))).is_some());
        let mut fenced = with(vec![lease("a")]);
        fenced.fence_state = Some(FenceState::FenceUnknown);
        assert!(transition_violation(Some(&before), Some(&fenced)).is_some());
        let running = with(vec![lease("a")]);
        assert!(transition_violation(Some(&running), Some(&before)).is_some());
        assert_eq!(
            transition_violation(Some(&running), Some(&with(vec![ended("a")]))),
            None
        );
        let done = with(vec![ended("a")]);
        assert_eq!(transition_violation(Some(&done), Some(&before)), None);
        let mut rewritten = ended("a");
        rewritten.outcome.as_mut().unwrap().exit_code = 1;
        assert!(transition_violation(Some(&done), Some(&with(vec![rewritten]))).is_some());
        let mut moved = lease("a");
        moved.run_id = "another".into();
        assert!(transition_violation(Some(&running), Some(&with(vec![moved]))).is_some());
    }

    #[test]
    fn c4_no_lifecycle_operation_beside_an_open_lease() {
        let mut busy = with(vec![lease("a")]);
        busy.lifecycle_operation = Some(LifecycleOperation {
            id: "op".into(),
            type_: LifecycleType::RetireEnvironment,
            phase: LifecyclePhase::Quiescing,
            expected_epoch: None,
            expected_pod_uid: None,
            expected_pvc_uid: None,
            created_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
        });
        assert!(violation(&busy).is_some());
        busy.commands = vec![ended("a")];
        assert_eq!(violation(&busy), None);
    }
}
