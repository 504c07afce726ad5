//! The checker has teeth: each §10 invariant it judges reports a violation when shown a
//! history that breaks it, and stays quiet on the same history without the break.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use sim::executor::MemExecutor;
use sim::invariants::{Acknowledged, Checker, History, Incarnation, Revoked};
use sim::writes::Written;

const T: &str = "2026-01-01T00:00:00Z";

fn checker() -> Checker {
    Checker::new(&BTreeMap::from([("default".to_owned(), 2)]))
}

fn spec(name: &str) -> Value {
    json!({
        "schemaVersion": 2, "allocationID": name, "revision": "r1", "ownerHash": "o",
        "clientHash": "c", "bindingID": "b", "requestFingerprint": "f", "templateID": "default",
        "templateRevision": "v1-x", "templateDigest": "sha256:x", "image": "i@sha256:x",
        "storageClass": "s", "storageSize": "1Gi",
        "resources": {"cpuRequest": "1", "memoryRequest": "1", "cpuLimit": "1", "memoryLimit": "1"},
        "desired": "Active"
    })
}

fn status(epoch: u64, generation: u64) -> Value {
    json!({
        "schemaVersion": 2, "epoch": epoch, "grantGeneration": generation,
        "fenceState": "Healthy",
        "pvc": {"name": "workspace-a", "uid": "pvc-1"}, "pod": {"name": "executor-a", "uid": "pod-1"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                        "observedGeneration": 1, "lastTransitionTime": T}]
    })
}

fn run(claim: &str, epoch: u64, generation: u64) -> Value {
    json!({"bindingID": "b", "runID": "run", "claimID": claim, "operationID": format!("acquire-{claim}"),
           "ownerHash": "o", "clientHash": "c", "epoch": epoch, "grantGeneration": generation,
           "expiresAt": T})
}

fn env(rv: u64, status: Value) -> Written {
    Written {
        method: "PUT".into(),
        path: "/apis/execution.mecatl.dev/v1alpha1/namespaces/execution/executionenvironments/exec-a/status".into(),
        object: json!({
            "apiVersion": "execution.mecatl.dev/v1alpha1", "kind": "ExecutionEnvironment",
            "metadata": {"name": "exec-a", "uid": "u1", "resourceVersion": rv.to_string()},
            "spec": spec("exec-a"), "status": status
        }),
    }
}

/// `exec-a` as clients name it, in the incarnation of this revision.
fn incarnation(revision: &str) -> Incarnation {
    Incarnation {
        name: "exec-a".into(),
        revision: revision.into(),
    }
}

/// A version of a later incarnation of `exec-a` (deleted, then ensured again): another UID
/// and revision under the same name.
fn reincarnated(rv: u64, status: Value) -> Written {
    let mut written = env(rv, status);
    written.object["metadata"]["uid"] = json!("u2");
    written.object["spec"]["revision"] = json!("r2");
    written
}

fn violations(writes: &[Written]) -> Vec<String> {
    let mut checker = checker();
    checker.observe_writes(writes);
    checker.violations().to_vec()
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base[key] = value;
    base
}

#[test]
fn a_claim_raises_the_epoch_by_one_and_a_jump_is_reported() {
    let claimed = with(status(2, 1), "activeRun", run("c1", 2, 1));
    assert!(violations(&[env(1, status(1, 1)), env(2, claimed)]).is_empty());
    let jumped = with(status(3, 1), "activeRun", run("c1", 3, 1));
    let found = violations(&[env(1, status(1, 1)), env(2, jumped)]);
    assert!(found.iter().any(|v| v.contains("§10.8")), "{found:?}");
}

#[test]
fn a_generation_raised_without_a_revocation_receipt_is_reported() {
    let receipt = json!([{"operationID": "rev-1", "fingerprint": "f", "expectedGrantGeneration": 1, "grantGeneration": 2}]);
    let revoked = with(status(1, 2), "revocationReceipts", receipt);
    assert!(violations(&[env(1, status(1, 1)), env(2, revoked)]).is_empty());
    let found = violations(&[env(1, status(1, 1)), env(2, status(1, 2))]);
    assert!(found.iter().any(|v| v.contains("§10.29")), "{found:?}");
}

#[test]
fn a_renewal_receipt_that_changes_is_reported() {
    let receipt =
        |expiry: &str| json!([{"operationID": "renew-1", "fingerprint": "f", "expiresAt": expiry}]);
    let first = with(status(1, 1), "renewReceipts", receipt(T));
    let again = with(
        status(1, 1),
        "renewReceipts",
        receipt("2026-01-01T00:00:30Z"),
    );
    let found = violations(&[env(1, first.clone()), env(2, again)]);
    assert!(found.iter().any(|v| v.contains("§10.12")), "{found:?}");
    assert!(violations(&[env(1, first.clone()), env(2, first)]).is_empty());
}

#[test]
fn an_operation_admitted_under_an_old_generation_is_reported() {
    let op = json!({"id": "op-1", "operation": "file", "startedAt": T, "claimID": "c1", "runID": "run",
                    "epoch": 2, "holderID": "h", "renewedAt": T, "expiresAt": T});
    let current = with(
        with(status(2, 1), "activeRun", run("c1", 2, 1)),
        "activeOperation",
        op.clone(),
    );
    assert!(violations(&[env(1, current)]).is_empty());
    let stale = with(
        with(status(2, 2), "activeRun", run("c1", 2, 1)),
        "activeOperation",
        op,
    );
    let found = violations(&[env(1, stale)]);
    assert!(found.iter().any(|v| v.contains("§10.29")), "{found:?}");
}

#[test]
fn a_fence_cleared_without_a_recovery_proof_is_reported() {
    let op = json!({"id": "op-1", "operation": "file", "startedAt": T, "claimID": "c1", "runID": "run",
                    "epoch": 2, "holderID": "h", "renewedAt": T, "expiresAt": T});
    let running = with(
        with(status(2, 1), "activeRun", run("c1", 2, 1)),
        "activeOperation",
        op,
    );
    let fenced = with(running.clone(), "fenceState", json!("FenceUnknown"));
    let cleared = status(2, 1);
    let found = violations(&[
        env(1, running.clone()),
        env(2, fenced.clone()),
        env(3, cleared.clone()),
    ]);
    assert!(found.iter().any(|v| v.contains("§10.15")), "{found:?}");
    let proof = json!({"operationID": "recover-1", "podUID": "pod-1", "pvcUID": "pvc-1", "epoch": 2,
                       "podPhase": "Failed", "observedAt": T});
    let recovered = with(cleared, "terminationProof", proof);
    let found = violations(&[env(1, running), env(2, fenced), env(3, recovered)]);
    assert!(found.is_empty(), "{found:?}");
}

fn lifecycle(kind: &str, phase: &str) -> Value {
    json!({"id": "life-1", "type": kind, "phase": phase, "expectedEpoch": 1,
           "expectedPodUID": "pod-1", "expectedPVCUID": "pvc-1", "createdAt": T})
}

#[test]
fn a_retirement_admitted_while_an_operation_runs_or_references_remain_is_reported() {
    let admitted = with(
        status(1, 1),
        "lifecycleOperation",
        lifecycle("RetireEnvironment", "Quiescing"),
    );
    assert!(violations(&[env(1, status(1, 1)), env(2, admitted.clone())]).is_empty());
    let refs =
        json!([{"bindingID": "b", "state": "Published", "operationID": "e", "createdAt": T}]);
    let referenced = with(admitted, "references", refs);
    let found = violations(&[env(1, status(1, 1)), env(2, referenced)]);
    assert!(found.iter().any(|v| v.contains("§10.25")), "{found:?}");
}

#[test]
fn a_lifecycle_phase_that_goes_back_is_reported() {
    let at = |phase| {
        with(
            status(1, 1),
            "lifecycleOperation",
            lifecycle("ReplaceExecutor", phase),
        )
    };
    let forward = [
        env(1, status(1, 1)),
        env(2, at("Quiescing")),
        env(3, at("WaitingForTermination")),
    ];
    assert!(violations(&forward).is_empty());
    let back = [
        env(1, status(1, 1)),
        env(2, at("WaitingForTermination")),
        env(3, at("Quiescing")),
    ];
    let found = violations(&back);
    assert!(found.iter().any(|v| v.contains("§10.28")), "{found:?}");
}

fn pod(rv: u64, finalizers: Value) -> Written {
    Written {
        method: "PUT".into(),
        path: "/api/v1/namespaces/execution/pods/executor-a".into(),
        object: json!({"kind": "Pod", "metadata": {"name": "executor-a", "uid": "pod-1",
            "resourceVersion": rv.to_string(), "finalizers": finalizers,
            "labels": {"execution.mecatl.dev/environment": "exec-a"},
            "ownerReferences": [{"apiVersion": "execution.mecatl.dev/v1alpha1",
                "kind": "ExecutionEnvironment", "name": "exec-a", "uid": "u1", "controller": true}]}}),
    }
}

#[test]
fn a_pod_finalizer_removed_before_the_termination_proof_is_reported() {
    let finalizer = json!(["execution.mecatl.dev/verify-termination"]);
    let found = violations(&[
        env(1, status(1, 1)),
        pod(2, finalizer.clone()),
        pod(3, json!([])),
    ]);
    assert!(found.iter().any(|v| v.contains("§10.26")), "{found:?}");
    let proof = json!({"operationID": "life-1", "podUID": "pod-1", "pvcUID": "pvc-1", "epoch": 1,
                       "podPhase": "Succeeded", "observedAt": T});
    let proven = with(status(1, 1), "terminationProof", proof);
    assert!(
        violations(&[
            env(1, proven.clone()),
            pod(2, finalizer.clone()),
            pod(3, json!([]))
        ])
        .is_empty()
    );
    // The Pod is judged against its own incarnation's proof, not a later incarnation's.
    assert!(
        violations(&[
            env(1, proven),
            reincarnated(2, status(1, 1)),
            pod(3, finalizer),
            pod(4, json!([]))
        ])
        .is_empty()
    );
}

#[test]
fn a_pvc_deleted_without_an_admitted_deletion_is_reported() {
    let delete = Written {
        method: "DELETE".into(),
        path: "/api/v1/namespaces/execution/persistentvolumeclaims/workspace-a".into(),
        object: json!({"kind": "PersistentVolumeClaim", "metadata": {"name": "workspace-a",
            "uid": "pvc-1", "resourceVersion": "9"}}),
    };
    let found = violations(&[env(1, status(1, 1)), delete.clone()]);
    assert!(found.iter().any(|v| v.contains("§10.27")), "{found:?}");
    let admitted = with(
        status(1, 1),
        "lifecycleOperation",
        lifecycle("DeleteRetiredEnvironment", "DeletingPVC"),
    );
    assert!(violations(&[env(1, admitted), delete]).is_empty());
}

fn ledger(names: &[&str]) -> Value {
    let key = execution_provider::kube::crd::ledger_key("default");
    json!({"kind": "ConfigMap", "metadata": {"name": "mecatl-execution-profile-allocations",
        "resourceVersion": "1"}, "data": {key: serde_json::to_string(names).unwrap()}})
}

#[test]
fn a_ledger_over_the_limit_or_a_create_before_its_slot_is_reported() {
    let write = |object: Value| Written {
        method: "PUT".into(),
        path: "/cm".into(),
        object,
    };
    let found = violations(&[write(ledger(&["exec-a", "exec-b", "exec-c"]))]);
    assert!(found.iter().any(|v| v.contains("§10.21")), "{found:?}");
    let create = Written {
        method: "POST".into(),
        ..env(2, status(1, 1))
    };
    let found = violations(&[write(ledger(&["exec-b"])), create.clone()]);
    assert!(found.iter().any(|v| v.contains("§10.21")), "{found:?}");
    assert!(violations(&[write(ledger(&["exec-a"])), create]).is_empty());
}

/// Ledger shard `index` holding `names` for template `default` in the sharded format.
fn shard(index: usize, names: &[&str]) -> Value {
    let key = execution_provider::kube::crd::ledger_slots_key("default");
    let slots: Vec<(String, u64)> = names.iter().map(|n| ((*n).to_owned(), 0)).collect();
    json!({"kind": "ConfigMap", "metadata": {
        "name": execution_provider::kube::crd::ledger_shard_name(index), "resourceVersion": "1"},
        "data": {key: json!({"slots": slots}).to_string()}})
}

#[test]
fn the_sharded_ledger_counts_over_every_shard_and_a_late_landed_create_needs_no_slot() {
    let write = |object: Value| Written {
        method: "PUT".into(),
        path: "/cm".into(),
        object,
    };
    assert!(violations(&[write(shard(0, &["exec-a"])), write(shard(3, &["exec-b"]))]).is_empty());
    let found = violations(&[
        write(shard(0, &["exec-a"])),
        write(shard(3, &["exec-b", "exec-c"])),
    ]);
    assert!(found.iter().any(|v| v.contains("§10.21")), "{found:?}");
    let mut create = Written {
        method: "POST".into(),
        ..env(2, status(1, 1))
    };
    let found = violations(&[write(shard(3, &["exec-b"])), create.clone()]);
    assert!(found.iter().any(|v| v.contains("§10.21")), "{found:?}");
    assert!(violations(&[write(shard(3, &["exec-a"])), create.clone()]).is_empty());
    create.object["spec"]["createDeadline"] = json!("2026-12-01T00:00:00Z");
    create.object["metadata"]["creationTimestamp"] = json!("2026-12-01T00:00:01Z");
    assert!(
        violations(&[write(shard(3, &["exec-b"])), create]).is_empty(),
        "a create landed after its deadline is void"
    );
}

#[test]
fn live_environments_beyond_the_limit_are_reported() {
    let live = |name: &str| json!({"metadata": {"name": name}, "spec": spec(name)});
    let mut checker = checker();
    checker.observe_state(
        &[live("exec-a"), live("exec-b")],
        &[ledger(&["exec-a", "exec-b"])],
    );
    assert!(checker.violations().is_empty());
    checker.observe_state(&[live("exec-a"), live("exec-b")], &[ledger(&["exec-c"])]);
    assert!(checker.violations().iter().any(|v| v.contains("§10.21")));
}

#[test]
fn a_call_honoured_after_an_acknowledged_revocation_or_a_refused_write_is_reported() {
    let op = json!({"id": "op-1", "operation": "file", "startedAt": T, "claimID": "c1", "runID": "run",
                    "epoch": 2, "holderID": "h", "renewedAt": T, "expiresAt": T});
    let admitted = with(
        with(status(2, 1), "activeRun", run("c1", 2, 1)),
        "activeOperation",
        op,
    );
    let executor = MemExecutor::new(1, 0.0, Duration::from_millis(1));
    let ack = |sent_ms| Acknowledged {
        environment: incarnation("r1"),
        claim_id: "c1".into(),
        epoch: 2,
        grant_generation: 1,
        sent_ms,
        what: "file".into(),
    };
    let revoked = vec![Revoked {
        environment: incarnation("r1"),
        grant_generation: 2,
        answered_ms: 100,
    }];
    let judge = |history: History| {
        let mut checker = checker();
        checker.observe_writes(&[env(1, admitted.clone())]);
        checker.finish(&history, &executor, &[]);
        checker.violations().to_vec()
    };
    let before = History {
        acknowledged: vec![ack(50)],
        revoked: revoked.clone(),
        ..History::default()
    };
    assert!(judge(before).is_empty());
    let after = History {
        acknowledged: vec![ack(150)],
        revoked,
        ..History::default()
    };
    assert!(judge(after).iter().any(|v| v.contains("§10.29")));
    let refused = History {
        refused: ["acquire-c1".to_owned()].into(),
        ..History::default()
    };
    assert!(judge(refused).iter().any(|v| v.contains("§10.6")));
}

#[test]
fn a_security_authority_ledger_that_moves_back_is_reported() {
    let write = |generation: u64, digest: &str| Written {
        method: "PUT".into(),
        path: "/cm".into(),
        object: json!({"kind": "ConfigMap", "metadata": {"name": "execution-provider-security-authority",
            "resourceVersion": "1"},
            "data": {"state.json": json!({"generation": generation, "digest": digest}).to_string()}}),
    };
    assert!(violations(&[write(1, "a"), write(2, "b"), write(2, "b")]).is_empty());
    let found = violations(&[write(2, "b"), write(1, "a")]);
    assert!(found.iter().any(|v| v.contains("rolled back")), "{found:?}");
    let found = violations(&[write(2, "b"), write(2, "c")]);
    assert!(found.iter().any(|v| v.contains("drifted")), "{found:?}");
}

/// Regression swarm 1061385739: a revocation of one incarnation (to generation 2) says nothing
/// of a later incarnation under the same name, whose generations start at 1 again; the same
/// call on the revoked incarnation itself is still reported.
#[test]
fn every_history_is_judged_within_its_own_incarnation() {
    let op = |claim: &str| {
        json!({"id": format!("op-{claim}"), "operation": "file", "startedAt": T, "claimID": claim,
               "runID": "run", "epoch": 2, "holderID": "h", "renewedAt": T, "expiresAt": T})
    };
    let admitted = |claim: &str| {
        with(
            with(status(2, 1), "activeRun", run(claim, 2, 1)),
            "activeOperation",
            op(claim),
        )
    };
    let executor = MemExecutor::new(1, 0.0, Duration::from_millis(1));
    let ack = |revision: &str, claim: &str| Acknowledged {
        environment: incarnation(revision),
        claim_id: claim.into(),
        epoch: 2,
        grant_generation: 1,
        sent_ms: 10_631,
        what: "command".into(),
    };
    let judge = |history: History, stored: &[Value]| {
        let mut checker = checker();
        checker.observe_writes(&[env(1, admitted("c1")), reincarnated(2, admitted("c2"))]);
        checker.finish(&history, &executor, stored);
        checker.violations().to_vec()
    };
    let revoked_first = vec![Revoked {
        environment: incarnation("r1"),
        grant_generation: 2,
        answered_ms: 2_013,
    }];
    let on_the_new_one = History {
        acknowledged: vec![ack("r2", "c2")],
        revoked: revoked_first.clone(),
        ..History::default()
    };
    assert_eq!(judge(on_the_new_one, &[]), Vec::<String>::new());
    let on_the_revoked_one = History {
        acknowledged: vec![ack("r1", "c1")],
        revoked: revoked_first,
        ..History::default()
    };
    let found = judge(on_the_revoked_one, &[]);
    assert!(found.iter().any(|v| v.contains("§10.29")), "{found:?}");
    // A claim that held an operation on the first incarnation proves nothing on the second.
    let crossed = History {
        acknowledged: vec![ack("r2", "c1")],
        ..History::default()
    };
    let found = judge(crossed, &[]);
    assert!(found.iter().any(|v| v.contains("§10.13")), "{found:?}");
    // Deleting the first incarnation does not excuse losing the second.
    let stored_second = reincarnated(3, status(2, 1)).object;
    let ensured_both = |stored: &[Value]| {
        let history = History {
            ensured: [incarnation("r1"), incarnation("r2")].into(),
            deleted: [incarnation("r1")].into(),
            ..History::default()
        };
        judge(history, stored)
    };
    assert_eq!(ensured_both(&[stored_second]), Vec::<String>::new());
    let found = ensured_both(&[]);
    assert!(
        found
            .iter()
            .any(|v| v.contains("ensure of exec-a (revision r2) was lost")),
        "{found:?}"
    );
}

mod liveness {
    //! The liveness phase fails an environment left fenced (or holding an operation) past its
    //! deadline, measures the deadline from the later of the heal and its operation lease's
    //! expiry, excuses a fence only on a node the scenario cut off for good, and reports each
    //! environment's time to recover.

    use std::collections::BTreeSet;
    use std::time::Duration;

    use execution_provider::kube::crd::RfcTime;
    use serde_json::{Value, json};
    use sim::clock::sim_epoch;
    use sim::liveness::{Cluster, Liveness, Look, Recovered};

    use super::{incarnation, spec, status, with};

    /// When the run healed, since its start.
    const HEAL: Duration = Duration::from_secs(100);

    fn cut_off(cut: &[&str]) -> Liveness {
        Liveness::new(HEAL, cut.iter().map(|n| (*n).to_owned()).collect(), |_| {
            Some("node-0".to_owned())
        })
    }

    fn object(status: Value) -> Value {
        json!({
            "apiVersion": "execution.mecatl.dev/v1alpha1", "kind": "ExecutionEnvironment",
            "metadata": {"name": "exec-a", "uid": "u1", "resourceVersion": "1"},
            "spec": spec("exec-a"), "status": status
        })
    }

    fn fenced() -> Value {
        object(with(status(1, 1), "fenceState", json!("FenceUnknown")))
    }

    /// Looks at `envs` this many seconds after the heal.
    fn look(phase: &mut Liveness, after_heal_secs: u64, envs: &[Value]) -> Look {
        let ensured = BTreeSet::from([incarnation("r1")]);
        let cluster = Cluster {
            envs,
            pods: &[],
            pvcs: &[],
            ensured: &ensured,
            revoked: &|_| false,
        };
        phase.look(HEAL + Duration::from_secs(after_heal_secs), &cluster)
    }

    fn failure(look: Look) -> String {
        match look {
            Look::Failed(why) => why,
            other => panic!("expected a liveness failure, got {other:?}"),
        }
    }

    #[test]
    fn an_environment_left_fenced_fails_at_its_deadline_naming_its_state() {
        let mut phase = cut_off(&[]);
        assert_eq!(look(&mut phase, 10, &[fenced()]), Look::Waiting);
        assert_eq!(look(&mut phase, 59, &[fenced()]), Look::Waiting);
        let why = failure(look(&mut phase, 60, &[fenced()]));
        assert!(
            why.starts_with("LIVENESS:")
                && why.contains("environment exec-a is fenced (no Recovering condition)")
                && why.contains("deadline 160.0 s")
                && why.contains("no operation lease"),
            "{why}"
        );
    }

    #[test]
    fn a_fence_counts_as_converged_only_on_a_node_cut_off_for_good() {
        let mut phase = cut_off(&["node-0"]);
        assert_eq!(look(&mut phase, 70, &[fenced()]), Look::Converged);
        assert!(phase.held_by_cut().contains("exec-a"));
        let mut other = cut_off(&["node-1"]);
        assert!(matches!(look(&mut other, 70, &[fenced()]), Look::Failed(_)));
    }

    #[test]
    fn the_deadline_counts_from_an_operation_lease_that_outlives_the_heal() {
        let expires = RfcTime::from_system_time(sim_epoch() + Duration::from_secs(130));
        let operation = json!({
            "id": "op-1", "operation": "command.start", "startedAt": expires, "claimID": "c1",
            "runID": "run", "epoch": 1, "holderID": "replica-0", "renewedAt": expires,
            "expiresAt": expires
        });
        let held = object(with(status(1, 1), "activeOperation", operation));
        let mut phase = cut_off(&[]);
        let held = [held];
        assert_eq!(look(&mut phase, 60, &held), Look::Waiting);
        assert_eq!(look(&mut phase, 89, &held), Look::Waiting);
        let why = failure(look(&mut phase, 90, &held));
        assert!(
            why.contains("operation op-1 (command.start) still held by replica-0")
                && why.contains("deadline 190.0 s")
                && why.contains("its operation lease expired at 130.0 s"),
            "{why}"
        );
    }

    #[test]
    fn each_recovery_is_reported_with_its_time_after_the_heal() {
        let mut phase = cut_off(&[]);
        assert_eq!(look(&mut phase, 1, &[fenced()]), Look::Waiting);
        let ready = object(status(2, 1));
        assert_eq!(look(&mut phase, 5, &[ready]), Look::Converged);
        assert_eq!(
            phase.recoveries(),
            vec![Recovered {
                name: "exec-a".into(),
                after_heal: Duration::from_secs(5),
                start: Duration::ZERO,
            }]
        );
    }
}
