//! The store invariants of spec §10 that one status document, or one compare-and-swap
//! transition, can show. [`crate::store::cas::update_status`] checks every write with
//! `debug_assert!`, so they hold in every test and simulator run (debug builds); production
//! builds skip them. The command-lease invariants [C1]-[C4] are in
//! [`super::command_invariants`].

use super::intents::MAX_REFERENCES;
use crate::kube::crd::{ExecutionEnvironment, FenceState};

/// Receipts kept per ledger (renewals, revocations).
const MAX_RECEIPTS: usize = 32;

/// Why a status document breaks an invariant (the number of spec §10 in brackets).
pub fn violation(o: &ExecutionEnvironment) -> Option<&'static str> {
    let status = o.status.as_ref()?;
    let mut bindings = std::collections::BTreeSet::new();
    if status.references.len() > MAX_REFERENCES
        || !status
            .references
            .iter()
            .all(|r| bindings.insert(&r.binding_id))
    {
        return Some("[23] at most 64 references, unique by binding");
    }
    let epoch = status.epoch.unwrap_or(0);
    let generation = status.grant_generation.unwrap_or(0);
    if epoch > 0 && generation == 0 {
        return Some("[4] an initialized status has a grant generation");
    }
    if let Some(run) = &status.active_run
        && (run.epoch > epoch || run.grant_generation > generation)
    {
        return Some("[9.2] a claim is never newer than the environment");
    }
    if let Some(op) = &status.active_operation {
        if op.epoch > epoch {
            return Some("[8] an operation is never newer than the environment");
        }
        if status.lifecycle_operation.is_some() && status.fence_state == Some(FenceState::Healthy) {
            return Some("[25] a lifecycle operation is admitted only when idle");
        }
    }
    if status.renew_receipts.len() > MAX_RECEIPTS || status.revocation_receipts.len() > MAX_RECEIPTS
    {
        return Some("[29] receipt ledgers are bounded");
    }
    super::command_invariants::violation(status)
}

/// Why a write from `before` to `after` breaks an invariant.
pub fn transition_violation(
    before: &ExecutionEnvironment,
    after: &ExecutionEnvironment,
) -> Option<&'static str> {
    if let Some(v) = violation(after) {
        return Some(v);
    }
    if before.spec != after.spec {
        return Some("[1] the store never rewrites the spec");
    }
    let (b, a) = (before.status.as_ref(), after.status.as_ref());
    let epoch = |s: Option<&crate::kube::crd::ExecutionEnvironmentStatus>| {
        s.and_then(|s| s.epoch).unwrap_or(0)
    };
    let generation = |s: Option<&crate::kube::crd::ExecutionEnvironmentStatus>| {
        s.and_then(|s| s.grant_generation).unwrap_or(0)
    };
    if epoch(a) < epoch(b) {
        return Some("[9.2] the epoch never decreases");
    }
    if generation(a) < generation(b) {
        return Some("[29] the grant generation never decreases");
    }
    if generation(a) > generation(b) + 1 {
        return Some("[29] revocation bumps the generation by one");
    }
    let was_fenced = b.and_then(|s| s.fence_state) == Some(FenceState::FenceUnknown);
    let healthy_now = a.and_then(|s| s.fence_state) == Some(FenceState::Healthy);
    let proof_written = a.and_then(|s| s.termination_proof.as_ref())
        != b.and_then(|s| s.termination_proof.as_ref());
    if was_fenced && healthy_now && !proof_written {
        return Some("[16] only a recovery with a termination proof clears the fence");
    }
    if let Some(recorded) = a.and_then(|s| s.recovered_operation.as_ref())
        && Some(recorded) != b.and_then(|s| s.recovered_operation.as_ref())
    {
        let was_active = b
            .and_then(|s| s.active_operation.as_ref())
            .is_some_and(|op| op.id == recorded.id);
        let cleared = a.and_then(|s| s.active_operation.as_ref()).is_none();
        if !was_active || !cleared || was_fenced {
            return Some(
                "[recovered] an operation's outcome is recorded only as that unfenced operation is cleared",
            );
        }
    }
    super::command_invariants::transition_violation(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::crd::{ExecutionEnvironmentStatus, ReferenceRecord, ReferenceState, RfcTime};

    fn with_status(status: ExecutionEnvironmentStatus) -> ExecutionEnvironment {
        let mut o = ExecutionEnvironment::new(
            "exec-x",
            serde_json::from_value(serde_json::json!({
                "schemaVersion": 2, "allocationID": "exec-x", "revision": "r", "ownerHash": "o",
                "clientHash": "c", "bindingID": "b", "requestFingerprint": "f", "templateID": "t",
                "templateRevision": "v", "templateDigest": "d", "image": "i", "storageClass": "s",
                "storageSize": "1Gi", "resources": {"cpuRequest": "1", "memoryRequest": "1",
                "cpuLimit": "1", "memoryLimit": "1"}, "desired": "Active"
            }))
            .expect("spec"),
        );
        o.status = Some(status);
        o
    }

    fn initialized(epoch: u64, generation: u64) -> ExecutionEnvironmentStatus {
        ExecutionEnvironmentStatus {
            schema_version: Some(2),
            epoch: Some(epoch),
            grant_generation: Some(generation),
            fence_state: Some(FenceState::Healthy),
            ..ExecutionEnvironmentStatus::default()
        }
    }

    #[test]
    fn duplicate_references_are_a_violation() {
        let record = ReferenceRecord {
            binding_id: "b".into(),
            state: ReferenceState::Published,
            operation_id: "op".into(),
            source_binding_id: None,
            created_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
        };
        let mut status = initialized(1, 1);
        status.references = vec![record.clone(), record];
        assert!(violation(&with_status(status)).is_some());
        assert!(violation(&with_status(initialized(1, 1))).is_none());
    }

    #[test]
    fn epochs_and_generations_never_go_back_and_revocation_moves_by_one() {
        let (a, b) = (
            with_status(initialized(3, 2)),
            with_status(initialized(2, 2)),
        );
        assert!(transition_violation(&a, &b).is_some());
        let c = with_status(initialized(3, 1));
        assert!(transition_violation(&a, &c).is_some());
        let d = with_status(initialized(3, 4));
        assert!(transition_violation(&a, &d).is_some());
        let e = with_status(initialized(4, 3));
        assert!(transition_violation(&a, &e).is_none());
    }

    #[test]
    fn an_outcome_is_recorded_only_as_its_operation_is_cleared() {
        use crate::kube::crd::{ActiveOperation, RecoveredOperation};
        let at = RfcTime::from_system_time(std::time::UNIX_EPOCH);
        let op = ActiveOperation {
            id: "op-1".into(),
            operation: "command".into(),
            started_at: at,
            claim_id: "c".into(),
            run_id: "r".into(),
            epoch: 1,
            holder_id: "h".into(),
            renewed_at: at,
            expires_at: at,
        };
        let mut running = initialized(1, 1);
        running.active_operation = Some(op);
        let mut recorded = initialized(1, 1);
        recorded.recovered_operation = Some(RecoveredOperation {
            id: "op-1".into(),
            operation: "command".into(),
            state: "succeeded".into(),
            terminal_receipt: "ab".into(),
            cancelled_by_recovery: false,
            recorded_at: at,
        });
        let before = with_status(running.clone());
        assert!(transition_violation(&before, &with_status(recorded.clone())).is_none());
        // Recorded while the operation stays on record, or for another operation.
        let mut kept = recorded.clone();
        kept.active_operation = running.active_operation.clone();
        assert!(transition_violation(&before, &with_status(kept)).is_some());
        let mut other = recorded.clone();
        other.recovered_operation.as_mut().unwrap().id = "op-2".into();
        assert!(transition_violation(&before, &with_status(other)).is_some());
        // Recorded over a fence.
        let mut fenced = running;
        fenced.fence_state = Some(FenceState::FenceUnknown);
        let mut still_fenced = recorded;
        still_fenced.fence_state = Some(FenceState::FenceUnknown);
        assert!(transition_violation(&with_status(fenced), &with_status(still_fenced)).is_some());
    }

    #[test]
    fn only_a_recorded_proof_clears_the_fence() {
        let mut fenced = initialized(2, 1);
        fenced.fence_state = Some(FenceState::FenceUnknown);
        let (a, b) = (with_status(fenced), with_status(initialized(2, 1)));
        assert!(transition_violation(&a, &b).is_some());
    }
}
