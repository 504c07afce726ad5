//! The admin lifecycle end to end: the store admits (`RetireEnvironment`, `ReplaceExecutor`,
//! `RecoverEnvironment`) and the reconciler drives the phases, both against one in-process API
//! server (k8s-executor §2.7-§2.8 and the §7 lifecycle catalogue:
//! RetirementCompletionReceiptReplaysOnlyExactOperation, RecoverRequiresExactTerminalPod-
//! AndPersistsProof, RecoveredTerminalProofCanStartExactReplacement, CompletedReplacement-
//! ReceiptReplaysExactOperation, StaleReplacementObservationCannotOverwriteCompletion).

mod reconciler_support;

use std::sync::Arc;

use execution_provider::errors::ErrorCode;
use execution_provider::executor::pod_exec::PodExecutor;
use execution_provider::kube::crd::{ConditionStatus, FenceState, LifecyclePhase, condition};
use execution_provider::reconciler::{Reconciler, status};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::naming::{client_hash, owner_hash};
use execution_provider::store::{EnvRef, Store};
use kube::api::PostParams;
use reconciler_support::*;

const ADMIN: &str = "spiffe://test.local/ns/ops/admin";
const ISSUER: &str = "https://issuer.test";

/// A Ready environment created by [`ADMIN`] for alice, the store and the reconciler.
async fn provisioned(world: &World) -> (Store, Arc<Reconciler>) {
    let templates = registry();
    let mut env = world.create_env(&templates).await;
    env.spec.client_hash = client_hash(ADMIN);
    env.spec.owner_hash = owner_hash(ISSUER, "alice");
    world
        .envs()
        .replace(ENV, &PostParams::default(), &env)
        .await
        .unwrap();
    world
        .edit_status(|s| s.fence_state = Some(FenceState::Healthy))
        .await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let store = Store::new(
        world.client.clone(),
        NAMESPACE,
        Arc::new(templates),
        Arc::new(PodExecutor::new(world.client.clone())),
        world.runtime.clone(),
    );
    (store, reconciler)
}

/// An admin request for the identities the environment shows now.
async fn request(world: &World, operation: &str) -> AdminRequest {
    let env = world.env().await;
    let status = env.status.unwrap();
    AdminRequest {
        env: EnvRef {
            id: ENV.to_owned(),
            revision: env.spec.revision,
        },
        owner_hash: owner_hash(ISSUER, "alice"),
        actor: ADMIN.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: status.epoch.unwrap(),
        expected_pod_uid: status.pod.map(|p| p.uid).unwrap_or_default(),
        expected_pvc_uid: status.pvc.map(|p| p.uid).unwrap_or_default(),
        operation_id: operation.to_owned(),
    }
}

fn phase(
    world_env: &execution_provider::kube::crd::ExecutionEnvironment,
) -> Option<LifecyclePhase> {
    world_env
        .status
        .as_ref()?
        .lifecycle_operation
        .as_ref()
        .map(|o| o.phase)
}

/// Reconciles until the lifecycle operation is gone, playing the kubelet: the old executor
/// terminates once it is asked to, a replacement becomes Ready once created.
async fn drive(world: &World, reconciler: &Reconciler, old_pod_uid: &str) {
    for _ in 0..12 {
        let env = world.env().await;
        if phase(&env).is_none() {
            return;
        }
        if let Some(pod) = world.pod().await {
            let old = pod.metadata.uid.as_deref() == Some(old_pod_uid);
            let terminal = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed");
            if old && pod.metadata.deletion_timestamp.is_some() && !terminal {
                world.mark_pod_terminated("Succeeded").await;
            } else if !old && !execution_provider::reconciler::pod::pod_ready(&pod) {
                world.mark_pod_ready().await;
            }
        }
        reconciler.reconcile(ENV).await.unwrap();
    }
    panic!(
        "the lifecycle did not finish: {:?}",
        world.env().await.status
    );
}

#[tokio::test]
async fn a_completed_retirement_replays_only_for_the_exact_operation() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    let retire = request(&world, "op-retire").await;
    store.retire_environment(&retire).await.unwrap();
    drive(&world, &reconciler, &retire.expected_pod_uid).await;
    let env = world.env().await;
    assert_eq!(
        cond(&env, condition::RETIRED).map(|c| c.status),
        Some(ConditionStatus::True)
    );

    let version = world.api.resource_version();
    store.retire_environment(&retire).await.unwrap();
    assert_eq!(
        world.api.resource_version(),
        version,
        "a replay writes nothing"
    );

    let other = AdminRequest {
        operation_id: "op-other".to_owned(),
        ..retire.clone()
    };
    let refused = store.retire_environment(&other).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Conflict);
    let foreign = AdminRequest {
        owner_hash: owner_hash(ISSUER, "mallory"),
        ..retire.clone()
    };
    let refused = store.retire_environment(&foreign).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::NotFound);
    assert_eq!(
        world.api.resource_version(),
        version,
        "refusals write nothing"
    );
}

#[tokio::test]
async fn recovery_of_an_exited_executor_persists_its_proof_and_admits_an_exact_replacement() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    world.mark_pod_terminated("Failed").await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(
        status.fence_state,
        Some(FenceState::FenceUnknown),
        "exit fences"
    );

    let replace = request(&world, "op-replace").await;
    let refused = store.replace_executor(&replace).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Conflict, "fenced: no lifecycle");

    store
        .recover_environment(&request(&world, "op-recover").await)
        .await
        .unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    let proof = status.termination_proof.expect("recovery writes the proof");
    assert_eq!(proof.pod_uid, replace.expected_pod_uid);
    assert_eq!(proof.pvc_uid, replace.expected_pvc_uid);
    // The recorded proof covers the exit: the reconciler does not fence again.
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        world.env().await.status.unwrap().fence_state,
        Some(FenceState::Healthy)
    );

    store.replace_executor(&replace).await.unwrap();
    assert_eq!(phase(&world.env().await), Some(LifecyclePhase::Quiescing));
    drive(&world, &reconciler, &replace.expected_pod_uid).await;
    let status = world.env().await.status.unwrap();
    assert_eq!(status.epoch, Some(2));
    assert_ne!(status.pod.unwrap().uid, replace.expected_pod_uid);
    assert_eq!(status.pvc.unwrap().uid, replace.expected_pvc_uid);
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
}

#[tokio::test]
async fn a_recovery_without_the_exact_pod_stays_fenced_and_proves_nothing() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    world.replace_pod(|p| p.metadata.finalizers = None).await;
    world
        .pods()
        .delete(
            &execution_provider::kube::crd::pod_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    let _ = reconciler.reconcile(ENV).await;
    assert_eq!(
        world.env().await.status.unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    let refused = store
        .recover_environment(&request(&world, "op-recover").await)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::FenceUnknown);
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.termination_proof.is_none());
}

#[tokio::test]
async fn a_completed_replacement_replays_by_its_receipt_and_refuses_another_operation() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    let replace = request(&world, "op-replace").await;
    store.replace_executor(&replace).await.unwrap();
    drive(&world, &reconciler, &replace.expected_pod_uid).await;
    let receipt = world.env().await.status.unwrap().last_replacement.unwrap();
    assert_eq!(receipt.operation_id, "op-replace");
    assert_eq!((receipt.previous_epoch, receipt.replacement_epoch), (1, 2));

    let version = world.api.resource_version();
    store.replace_executor(&replace).await.unwrap();
    assert_eq!(
        world.api.resource_version(),
        version,
        "the receipt answers the replay"
    );
    let other = AdminRequest {
        operation_id: "op-other".to_owned(),
        ..replace.clone()
    };
    let refused = store.replace_executor(&other).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Conflict);
    assert_eq!(world.api.resource_version(), version);
}

#[tokio::test]
async fn a_stale_replacement_observation_cannot_overwrite_the_completed_state() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    let replace = request(&world, "op-replace").await;
    store.replace_executor(&replace).await.unwrap();
    // Up to the replacement Pod being Ready, but not yet recorded.
    for _ in 0..12 {
        if phase(&world.env().await) == Some(LifecyclePhase::CreatingReplacement)
            && world.pod().await.is_some()
        {
            break;
        }
        if let Some(pod) = world.pod().await
            && pod.metadata.deletion_timestamp.is_some()
            && pod.metadata.uid.as_deref() == Some(replace.expected_pod_uid.as_str())
        {
            world.mark_pod_terminated("Succeeded").await;
        }
        reconciler.reconcile(ENV).await.unwrap();
    }
    world.mark_pod_ready().await;
    let stale = world.env().await;
    assert_eq!(phase(&stale), Some(LifecyclePhase::CreatingReplacement));
    reconciler.reconcile(ENV).await.unwrap();
    let completed = world.env().await;
    assert_eq!(completed.status.as_ref().unwrap().epoch, Some(2));

    // A peer that decided on the stale snapshot tries to finish the same replacement again.
    let version = world.api.resource_version();
    let stale_finish = status::guarded(&world.envs(), reconciler.context(), &stale, |w| {
        w.status.epoch = Some(3);
        w.status.lifecycle_operation = None;
        w.ready(true, "ReplacementReady", "stale");
    })
    .await
    .unwrap_err();
    assert_eq!(stale_finish.code(), ErrorCode::Conflict);
    assert_eq!(world.api.resource_version(), version, "nothing written");
    let kept = world.env().await;
    assert_eq!(kept.status, completed.status);
    assert_eq!(
        ready(&kept),
        Some((ConditionStatus::True, "ReplacementReady".to_owned()))
    );
    // A peer reconciler reading the live state agrees and changes nothing either.
    let peer = world.reconciler(&registry(), EXECUTOR_ACCOUNT);
    peer.reconcile(ENV).await.unwrap();
    assert_eq!(world.env().await.status.unwrap().epoch, Some(2));
}

#[tokio::test]
async fn an_admitted_replacement_quiesces_and_a_pending_reference_blocks_retirement() {
    use execution_provider::kube::crd::{ReferenceRecord, ReferenceState, RfcTime};
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    let now = RfcTime::from_system_time(world.now());
    world
        .edit_status(|s| {
            s.references = vec![ReferenceRecord {
                binding_id: "binding".to_owned(),
                state: ReferenceState::PendingDelete,
                operation_id: "op-delete-ref".to_owned(),
                source_binding_id: None,
                created_at: now,
            }];
        })
        .await;
    let retire = request(&world, "op-retire").await;
    let refused = store.retire_environment(&retire).await.unwrap_err();
    assert_eq!(
        refused.code(),
        ErrorCode::Conflict,
        "a pending reference blocks it"
    );
    assert!(phase(&world.env().await).is_none());

    let replace = request(&world, "op-replace").await;
    store.replace_executor(&replace).await.unwrap();
    let env = world.env().await;
    assert_eq!(phase(&env), Some(LifecyclePhase::Quiescing));
    assert_eq!(
        ready(&env),
        Some((ConditionStatus::False, "Quiescing".to_owned()))
    );
    // The reconciler's first step asks the exact executor to stop, with a grace period.
    reconciler.reconcile(ENV).await.unwrap();
    let deletes = world.hooks.seen("DELETE", "pods");
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].body.pointer("/preconditions/uid"),
        Some(&serde_json::Value::from(replace.expected_pod_uid.as_str()))
    );
    assert_eq!(
        deletes[0].body.pointer("/gracePeriodSeconds"),
        Some(&serde_json::Value::from(30))
    );
    assert_eq!(
        phase(&world.env().await),
        Some(LifecyclePhase::WaitingForTermination)
    );
}

/// An executor that exited before any reconcile saw it (so not Ready, not yet fenced): the
/// store's retirement persists the kubelet's terminal evidence as the proof and admits the
/// operation, idempotently, and the reconciler retires the environment without fencing it.
#[tokio::test]
async fn a_terminal_executor_without_readiness_is_retired_on_its_persisted_proof() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    world.mark_pod_terminated("Failed").await;
    world.edit_status(|s| s.conditions.clear()).await;
    let retire = request(&world, "op-retire").await;
    store.retire_environment(&retire).await.unwrap();
    let status = world.env().await.status.unwrap();
    let proof = status
        .termination_proof
        .expect("the terminal Pod is the proof");
    assert_eq!(
        (proof.pod_uid.as_str(), proof.epoch),
        (retire.expected_pod_uid.as_str(), 1)
    );
    assert_eq!(
        status.lifecycle_operation.map(|o| o.id),
        Some("op-retire".to_owned())
    );
    let version = world.api.resource_version();
    store.retire_environment(&retire).await.unwrap();
    assert_eq!(world.api.resource_version(), version, "idempotent");

    drive(&world, &reconciler, &retire.expected_pod_uid).await;
    let env = world.env().await;
    assert_eq!(
        cond(&env, condition::RETIRED).map(|c| c.status),
        Some(ConditionStatus::True)
    );
    assert_eq!(
        env.status.unwrap().fence_state,
        Some(FenceState::Healthy),
        "never fenced"
    );
    assert!(world.pod().await.is_none());
    assert!(world.pvc().await.is_some(), "the workspace is retained");
}

/// Without Ready, only complete kubelet evidence of the exact Pod admits a lifecycle: a Pod
/// whose phase says Failed while its container still runs, or no Pod at all, proves nothing,
/// and nothing is written.
#[tokio::test]
async fn incomplete_terminal_evidence_admits_no_lifecycle_and_writes_no_proof() {
    let world = World::new().await;
    let (store, _reconciler) = provisioned(&world).await;
    world.edit_status(|s| s.conditions.clear()).await;
    let mut pod = world.pod().await.unwrap();
    pod.status = Some(
        serde_json::from_value(serde_json::json!({"phase": "Failed",
            "containerStatuses": [{"name": "executor", "ready": false, "restartCount": 0,
                "image": "x", "imageID": "x", "state": {"running": {}}}]}))
        .unwrap(),
    );
    world
        .pods()
        .replace_status(
            &execution_provider::kube::crd::pod_name(ENV),
            &PostParams::default(),
            &pod,
        )
        .await
        .unwrap();
    let retire = request(&world, "op-retire").await;
    for evidence in ["a container still running", "no Pod at all"] {
        let version = world.api.resource_version();
        let refused = store.retire_environment(&retire).await.expect_err(evidence);
        assert_eq!(refused.code(), ErrorCode::Conflict, "{evidence}: {refused}");
        assert_eq!(
            world.api.resource_version(),
            version,
            "{evidence}: nothing written"
        );
        let status = world.env().await.status.unwrap();
        assert!(status.termination_proof.is_none(), "{evidence}");
        assert!(status.lifecycle_operation.is_none(), "{evidence}");
        if world.pod().await.is_none() {
            break;
        }
        world.replace_pod(|p| p.metadata.finalizers = None).await;
        let _ = world
            .pods()
            .delete(
                &execution_provider::kube::crd::pod_name(ENV),
                &Default::default(),
            )
            .await;
    }
}

/// Turns the provisioned executor into one of an earlier release: the idle shell as its main
/// process, no supervisor.
async fn make_legacy(world: &World) {
    use execution_provider::reconciler::render::LEGACY_EXECUTOR_COMMAND;
    world
        .replace_pod(|pod| {
            let container = &mut pod.spec.as_mut().unwrap().containers[0];
            container.command = Some(LEGACY_EXECUTOR_COMMAND.map(str::to_owned).to_vec());
        })
        .await;
}

fn main_process(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().containers[0]
        .command
        .clone()
        .unwrap()
}

#[tokio::test]
async fn an_idle_executor_of_the_previous_main_process_is_replaced_by_one_whose_main_process_is_the_supervisor()
 {
    use execution_provider::reconciler::render::EXECUTOR_COMMAND;
    use execution_provider::reconciler::upgrade::UPGRADE_OPERATION_PREFIX;
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let new_shape = world.pod().await.unwrap();
    assert_eq!(
        main_process(&new_shape),
        EXECUTOR_COMMAND.map(str::to_owned)
    );
    assert_eq!(
        EXECUTOR_COMMAND,
        ["/mecatl-executor", "supervise"],
        "no sleep: the helper's supervisor is the main process"
    );
    // A supervisor Pod is left alone.
    reconciler.reconcile(ENV).await.unwrap();
    assert!(phase(&world.env().await).is_none());

    make_legacy(&world).await;
    let old = world.pod().await.unwrap();
    let old_uid = old.metadata.uid.clone().unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    let admitted = world.env().await;
    let op = admitted
        .status
        .as_ref()
        .unwrap()
        .lifecycle_operation
        .clone()
        .expect("the upgrade is admitted");
    assert_eq!(op.id, format!("{UPGRADE_OPERATION_PREFIX}{old_uid}"));
    assert_eq!(op.expected_pod_uid.as_deref(), Some(old_uid.as_str()));
    assert_eq!(
        ready(&admitted).map(|(s, _)| s),
        Some(ConditionStatus::False)
    );

    drive(&world, &reconciler, &old_uid).await;
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    let proof = status
        .termination_proof
        .clone()
        .expect("termination proven");
    assert_eq!(proof.pod_uid, old_uid, "the old executor's end was proven");
    assert_eq!(status.epoch, Some(2), "a new epoch");
    let replacement = world.pod().await.unwrap();
    assert_ne!(replacement.metadata.uid.as_deref(), Some(old_uid.as_str()));
    assert_eq!(
        main_process(&replacement),
        EXECUTOR_COMMAND.map(str::to_owned)
    );
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        ready(&world.env().await).map(|(s, _)| s),
        Some(ConditionStatus::True)
    );
}

#[tokio::test]
async fn an_executor_of_the_previous_main_process_is_kept_while_a_claim_or_an_operation_is_active()
{
    use execution_provider::kube::crd::{ActiveOperation, ActiveRun, RfcTime};
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    make_legacy(&world).await;
    let old_uid = world.pod().await.unwrap().metadata.uid.unwrap();
    let later = RfcTime::from_system_time(world.now() + std::time::Duration::from_secs(600));
    let claim = ActiveRun {
        binding_id: "binding".into(),
        run_id: "run-1".into(),
        claim_id: "claim-1".into(),
        operation_id: "op-claim".into(),
        owner_hash: owner_hash(ISSUER, "alice"),
        client_hash: client_hash(ADMIN),
        epoch: 1,
        grant_generation: 1,
        expires_at: later,
    };
    world
        .edit_status(|s| s.active_run = Some(claim.clone()))
        .await;
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    let env = world.env().await;
    assert!(phase(&env).is_none(), "no replacement under a live claim");
    assert_eq!(
        world.pod().await.unwrap().metadata.uid.as_deref(),
        Some(old_uid.as_str())
    );

    // A running operation (no claim) keeps it too.
    let now = RfcTime::from_system_time(world.now());
    let operation = ActiveOperation {
        id: "op-running".into(),
        operation: "file.read".into(),
        started_at: now,
        claim_id: String::new(),
        run_id: String::new(),
        epoch: 1,
        holder_id: "replica-1".into(),
        renewed_at: now,
        expires_at: later,
    };
    world
        .edit_status(|s| {
            s.active_run = None;
            s.active_operation = Some(operation.clone());
        })
        .await;
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    assert!(
        phase(&world.env().await).is_none(),
        "no replacement under a running operation"
    );
    world.edit_status(|s| s.active_operation = None).await;

    // The claim expired: the upgrade goes ahead and clears it, as an admin replacement does.
    let expired = ActiveRun {
        expires_at: RfcTime::from_system_time(world.now() - std::time::Duration::from_secs(1)),
        ..claim
    };
    world
        .edit_status(|s| s.active_run = Some(expired.clone()))
        .await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert!(phase(&env).is_some(), "{:?}", env.status);
    assert!(env.status.unwrap().active_run.is_none());
}

#[tokio::test]
async fn an_administrators_replacement_and_retirement_are_events_step_by_step() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    world.record_events(&reconciler);
    let replace = request(&world, "op-replace").await;
    store.replace_executor(&replace).await.unwrap();
    drive(&world, &reconciler, &replace.expected_pod_uid).await;
    let retire = request(&world, "op-retire").await;
    store.retire_environment(&retire).await.unwrap();
    drive(&world, &reconciler, &retire.expected_pod_uid).await;
    let step = |phase: &str| event("Normal", "LifecycleStep", phase);
    assert_eq!(
        world.events(9).await,
        vec![
            step("WaitingForTermination"),
            step("RemovingPodFinalizer"),
            step("WaitingForPodDeletion"),
            step("CreatingReplacement"),
            event("Normal", "ExecutorReplaced", "ReplaceExecutor"),
            step("WaitingForTermination"),
            step("RemovingPodFinalizer"),
            step("WaitingForPodDeletion"),
            event("Normal", "Retired", "RetireEnvironment"),
        ]
    );
}
