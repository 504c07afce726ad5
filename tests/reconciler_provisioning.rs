//! The reconciler's provisioning path against the in-process API server (k8s-executor §2.3-
//! §2.7 and the §7 catalogue): the hardened Pod and retained PVC, exact adoption, fencing of
//! vanished or exited executors, and zero writes for an unchanged world.

mod reconciler_support;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{ConditionStatus, FenceState, condition};
use execution_provider::reconciler::Next;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{ObjectMeta, PostParams};
use reconciler_support::*;

fn reason_of(env: &execution_provider::kube::crd::ExecutionEnvironment) -> String {
    ready(env).map(|(_, r)| r).unwrap_or_default()
}

#[tokio::test]
async fn two_reconciles_create_a_tokenless_non_root_pod_and_a_retained_pvc() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    assert_eq!(reconciler.reconcile(ENV).await.unwrap(), Next::PodNotReady);
    assert_eq!(reconciler.reconcile(ENV).await.unwrap(), Next::PodNotReady);
    assert_eq!(world.pvc_count().await, 1);
    assert_eq!(world.pod_count().await, 1);
    let pvc = world.pvc().await.unwrap();
    assert!(pvc.metadata.owner_references.unwrap_or_default().is_empty());
    let pod = world.pod().await.unwrap();
    let spec = pod.spec.unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.service_account_name.as_deref(), Some(EXECUTOR_ACCOUNT));
    assert_eq!(spec.runtime_class_name.as_deref(), Some("sandboxed"));
    let context = spec.security_context.unwrap();
    assert_eq!(
        (context.run_as_non_root, context.run_as_user),
        (Some(true), Some(65532))
    );
    let container = &spec.containers[0];
    let sc = container.security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let limits = container.resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["ephemeral-storage"].0, "1Gi");
    let tmp = &spec.volumes.unwrap()[1];
    assert_eq!(
        tmp.empty_dir.clone().unwrap().size_limit.unwrap().0,
        "256Mi"
    );
    let env = world.env().await;
    assert_eq!(
        ready(&env),
        Some((ConditionStatus::False, "Reconciled".to_owned()))
    );
    assert_eq!(
        env.status.unwrap().pod.unwrap().uid,
        pod.metadata.uid.unwrap()
    );

    world.mark_pod_ready().await;
    assert_eq!(reconciler.reconcile(ENV).await.unwrap(), Next::Wait);
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::True, "Reconciled".to_owned()))
    );
}

#[tokio::test]
async fn repeated_reconcile_of_an_unchanged_world_writes_nothing() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    let version = world.api.resource_version();
    let before = cond(&world.env().await, condition::READY).unwrap();
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    assert_eq!(world.api.resource_version(), version, "no write at all");
    world.mark_pod_ready().await;
    let version = world.api.resource_version();
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        world.api.resource_version(),
        version + 1,
        "exactly one status write"
    );
    let after = cond(&world.env().await, condition::READY).unwrap();
    assert_ne!(after.status, before.status);
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(world.api.resource_version(), version + 1);
}

#[tokio::test]
async fn a_terminating_pod_is_unavailable_even_when_ready() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    world
        .pods()
        .delete(
            &execution_provider::kube::crd::pod_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(
        world
            .pod()
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "the finalizer keeps it"
    );
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(error.to_string().contains("pod is terminating"), "{error}");
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::False, "ExecutorUnavailable".to_owned()))
    );
}

#[tokio::test]
async fn a_vanished_recorded_pod_fences_and_is_never_recreated() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.replace_pod(|p| p.metadata.finalizers = None).await;
    world
        .pods()
        .delete(
            &execution_provider::kube::crd::pod_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(world.pod().await.is_none());
    for _ in 0..3 {
        let outcome = reconciler.reconcile(ENV).await;
        if let Err(error) = outcome {
            assert_eq!(error.code(), ErrorCode::FenceUnknown);
        }
        assert!(world.pod().await.is_none(), "never re-created");
    }
    let env = world.env().await;
    assert_eq!(
        env.status.as_ref().unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    assert_eq!(reason_of(&env), "FenceUnknown");
}

#[tokio::test]
async fn a_vanished_recorded_pvc_is_never_recreated() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world
        .pvcs()
        .delete(
            &execution_provider::kube::crd::pvc_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        assert!(
            error.to_string().contains("authoritative PVC disappeared"),
            "{error}"
        );
        assert!(world.pvc().await.is_none(), "never re-created");
    }
    assert_eq!(reason_of(&world.env().await), "PVCUnavailable");
}

#[tokio::test]
async fn an_exited_executor_fences_the_environment_and_is_not_restarted() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let uid = world.pod().await.unwrap().metadata.uid;
    world.mark_pod_terminated("Failed").await;
    assert_eq!(reconciler.reconcile(ENV).await.unwrap(), Next::Wait);
    let env = world.env().await;
    assert_eq!(
        env.status.as_ref().unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    assert_eq!(reason_of(&env), "FenceUnknown");
    assert_eq!(world.pod().await.unwrap().metadata.uid, uid, "not replaced");
}

#[tokio::test]
async fn a_revision_whose_digest_changed_allocates_nothing() {
    let world = World::new().await;
    let old = registry();
    let env = world.create_env(&old).await;
    // The same key now defines pull secrets: the environment's digest no longer matches.
    let changed = registry_of(&[(
        execution(|e| e["imagePullSecrets"] = serde_json::json!(["pull"])),
        false,
    )]);
    let reconciler = world.reconciler(&changed, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    let after = world.env().await;
    assert_eq!(reason_of(&after), "InvalidTemplate");
    assert_eq!(after.spec, env.spec, "spec unchanged");
    assert!(world.pod().await.is_none() && world.pvc().await.is_none());
}

#[tokio::test]
async fn a_revoked_template_stops_the_executor_and_keeps_the_pvc() {
    let world = World::new().await;
    let spec = execution(|_| {});
    let templates = registry_of(&[(spec.clone(), false)]);
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let other = execution(|e| e["storageSize"] = serde_json::json!("2Gi"));
    let revoked = registry_of(&[(other, false), (spec, true)]);
    let reconciler = world.reconciler(&revoked, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    let pod = world
        .pod()
        .await
        .expect("kept Terminating by its finalizer");
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "the executor is stopped"
    );
    assert!(
        world
            .pvc()
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "workspace kept"
    );
    assert_eq!(
        ready(&world.env().await),
        Some((ConditionStatus::False, "InvalidTemplate".to_owned()))
    );
}

#[tokio::test]
async fn an_unsupported_schema_is_refused_until_the_store_initialises_the_status() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    world.edit_status(|s| s.schema_version = None).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(reason_of(&world.env().await), "IncompatibleSchema");
    assert!(world.pvc().await.is_none());
}

#[tokio::test]
async fn a_directly_written_retiring_desire_is_refused() {
    let world = World::new().await;
    let templates = registry();
    let mut env = world.create_env(&templates).await;
    env.spec.desired = execution_provider::kube::crd::Desired::Retiring;
    world
        .envs()
        .replace(ENV, &PostParams::default(), &env)
        .await
        .unwrap();
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(
        reason_of(&world.env().await),
        "UnsupportedRetirementRequest"
    );
    assert!(world.pod().await.is_none());
}

#[tokio::test]
async fn a_direct_delete_is_blocked_and_deletes_nothing() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.envs().delete(ENV, &Default::default()).await.unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    let blocked = cond(&env, condition::DELETION_BLOCKED).unwrap();
    assert_eq!(
        (blocked.status, blocked.reason.as_str()),
        (ConditionStatus::True, "ExactLifecycleRequired")
    );
    assert_eq!(
        env.metadata.finalizers.unwrap(),
        ["execution.mecatl.dev/retain-workspace"]
    );
    assert!(world.pod().await.is_some() && world.pvc().await.is_some());
}

#[tokio::test]
async fn a_missing_environment_finalizer_is_added_first() {
    let world = World::new().await;
    let templates = registry();
    let mut env = world.create_env(&templates).await;
    env.metadata.finalizers = None;
    world
        .envs()
        .replace(ENV, &PostParams::default(), &env)
        .await
        .unwrap();
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    assert!(
        world.pvc().await.is_none(),
        "nothing provisioned in the same pass"
    );
    assert_eq!(
        world.env().await.metadata.finalizers.unwrap(),
        ["execution.mecatl.dev/retain-workspace"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_operation_lease_is_fenced_only_at_its_deadline_keeping_its_identity() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let expires = execution_provider::kube::crd::RfcTime::from_system_time(
        world.now() + std::time::Duration::from_secs(30),
    );
    world
        .edit_status(|s| {
            s.active_operation = Some(
                serde_json::from_value(serde_json::json!({
                    "id": "op-1", "operation": "command", "startedAt": "2027-01-15T08:00:00Z",
                    "claimID": "c", "runID": "r", "epoch": 1, "holderID": "h",
                    "renewedAt": "2027-01-15T08:00:00Z", "expiresAt": expires,
                }))
                .unwrap(),
            );
        })
        .await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    match reconciler.reconcile(ENV).await.unwrap() {
        Next::After(d) => assert!(
            d <= std::time::Duration::from_secs(30) && d > std::time::Duration::from_secs(29)
        ),
        other => panic!("expected a requeue at the deadline, got {other:?}"),
    }
    assert_ne!(
        world.env().await.status.unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    tokio::time::advance(std::time::Duration::from_secs(31)).await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert_eq!(status.active_operation.unwrap().id, "op-1");
}

/// A foreign PVC (not labelled, so removing it sends the reconciler no event) blocks the
/// workspace; the failure is recorded once and retried with backoff, and once it is gone the
/// environment converges with exactly one PVC and one Pod, without any further event.
#[tokio::test(start_paused = true)]
async fn failed_provisioning_retries_with_backoff_and_converges_without_another_event() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let foreign = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(execution_provider::kube::crd::pvc_name(ENV)),
            ..ObjectMeta::default()
        },
        spec: Some(Default::default()),
        ..PersistentVolumeClaim::default()
    };
    world
        .pvcs()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(reconciler.clone().run(async move {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while reason_of(&world.env().await) != "PVCUnavailable" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failure is recorded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Several backoff periods pass; the unchanged failure is not written again.
    let version = world.api.resource_version();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        world.api.resource_version(),
        version,
        "one status write for the failure"
    );

    world
        .pvcs()
        .delete(
            &execution_provider::kube::crd::pvc_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    while world.pod().await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the retry converges"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let pvc_uid = world.pvc().await.unwrap().metadata.uid;
    assert_eq!(world.pvc_count().await, 1);
    assert_eq!(world.pod_count().await, 1);
    assert_eq!(
        world.env().await.status.unwrap().pvc.unwrap().uid,
        pvc_uid.clone().unwrap()
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
