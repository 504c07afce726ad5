//! The §10 invariants one version of an `ExecutionEnvironment`, compared with the version
//! before it, can show. The checker sees every version the replicas wrote (the write log), in
//! commit order, so "by exactly one" and "only together with" are judged exactly.

use std::collections::BTreeSet;

use execution_provider::kube::crd::{
    ConditionStatus, ExecutionEnvironmentStatus, FenceState, LifecyclePhase, LifecycleType,
};

/// What the checker remembers of one environment incarnation between versions.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    /// The previous version's status.
    pub(super) status: ExecutionEnvironmentStatus,
    /// Every (claim id, epoch, grant generation) an activeOperation was admitted under while
    /// its run was current.
    pub(super) operation_claims: BTreeSet<(String, u64, u64)>,
    /// Every activeOperation id seen (each is judged when it first appears).
    pub(super) operations: BTreeSet<String>,
    /// Lifecycle operations that ended (removed or completed): they never come back.
    pub(super) ended_lifecycles: BTreeSet<String>,
}

fn condition(status: &ExecutionEnvironmentStatus, kind: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == kind && c.status == ConditionStatus::True)
}

fn phase_rank(phase: LifecyclePhase) -> u8 {
    match phase {
        LifecyclePhase::Quiescing => 0,
        LifecyclePhase::WaitingForTermination => 1,
        LifecyclePhase::RemovingPodFinalizer => 2,
        LifecyclePhase::WaitingForPodDeletion => 3,
        LifecyclePhase::CreatingReplacement => 4,
        LifecyclePhase::DeletingPvc => 5,
        LifecyclePhase::ReleasingSlot => 6,
    }
}

/// Every operation id this status records (what a request with that id wrote).
pub(super) fn operation_ids(status: &ExecutionEnvironmentStatus) -> Vec<String> {
    let mut ids = Vec::new();
    if let Some(run) = &status.active_run {
        ids.push(run.operation_id.clone());
    }
    ids.extend(status.renew_receipts.iter().map(|r| r.operation_id.clone()));
    ids.extend(
        status
            .revocation_receipts
            .iter()
            .map(|r| r.operation_id.clone()),
    );
    ids.extend(status.references.iter().map(|r| r.operation_id.clone()));
    if let Some(op) = &status.lifecycle_operation {
        ids.push(op.id.clone());
    }
    ids
}

/// §10.15/§10.16: a fenced environment is left only by RecoverEnvironment, which writes a new
/// termination proof for the current epoch in the same version that clears the operation and
/// the run and makes it Healthy.
fn recovered(before: &ExecutionEnvironmentStatus, after: &ExecutionEnvironmentStatus) -> bool {
    let proof = after.termination_proof.as_ref();
    proof.is_some()
        && proof != before.termination_proof.as_ref()
        && proof.map(|p| p.epoch) == after.epoch
        && after.fence_state == Some(FenceState::Healthy)
        && after.active_operation.is_none()
        && after.active_run.is_none()
}

/// Checks one version against the previous one (`seen`, if the same incarnation was seen)
/// and returns the violations; updates `seen`.
pub(super) fn judge(
    name: &str,
    after: &ExecutionEnvironmentStatus,
    seen: &mut Seen,
) -> Vec<String> {
    let mut found = Vec::new();
    let before = seen.status.clone();
    let epoch = after.epoch.unwrap_or(0);
    let generation = after.grant_generation.unwrap_or(0);
    if before.epoch.is_some() {
        epochs(name, &before, after, &mut found);
        if generation != before.grant_generation.unwrap_or(0) {
            revocation(name, &before, after, &mut found);
        }
        receipts(name, &before, after, &mut found);
        runtime_identities(name, &before, after, &mut found);
        if before.fence_state == Some(FenceState::FenceUnknown)
            && after.fence_state != Some(FenceState::FenceUnknown)
            && !recovered(&before, after)
        {
            found.push(format!(
                "§10.15 {name} left FenceUnknown without RecoverEnvironment"
            ));
        }
        if let Some(op) = &before.active_operation
            && after.fence_state == Some(FenceState::FenceUnknown)
            && after.active_operation.as_ref().map(|o| &o.id) != Some(&op.id)
        {
            found.push(format!(
                "§10.15 {name} is FenceUnknown but its activeOperation {} was removed",
                op.id
            ));
        }
    }
    if let Some(run) = &after.active_run
        && run.epoch != epoch
    {
        found.push(format!(
            "§10.10 {name}: activeRun epoch {} differs from status epoch {epoch}",
            run.epoch
        ));
    }
    operation_admission(name, after, generation, seen, &mut found);
    command_leases(name, &before, after, seen, &mut found);
    lifecycle(name, &before, after, seen, &mut found);
    let mut bindings = BTreeSet::new();
    for reference in &after.references {
        if !bindings.insert(reference.binding_id.clone()) {
            found.push(format!(
                "§10.23 {name}: reference {} recorded twice",
                reference.binding_id
            ));
        }
    }
    if after.references.len() > 64 {
        found.push(format!("§10.23 {name}: more than 64 references"));
    }
    if after.renew_receipts.len() > 32 || after.revocation_receipts.len() > 32 {
        found.push(format!("§10.12 {name}: more than 32 receipts kept"));
    }
    seen.status = after.clone();
    found
}

/// §10.8: the epoch never decreases and rises by exactly one, only with a new claim or a
/// completed replacement.
fn epochs(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    found: &mut Vec<String>,
) {
    let (b, a) = (before.epoch.unwrap_or(0), after.epoch.unwrap_or(0));
    if a < b {
        found.push(format!("§10.8 epoch decreased on {name}: {b} -> {a}"));
    } else if a > b + 1 {
        found.push(format!(
            "§10.8 epoch of {name} jumped {b} -> {a} in one write"
        ));
    } else if a == b + 1 {
        let new_claim = after.active_run.as_ref().is_some_and(|run| {
            before.active_run.as_ref().map(|r| &r.claim_id) != Some(&run.claim_id)
        });
        let replaced =
            after.last_replacement.is_some() && after.last_replacement != before.last_replacement;
        if !new_claim && !replaced {
            found.push(format!(
                "§10.8 epoch of {name} rose to {a} without a new claim or a completed replacement"
            ));
        }
    }
    if let Some(done) = &after.last_replacement
        && after.last_replacement != before.last_replacement
        && (done.previous_epoch != b || done.replacement_epoch != a || a != b + 1)
    {
        found.push(format!(
            "§10.8 replacement {} of {name} recorded epochs {} -> {} while the epoch went {b} -> {a}",
            done.operation_id, done.previous_epoch, done.replacement_epoch
        ));
    }
}

/// §10.9 and §10.29: the grant generation changes only by revocation, by exactly one, with
/// its receipt, and never together with the epoch.
fn revocation(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    found: &mut Vec<String>,
) {
    let (b, a) = (
        before.grant_generation.unwrap_or(0),
        after.grant_generation.unwrap_or(0),
    );
    if a < b {
        found.push(format!(
            "§10.9 grantGeneration decreased on {name}: {b} -> {a}"
        ));
        return;
    }
    if a != b + 1 {
        found.push(format!(
            "§10.9 grantGeneration of {name} jumped {b} -> {a} in one write"
        ));
    }
    let receipt = after
        .revocation_receipts
        .iter()
        .any(|r| r.grant_generation == a && r.expected_grant_generation == b);
    if !receipt {
        found.push(format!(
            "§10.29 grantGeneration of {name} rose {b} -> {a} without a revocation receipt"
        ));
    }
    if after.epoch != before.epoch {
        found.push(format!(
            "§10.29 revocation of {name} changed the epoch {:?} -> {:?}",
            before.epoch, after.epoch
        ));
    }
}

/// §10.12 and §10.29: a recorded receipt never changes while it is kept.
fn receipts(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    found: &mut Vec<String>,
) {
    for receipt in &after.renew_receipts {
        let earlier = before
            .renew_receipts
            .iter()
            .find(|r| r.operation_id == receipt.operation_id);
        if let Some(earlier) = earlier
            && earlier != receipt
        {
            found.push(format!(
                "§10.12 {name}: renewal {} applied twice (its receipt changed)",
                receipt.operation_id
            ));
        }
    }
    for receipt in &after.revocation_receipts {
        let earlier = before
            .revocation_receipts
            .iter()
            .find(|r| r.operation_id == receipt.operation_id);
        if let Some(earlier) = earlier
            && earlier != receipt
        {
            found.push(format!(
                "§10.29 {name}: revocation {} applied twice (its receipt changed)",
                receipt.operation_id
            ));
        }
    }
}

/// §10.27: a recorded PVC is never replaced; a recorded Pod changes only through a
/// replacement (cleared first, then the new one recorded).
fn runtime_identities(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    found: &mut Vec<String>,
) {
    if let (Some(b), Some(a)) = (&before.pvc, &after.pvc)
        && b.uid != a.uid
    {
        found.push(format!(
            "§10.27 {name}: recorded PVC {} replaced by {}",
            b.uid, a.uid
        ));
    }
    if before.pvc.is_some() && after.pvc.is_none() {
        found.push(format!("§10.27 {name}: recorded PVC identity erased"));
    }
    if let (Some(b), Some(a)) = (&before.pod, &after.pod)
        && b.uid != a.uid
    {
        found.push(format!(
            "§10.27 {name}: recorded Pod {} silently replaced by {}",
            b.uid, a.uid
        ));
    }
}

/// §10.13 (and §10.29): an activeOperation is admitted only under the current claim, of the
/// current epoch and grant generation. Judged when it first appears: later a revocation or a
/// fence may end the run while the operation stays on record.
fn operation_admission(
    name: &str,
    after: &ExecutionEnvironmentStatus,
    generation: u64,
    seen: &mut Seen,
    found: &mut Vec<String>,
) {
    let epoch = after.epoch.unwrap_or(0);
    let Some(op) = after
        .active_operation
        .as_ref()
        .filter(|op| seen.operations.insert(op.id.clone()))
    else {
        return;
    };
    let run = after.active_run.as_ref().filter(|run| {
        run.claim_id == op.claim_id && run.run_id == op.run_id && run.epoch == op.epoch
    });
    match run {
        Some(run) if op.epoch == epoch && run.grant_generation == generation => {
            seen.operation_claims
                .insert((op.claim_id.clone(), op.epoch, run.grant_generation));
        }
        Some(run) if op.epoch == epoch => found.push(format!(
            "§10.29 {name}: activeOperation {} admitted under grant generation {} while the environment is at {generation}",
            op.operation, run.grant_generation
        )),
        _ => found.push(format!(
            "§10.13 {name}: activeOperation {} admitted under claim {} epoch {} while the current claim is {:?} at epoch {epoch}",
            op.operation,
            op.claim_id,
            op.epoch,
            after.active_run.as_ref().map(|r| r.claim_id.clone()),
        )),
    }
}

/// §10.25 (exact, single, idle and healthy admission; retirement with no reference) and
/// §10.28 (no phase regression, no completed operation coming back).
fn lifecycle(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    seen: &mut Seen,
    found: &mut Vec<String>,
) {
    if let Some(old) = &before.lifecycle_operation
        && after.lifecycle_operation.as_ref().map(|o| &o.id) != Some(&old.id)
    {
        seen.ended_lifecycles.insert(old.id.clone());
    }
    let Some(op) = &after.lifecycle_operation else {
        return;
    };
    if seen.ended_lifecycles.contains(&op.id) {
        found.push(format!(
            "§10.28 {name}: lifecycle operation {} came back after it ended",
            op.id
        ));
    }
    match &before.lifecycle_operation {
        Some(old) if old.id == op.id => {
            if phase_rank(op.phase) < phase_rank(old.phase) || old.type_ != op.type_ {
                found.push(format!(
                    "§10.28 {name}: lifecycle operation {} regressed {:?} -> {:?}",
                    op.id, old.phase, op.phase
                ));
            }
            if after.epoch != before.epoch
                || after.pvc.as_ref().map(|p| &p.uid) != before.pvc.as_ref().map(|p| &p.uid)
            {
                found.push(format!(
                    "§10.28 {name}: epoch or PVC changed during lifecycle operation {}",
                    op.id
                ));
            }
        }
        Some(old) => found.push(format!(
            "§10.25 {name}: lifecycle operation {} admitted while {} was active",
            op.id, old.id
        )),
        None if before.epoch.is_some() => admission(name, before, after, found),
        None => {}
    }
}

/// §10.25: what a newly admitted lifecycle operation requires of the environment.
fn admission(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    found: &mut Vec<String>,
) {
    let Some(op) = &after.lifecycle_operation else {
        return;
    };
    let mut why = Vec::new();
    let pvc = after.pvc.as_ref().map(|p| p.uid.clone());
    if op.expected_pvc_uid != pvc {
        why.push("the PVC is not the expected one");
    }
    if execution_provider::reconciler::recovery::is_recovery(op) {
        // The reconciler's automatic recovery (DECISIONS 15 as amended): admitted only on a
        // fenced environment, for exactly its epoch and Pod; the operation and claim it keeps
        // are cleared by the proof write, not by the admission.
        let pod = after.pod.as_ref().map(|p| p.uid.clone());
        if before.fence_state != Some(FenceState::FenceUnknown) {
            why.push("an automatic recovery needs a fenced environment");
        }
        if op.expected_epoch != after.epoch || op.expected_pod_uid != pod {
            why.push("the epoch or Pod is not the expected one");
        }
    } else {
        ordinary_admission(before, after, op, &mut why);
    }
    if !why.is_empty() {
        found.push(format!(
            "§10.25 {name}: lifecycle operation {} ({:?}) admitted although {}",
            op.id,
            op.type_,
            why.join(", ")
        ));
    }
}

/// §10.25 for an administrator's (or an upgrade's) admission: idle and healthy.
fn ordinary_admission(
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    op: &execution_provider::kube::crd::LifecycleOperation,
    why: &mut Vec<&'static str>,
) {
    if after.active_operation.is_some() {
        why.push("an operation is active");
    }
    if before.fence_state != Some(FenceState::Healthy) {
        why.push("it is not healthy");
    }
    if !after.references.is_empty() && op.type_ != LifecycleType::ReplaceExecutor {
        why.push("it has references");
    }
    match op.type_ {
        LifecycleType::DeleteRetiredEnvironment => {
            if before.active_run.is_some() {
                why.push("a run claim (even expired) is recorded");
            }
            if !condition(after, "Retired") || !condition(after, "ExecutorTerminated") {
                why.push("it is not retired with its executor terminated");
            }
        }
        _ => {
            let pod = after.pod.as_ref().map(|p| p.uid.clone());
            if op.expected_epoch != after.epoch || op.expected_pod_uid != pod {
                why.push("the epoch or Pod is not the expected one");
            }
            if after.active_run.is_some() {
                why.push("a run claim survived the admission");
            }
            let proof = after.termination_proof.as_ref().is_some_and(|p| {
                Some(&p.pod_uid) == op.expected_pod_uid.as_ref()
                    && Some(&p.pvc_uid) == op.expected_pvc_uid.as_ref()
                    && Some(p.epoch) == op.expected_epoch
            });
            if !condition(before, "Ready") && !proof {
                why.push("it was neither Ready nor proven terminated");
            }
        }
    }
}

/// The command leases (docs/commands.md §5.7, [C1]-[C4]): each version and each change from
/// the one before, judged by the store's own lease invariants; a lease that appears is an
/// admission under its claim tuple, which acknowledged command starts are judged against
/// (§10.13).
fn command_leases(
    name: &str,
    before: &ExecutionEnvironmentStatus,
    after: &ExecutionEnvironmentStatus,
    seen: &mut Seen,
    found: &mut Vec<String>,
) {
    use execution_provider::store::command_invariants::{transition_violation, violation};
    let earlier = before.epoch.is_some().then_some(before);
    if let Some(why) = violation(after).or_else(|| transition_violation(earlier, Some(after))) {
        found.push(format!("§5.7 {name}: {why}"));
    }
    for lease in &after.commands {
        if !before.commands.iter().any(|l| l.id == lease.id) {
            seen.operation_claims.insert((
                lease.claim_id.clone(),
                lease.epoch,
                lease.grant_generation,
            ));
        }
    }
}
