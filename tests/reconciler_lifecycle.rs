//! The reconciler side of the admin lifecycle (k8s-executor §2.8) against the in-process API
//! server: replacement and retirement through every phase with the termination proof made
//! durable before the Pod's finalizer is touched, retained deletion that releases the slot
//! exactly once, and fencing when an identity no longer matches.

mod reconciler_support;

use std::sync::Arc;

use execution_provider::kube::crd::{
    ConditionStatus, FenceState, LifecycleOperation, LifecyclePhase, LifecycleType, RfcTime,
    condition,
};
use execution_provider::metrics::FenceReason;
use execution_provider::reconciler::Reconciler;
use reconciler_support::*;

/// A Ready environment: (reconciler, Pod UID, PVC UID).
async fn provisioned(world: &World) -> (Arc<Reconciler>, String, String) {
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    (reconciler, status.pod.unwrap().uid, status.pvc.unwrap().uid)
}

/// Plays the store's admission of a lifecycle operation.
async fn admit(world: &World, type_: LifecycleType, phase: LifecyclePhase, pod: &str, pvc: &str) {
    let now = RfcTime::from_system_time(world.now());
    world
        .edit_status(|s| {
            s.lifecycle_operation = Some(LifecycleOperation {
                id: "op-lifecycle".to_owned(),
                type_,
                phase,
                expected_epoch: (type_ != LifecycleType::DeleteRetiredEnvironment).then_some(1),
                expected_pod_uid: (type_ != LifecycleType::DeleteRetiredEnvironment)
                    .then(|| pod.to_owned()),
                expected_pvc_uid: Some(pvc.to_owned()),
                created_at: now,
            });
        })
        .await;
}

fn phase(env: &execution_provider::kube::crd::ExecutionEnvironment) -> Option<LifecyclePhase> {
    env.status
        .as_ref()?
        .lifecycle_operation
        .as_ref()
        .map(|o| o.phase)
}

/// Quiescing through WaitingForPodDeletion; answers once the old Pod is gone.
async fn drive_to_pod_deletion(world: &World, reconciler: &Reconciler, pod_uid: &str) {
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        phase(&world.env().await),
        Some(LifecyclePhase::WaitingForTermination)
    );
    let pod = world.pod().await.expect("kept by its finalizer");
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "quiescing deletes the Pod"
    );

    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert_eq!(
        ready(&env),
        Some((
            ConditionStatus::False,
            "AwaitingTerminalExecutor".to_owned()
        ))
    );
    assert_eq!(phase(&env), Some(LifecyclePhase::WaitingForTermination));

    world.mark_pod_terminated("Succeeded").await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert_eq!(phase(&env), Some(LifecyclePhase::RemovingPodFinalizer));
    let proof = env
        .status
        .unwrap()
        .termination_proof
        .expect("proof is durable");
    assert_eq!(
        (proof.pod_uid.as_str(), proof.operation_id.as_str()),
        (pod_uid, "op-lifecycle")
    );
    let pod = world.pod().await.expect("finalizer not yet touched");
    assert_eq!(
        pod.metadata.finalizers.unwrap(),
        ["execution.mecatl.dev/verify-termination"]
    );

    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        phase(&world.env().await),
        Some(LifecyclePhase::WaitingForPodDeletion)
    );
    assert!(
        world.pod().await.is_none(),
        "the terminating Pod goes once its finalizer is removed"
    );
}

#[tokio::test]
async fn replacement_proves_termination_then_starts_a_new_executor_on_the_same_workspace() {
    let world = World::new().await;
    let (reconciler, pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::ReplaceExecutor,
        LifecyclePhase::Quiescing,
        &pod_uid,
        &pvc_uid,
    )
    .await;
    drive_to_pod_deletion(&world, &reconciler, &pod_uid).await;

    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert_eq!(phase(&env), Some(LifecyclePhase::CreatingReplacement));
    assert!(env.status.unwrap().pod.is_none());

    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::False, "ReplacementStarting".to_owned()))
    );
    let new_pod = world.pod().await.expect("replacement created");
    let new_uid = new_pod.metadata.uid.clone().unwrap();
    assert_ne!(new_uid, pod_uid);

    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert!(status.lifecycle_operation.is_none());
    assert_eq!(status.epoch, Some(2));
    assert_eq!(status.pod.unwrap().uid, new_uid);
    assert_eq!(status.pvc.unwrap().uid, pvc_uid, "the workspace is reused");
    let receipt = status.last_replacement.unwrap();
    assert_eq!((receipt.previous_epoch, receipt.replacement_epoch), (1, 2));
    assert_eq!(
        (receipt.previous_pod_uid, receipt.replacement_pod_uid),
        (pod_uid, new_uid)
    );
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::True, "ReplacementReady".to_owned()))
    );
    // Afterwards the ordinary path takes over (Ready=True/Reconciled) and then is quiet.
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::True, "Reconciled".to_owned()))
    );
    let version = world.api.resource_version();
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(world.api.resource_version(), version);
}

#[tokio::test]
async fn retirement_keeps_the_workspace_and_marks_the_environment_retired() {
    let world = World::new().await;
    let (reconciler, pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::RetireEnvironment,
        LifecyclePhase::Quiescing,
        &pod_uid,
        &pvc_uid,
    )
    .await;
    drive_to_pod_deletion(&world, &reconciler, &pod_uid).await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert!(status.lifecycle_operation.is_none());
    assert_eq!(
        status.pod.unwrap().uid,
        pod_uid,
        "status.pod names the old executor"
    );
    assert_eq!(
        ready(&env),
        Some((ConditionStatus::False, "Retained".to_owned()))
    );
    let retired = cond(&env, condition::RETIRED).unwrap();
    assert_eq!(
        (retired.status, retired.reason.as_str()),
        (ConditionStatus::True, "WorkspaceRetained")
    );
    let terminated = cond(&env, condition::EXECUTOR_TERMINATED).unwrap();
    assert_eq!(
        (terminated.status, terminated.reason.as_str()),
        (ConditionStatus::True, "TerminalPodProof")
    );
    assert_eq!(world.pvc().await.unwrap().metadata.uid.unwrap(), pvc_uid);
    // A retired environment is never provisioned again.
    reconciler.reconcile(ENV).await.unwrap();
    assert!(world.pod().await.is_none());
}

#[tokio::test]
async fn deleting_a_retired_environment_deletes_the_pvc_releases_the_slot_and_the_resource() {
    let world = World::bare();
    world.add_runtime_class("sandboxed", None).await;
    world.add_storage_class("standard").await;
    world.add_ledger(&[ENV, "exec-other"]).await;
    let (reconciler, pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::RetireEnvironment,
        LifecyclePhase::Quiescing,
        &pod_uid,
        &pvc_uid,
    )
    .await;
    drive_to_pod_deletion(&world, &reconciler, &pod_uid).await;
    reconciler.reconcile(ENV).await.unwrap();
    admit(
        &world,
        LifecycleType::DeleteRetiredEnvironment,
        LifecyclePhase::DeletingPvc,
        "",
        &pvc_uid,
    )
    .await;

    reconciler.reconcile(ENV).await.unwrap();
    assert!(
        world.pvc().await.is_none(),
        "the retained PVC is deleted by UID"
    );
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        phase(&world.env().await),
        Some(LifecyclePhase::ReleasingSlot)
    );
    assert_eq!(
        world.ledger_names().await,
        [ENV, "exec-other"],
        "not released before the PVC is gone"
    );
    reconciler.reconcile(ENV).await.unwrap();
    assert!(
        world.envs().get_opt(ENV).await.unwrap().is_none(),
        "the resource is deleted"
    );
    assert_eq!(world.ledger_names().await, ["exec-other"]);
    // A late reconcile of the vanished resource does nothing.
    reconciler.reconcile(ENV).await.unwrap();
}

#[tokio::test]
async fn a_lifecycle_operation_for_another_executor_fences_and_deletes_nothing() {
    let world = World::new().await;
    let (reconciler, _pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::ReplaceExecutor,
        LifecyclePhase::Quiescing,
        "some-other-pod",
        &pvc_uid,
    )
    .await;
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("no longer matches the exact executor"),
        "{error}"
    );
    let env = world.env().await;
    assert_eq!(
        env.status.as_ref().unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    assert!(
        env.status.unwrap().lifecycle_operation.is_some(),
        "operation kept for recovery"
    );
    assert!(
        world
            .pod()
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}

#[tokio::test]
async fn retained_deletion_without_a_completed_retirement_fences() {
    let world = World::new().await;
    let (reconciler, _pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::DeleteRetiredEnvironment,
        LifecyclePhase::DeletingPvc,
        "",
        &pvc_uid,
    )
    .await;
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("retained deletion state is invalid"),
        "{error}"
    );
    assert!(world.pvc().await.is_some());
}

#[tokio::test]
async fn an_executor_that_vanishes_before_its_proof_fences_the_lifecycle() {
    let world = World::new().await;
    let (reconciler, pod_uid, pvc_uid) = provisioned(&world).await;
    admit(
        &world,
        LifecycleType::RetireEnvironment,
        LifecyclePhase::WaitingForTermination,
        &pod_uid,
        &pvc_uid,
    )
    .await;
    world.replace_pod(|p| p.metadata.finalizers = None).await;
    world
        .pods()
        .delete(
            &execution_provider::kube::crd::pod_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("executor disappeared before durable terminal proof"),
        "{error}"
    );
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.termination_proof.is_none());
}

#[tokio::test]
async fn status_writers_reject_stale_observations_and_change_nothing() {
    use execution_provider::errors::ErrorCode;
    use execution_provider::reconciler::status;
    let world = World::new().await;
    let (reconciler, pod_uid, pvc_uid) = provisioned(&world).await;
    let observed = world.env().await;
    // A lifecycle operation is admitted after the decision was taken.
    admit(
        &world,
        LifecycleType::ReplaceExecutor,
        LifecyclePhase::Quiescing,
        &pod_uid,
        &pvc_uid,
    )
    .await;
    let version = world.api.resource_version();
    let envs = world.envs();
    let ctx = reconciler.context();
    let ready_write = status::guarded(&envs, ctx, &observed, |w| {
        w.ready(true, "Reconciled", "PVC and executor Pod are ready");
    })
    .await
    .unwrap_err();
    assert_eq!(ready_write.code(), ErrorCode::Conflict);
    let fence_write = status::fence(&envs, ctx, &observed, FenceReason::Lifecycle, "stale")
        .await
        .unwrap_err();
    assert_eq!(fence_write.code(), ErrorCode::Conflict);
    // A phase transition decided on the admitted operation loses to a concurrent epoch change.
    let admitted = world.env().await;
    world.edit_status(|s| s.epoch = Some(9)).await;
    let version_after_epoch = world.api.resource_version();
    let phase_write = status::guarded(&envs, ctx, &admitted, |w| {
        if let Some(op) = w.status.lifecycle_operation.as_mut() {
            op.phase = LifecyclePhase::WaitingForTermination;
        }
    })
    .await
    .unwrap_err();
    assert_eq!(phase_write.code(), ErrorCode::Conflict);
    assert_eq!(
        world.api.resource_version(),
        version_after_epoch,
        "nothing written"
    );
    assert_eq!(version_after_epoch, version + 1);
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, None);
    assert_eq!(
        status.lifecycle_operation.unwrap().phase,
        LifecyclePhase::Quiescing
    );
}
