//! Retained deletion under races between replicas (k8s-executor §2.8 `reconcileRetainedDelete`
//! and the §7 catalogue: PeerBetweenFinalizerUpdateAndDelete in its three variants,
//! DoesNotRemoveForeignCR): the PVC is deleted once by exact UID, the resource once with UID
//! and resourceVersion preconditions, the environment finalizer is never added back, the slot
//! is released exactly once, and a resource that is not the one decided on is never touched.

mod reconciler_support;

use std::sync::Arc;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{
    ExecutionEnvironment, LifecycleOperation, LifecyclePhase, LifecycleType, RfcTime,
};
use execution_provider::reconciler::Reconciler;
use kube::api::PostParams;
use reconciler_support::hooks::{Action, Rule, Seen};
use reconciler_support::*;
use serde_json::Value;

const FINALIZER: &str = "execution.mecatl.dev/retain-workspace";

fn lifecycle(
    type_: LifecycleType,
    phase: LifecyclePhase,
    pod: &str,
    pvc: &str,
    now: RfcTime,
) -> LifecycleOperation {
    let exact = type_ != LifecycleType::DeleteRetiredEnvironment;
    LifecycleOperation {
        id: format!("op-{type_:?}"),
        type_,
        phase,
        expected_epoch: exact.then_some(1),
        expected_pod_uid: exact.then(|| pod.to_owned()),
        expected_pvc_uid: Some(pvc.to_owned()),
        created_at: now,
    }
}

/// A retired environment whose retained deletion was admitted: (reconciler, PVC UID).
async fn retained_delete_admitted(world: &World) -> (Arc<Reconciler>, String) {
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    let (pod, pvc) = (status.pod.unwrap().uid, status.pvc.unwrap().uid);
    let now = RfcTime::from_system_time(world.now());
    let retire = lifecycle(
        LifecycleType::RetireEnvironment,
        LifecyclePhase::Quiescing,
        &pod,
        &pvc,
        now,
    );
    world
        .edit_status(|s| s.lifecycle_operation = Some(retire.clone()))
        .await;
    reconciler.reconcile(ENV).await.unwrap(); // Quiescing → WaitingForTermination
    world.mark_pod_terminated("Succeeded").await;
    for _ in 0..4 {
        // proof, finalizer, Pod gone, retirement finished
        reconciler.reconcile(ENV).await.unwrap();
    }
    assert!(world.pod().await.is_none());
    let delete = lifecycle(
        LifecycleType::DeleteRetiredEnvironment,
        LifecyclePhase::DeletingPvc,
        "",
        &pvc,
        now,
    );
    world
        .edit_status(|s| s.lifecycle_operation = Some(delete.clone()))
        .await;
    (reconciler, pvc)
}

/// Drives the admitted deletion to ReleasingSlot (the PVC deleted by exact UID).
async fn to_releasing_slot(world: &World, reconciler: &Reconciler, pvc_uid: &str) {
    reconciler.reconcile(ENV).await.unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    let phase = world
        .env()
        .await
        .status
        .unwrap()
        .lifecycle_operation
        .unwrap()
        .phase;
    assert_eq!(phase, LifecyclePhase::ReleasingSlot);
    let deletes = world.hooks.seen("DELETE", "persistentvolumeclaims");
    assert_eq!(deletes.len(), 1, "the PVC is deleted once");
    assert_eq!(
        deletes[0].body.pointer("/preconditions/uid"),
        Some(&Value::from(pvc_uid)),
        "by exact UID"
    );
}

fn env_writes(world: &World) -> Vec<Seen> {
    world
        .hooks
        .seen("PUT", "executionenvironments")
        .into_iter()
        .filter(|s| !s.path.ends_with("/status"))
        .collect()
}

/// No update of the resource itself ever carries the environment finalizer after the one that
/// removed it.
fn assert_finalizer_never_re_added(world: &World) {
    let writes = env_writes(world);
    let removed = writes
        .iter()
        .position(|s| !has_finalizer(&s.body))
        .expect("the finalizer was removed");
    assert!(
        writes[removed..].iter().all(|s| !has_finalizer(&s.body)),
        "finalizer re-added: {writes:?}"
    );
}

fn has_finalizer(body: &Value) -> bool {
    body.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|v| v == FINALIZER))
}

fn assert_resource_delete_preconditions(seen: &Seen, uid: &str) {
    assert_eq!(
        seen.body.pointer("/preconditions/uid"),
        Some(&Value::from(uid))
    );
    assert!(
        seen.body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty()),
        "resourceVersion precondition: {:?}",
        seen.body
    );
}

async fn world_with_ledger() -> World {
    let world = World::bare();
    world.add_runtime_class("sandboxed", None).await;
    world.add_storage_class("standard").await;
    world.add_ledger(&[ENV, "exec-other"]).await;
    world
}

#[tokio::test]
async fn a_peer_deleting_between_finalizer_removal_and_delete_leaves_one_deletion() {
    let world = world_with_ledger().await;
    let (reconciler, pvc_uid) = retained_delete_admitted(&world).await;
    to_releasing_slot(&world, &reconciler, &pvc_uid).await;
    let uid = world.env().await.metadata.uid.unwrap();
    let peer = world.reconciler(&registry(), EXECUTOR_ACCOUNT);
    world.hooks.rule(Rule {
        method: "DELETE",
        path: "executionenvironments",
        suffix: "",
        times: 1,
        action: Action::Before(Arc::new(move || {
            let peer = peer.clone();
            // On its own task: a whole reconcile nested in this request's future is too deep.
            Box::pin(async move {
                tokio::spawn(async move { peer.reconcile(ENV).await })
                    .await
                    .unwrap()
                    .expect("the peer finishes the deletion");
            })
        })),
    });
    reconciler.reconcile(ENV).await.unwrap();
    assert!(world.envs().get_opt(ENV).await.unwrap().is_none());
    let deletes = world.hooks.seen("DELETE", "executionenvironments");
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    for delete in &deletes {
        assert_resource_delete_preconditions(delete, &uid);
    }
    let codes: Vec<u16> = deletes.iter().map(|d| d.code).collect();
    assert_eq!(
        codes,
        [200, 404],
        "the peer's deletion wins; ours finds it gone"
    );
    assert_eq!(env_writes(&world).len(), 1, "the finalizer is removed once");
    assert_finalizer_never_re_added(&world);
    assert_eq!(world.ledger_names().await, ["exec-other"]);
}

#[tokio::test]
async fn an_already_terminating_environment_finishes_its_retained_deletion() {
    let world = world_with_ledger().await;
    let (reconciler, pvc_uid) = retained_delete_admitted(&world).await;
    world.envs().delete(ENV, &Default::default()).await.unwrap();
    assert!(world.env().await.metadata.deletion_timestamp.is_some());
    to_releasing_slot(&world, &reconciler, &pvc_uid).await;
    reconciler.reconcile(ENV).await.unwrap();
    assert!(world.envs().get_opt(ENV).await.unwrap().is_none());
    assert_finalizer_never_re_added(&world);
    assert_eq!(world.ledger_names().await, ["exec-other"]);
    let blocked = world
        .hooks
        .seen("PUT", "executionenvironments")
        .iter()
        .any(|s| s.body.to_string().contains("ExactLifecycleRequired"));
    assert!(!blocked, "an admitted deletion is not reported as blocked");
}

#[tokio::test]
async fn a_stale_resource_version_gives_one_conflict_then_the_deletion_succeeds() {
    let world = world_with_ledger().await;
    let (reconciler, pvc_uid) = retained_delete_admitted(&world).await;
    to_releasing_slot(&world, &reconciler, &pvc_uid).await;
    let uid = world.env().await.metadata.uid.unwrap();
    let api = world.api.clone();
    world.hooks.rule(Rule {
        method: "DELETE",
        path: "executionenvironments",
        suffix: "",
        times: 1,
        action: Action::Before(Arc::new(move || {
            let envs =
                kube::Api::<ExecutionEnvironment>::namespaced(api.client(NAMESPACE), NAMESPACE);
            Box::pin(async move {
                // Another writer touches the resource after the finalizer update.
                let mut env = envs.get(ENV).await.unwrap();
                env.status.as_mut().unwrap().observed_generation = Some(99);
                envs.replace_status(ENV, &PostParams::default(), &env)
                    .await
                    .unwrap();
            })
        })),
    });
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Conflict, "{error}");
    let env = world.env().await;
    assert!(!has_finalizer(&serde_json::to_value(&env).unwrap()));
    reconciler.reconcile(ENV).await.unwrap();
    assert!(world.envs().get_opt(ENV).await.unwrap().is_none());
    let deletes = world.hooks.seen("DELETE", "executionenvironments");
    let codes: Vec<u16> = deletes.iter().map(|d| d.code).collect();
    assert_eq!(codes, [409, 200]);
    for delete in &deletes {
        assert_resource_delete_preconditions(delete, &uid);
    }
    assert_eq!(env_writes(&world).len(), 1, "the finalizer is removed once");
    assert_finalizer_never_re_added(&world);
    assert_eq!(world.ledger_names().await, ["exec-other"]);
}

#[tokio::test]
async fn a_foreign_resource_under_the_same_name_is_never_released_or_touched() {
    let world = world_with_ledger().await;
    let (reconciler, pvc_uid) = retained_delete_admitted(&world).await;
    to_releasing_slot(&world, &reconciler, &pvc_uid).await;
    // Between this reconcile's read and its release, the resource is replaced by another one
    // with the same name and state but another UID.
    let api = world.api.clone();
    world.hooks.rule(Rule {
        method: "GET",
        path: "persistentvolumeclaims",
        suffix: "",
        times: 1,
        action: Action::Before(Arc::new(move || {
            let envs =
                kube::Api::<ExecutionEnvironment>::namespaced(api.client(NAMESPACE), NAMESPACE);
            Box::pin(async move { replace_with_foreign(&envs).await })
        })),
    });
    let foreign_uid = {
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::Conflict, "{error}");
        world.env().await.metadata.uid.unwrap()
    };
    let foreign = world.env().await;
    assert_eq!(foreign.metadata.uid.as_deref(), Some(foreign_uid.as_str()));
    assert_eq!(
        foreign.metadata.finalizers.unwrap(),
        [FINALIZER],
        "its finalizer is kept"
    );
    assert!(
        world
            .hooks
            .seen("DELETE", "executionenvironments")
            .is_empty()
    );
    assert!(env_writes(&world).is_empty(), "nothing written to it");
    assert_eq!(
        world.ledger_names().await,
        [ENV, "exec-other"],
        "nothing released"
    );
}

/// Removes the environment and creates another with the same name, spec and status.
async fn replace_with_foreign(envs: &kube::Api<ExecutionEnvironment>) {
    let old = envs.get(ENV).await.unwrap();
    let mut unpinned = old.clone();
    unpinned.metadata.finalizers = None;
    envs.replace(ENV, &PostParams::default(), &unpinned)
        .await
        .unwrap();
    envs.delete(ENV, &Default::default()).await.unwrap();
    let mut fresh = old.clone();
    fresh.metadata = kube::api::ObjectMeta {
        name: old.metadata.name.clone(),
        namespace: old.metadata.namespace.clone(),
        finalizers: old.metadata.finalizers.clone(),
        ..Default::default()
    };
    let created = envs.create(&PostParams::default(), &fresh).await.unwrap();
    let mut with_status = created;
    with_status.status = old.status.clone();
    envs.replace_status(ENV, &PostParams::default(), &with_status)
        .await
        .unwrap();
}
