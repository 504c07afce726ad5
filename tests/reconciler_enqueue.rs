//! The enqueue rules of k8s-executor §2.2 (§7 RuntimeAndRelevantStatusUpdatesEnqueue): which
//! watch events reconcile which environment. The rules themselves are checked field by field;
//! the running work queue is then observed against the in-process API server: labelled Pod
//! and PVC events and relevant status changes are reconciled, the reconciler's own status
//! fields are not, and foreign or unlabelled objects enqueue nothing.

mod reconciler_support;

use std::collections::BTreeMap;

use execution_provider::kube::crd::{
    ConditionStatus, ExecutionEnvironment, FenceState, LifecycleOperation, LifecyclePhase,
    LifecycleType, ObjectIdentity, ReferenceRecord, ReferenceState, RfcTime, pvc_name,
};
use execution_provider::reconciler::enqueue::{environment_of, update_enqueues};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, PostParams};
use reconciler_support::*;

fn lifecycle(phase: LifecyclePhase) -> LifecycleOperation {
    LifecycleOperation {
        id: "op-1".to_owned(),
        type_: LifecycleType::ReplaceExecutor,
        phase,
        expected_epoch: Some(1),
        expected_pod_uid: Some("pod-uid".to_owned()),
        expected_pvc_uid: Some("pvc-uid".to_owned()),
        created_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
    }
}

fn active_operation(id: &str) -> execution_provider::kube::crd::ActiveOperation {
    serde_json::from_value(serde_json::json!({
        "id": id, "operation": "command", "startedAt": "2027-01-15T08:00:00Z",
        "claimID": "c", "runID": "r", "epoch": 1, "holderID": "h",
        "renewedAt": "2027-01-15T08:00:00Z", "expiresAt": "2027-01-15T08:00:30Z",
    }))
    .unwrap()
}

/// A lease of claim `c` in `state` (`Running` or `Ended`).
fn command_lease(id: &str, state: &str) -> execution_provider::kube::crd::CommandLease {
    let mut lease = serde_json::json!({
        "id": id, "claimID": "c", "runID": "r", "epoch": 1, "grantGeneration": 1,
        "detached": true, "startedAt": "2027-01-15T08:00:00Z", "state": state,
    });
    if state == "Ended" {
        lease["outcome"] = serde_json::json!({
            "state": "Succeeded", "exitCode": 0, "endedAt": "2027-01-15T08:00:01Z",
            "reason": "Exited",
        });
    }
    serde_json::from_value(lease).unwrap()
}

/// An environment as the reconciler leaves it: provisioned, Ready, with a lifecycle op.
async fn base(world: &World) -> ExecutionEnvironment {
    let mut env = world.create_env(&registry()).await;
    let status = env.status.get_or_insert_with(Default::default);
    status.fence_state = Some(FenceState::Healthy);
    status.lifecycle_operation = Some(lifecycle(LifecyclePhase::Quiescing));
    env.metadata.generation = Some(1);
    env
}

#[tokio::test]
async fn only_fields_a_decision_depends_on_enqueue_an_updated_environment() {
    let world = World::new().await;
    let env = base(&world).await;
    type Edit = fn(&mut ExecutionEnvironment);
    let relevant: [(&str, Edit); 11] = [
        ("generation", |e| e.metadata.generation = Some(2)),
        ("deletionTimestamp", |e| {
            e.metadata.deletion_timestamp = Some(Time(Default::default()))
        }),
        ("finalizers", |e| e.metadata.finalizers = None),
        ("spec", |e| {
            e.spec.desired = execution_provider::kube::crd::Desired::Retiring
        }),
        ("activeOperation", |e| {
            e.status.as_mut().unwrap().active_operation = Some(active_operation("op-2"))
        }),
        ("lifecycle start", |e| {
            e.status.as_mut().unwrap().lifecycle_operation = None
        }),
        ("lifecycle phase", |e| {
            e.status.as_mut().unwrap().lifecycle_operation =
                Some(lifecycle(LifecyclePhase::WaitingForTermination))
        }),
        ("references", |e| {
            e.status.as_mut().unwrap().references = vec![ReferenceRecord {
                binding_id: "b".to_owned(),
                state: ReferenceState::PendingDelete,
                operation_id: "op".to_owned(),
                source_binding_id: None,
                created_at: RfcTime::from_system_time(std::time::UNIX_EPOCH),
            }]
        }),
        ("fenceState", |e| {
            e.status.as_mut().unwrap().fence_state = Some(FenceState::FenceUnknown)
        }),
        ("fenceState cleared", |e| {
            e.status.as_mut().unwrap().fence_state = None
        }),
        ("a claim's first open command", |e| {
            e.status.as_mut().unwrap().commands = vec![command_lease("cmd-1", "Running")]
        }),
    ];
    for (what, edit) in relevant {
        let mut changed = env.clone();
        edit(&mut changed);
        assert!(update_enqueues(&env, &changed), "{what} enqueues");
    }
    let controller_owned: [(&str, Edit); 6] = [
        ("status.pod", |e| {
            e.status.as_mut().unwrap().pod = Some(ObjectIdentity {
                name: "executor-x".to_owned(),
                uid: "new".to_owned(),
            })
        }),
        ("status.pvc", |e| {
            e.status.as_mut().unwrap().pvc = Some(ObjectIdentity {
                name: "workspace-x".to_owned(),
                uid: "new".to_owned(),
            })
        }),
        ("conditions", |e| {
            e.status.as_mut().unwrap().conditions.clear()
        }),
        ("epoch", |e| e.status.as_mut().unwrap().epoch = Some(7)),
        ("observedGeneration", |e| {
            e.status.as_mut().unwrap().observed_generation = Some(1)
        }),
        ("resourceVersion", |e| {
            e.metadata.resource_version = Some("999".to_owned())
        }),
    ];
    // Once a claim owns an open command, its further commands and their ends do not enqueue
    // again until the last one ends: the set of claims with open commands is what counts.
    let mut commanding = env.clone();
    commanding.status.as_mut().unwrap().commands = vec![command_lease("cmd-1", "Running")];
    let mut second = commanding.clone();
    second
        .status
        .as_mut()
        .unwrap()
        .commands
        .push(command_lease("cmd-2", "Running"));
    assert!(!update_enqueues(&commanding, &second), "a second command");
    let mut ended = commanding.clone();
    ended.status.as_mut().unwrap().commands = vec![command_lease("cmd-1", "Ended")];
    assert!(update_enqueues(&commanding, &ended), "the claim's last end");
    for (what, edit) in controller_owned {
        let mut changed = env.clone();
        edit(&mut changed);
        assert!(
            !update_enqueues(&env, &changed),
            "{what} alone does not enqueue"
        );
    }
}

#[test]
fn a_runtime_object_enqueues_the_environment_its_label_names_when_non_empty() {
    let labels = |value: &str| BTreeMap::from([(LABEL.to_owned(), value.to_owned())]);
    assert_eq!(environment_of(Some(&labels(ENV))), Some(ENV));
    assert_eq!(environment_of(Some(&labels(""))), None);
    assert_eq!(environment_of(Some(&BTreeMap::new())), None);
    assert_eq!(environment_of(None), None);
}

const LABEL: &str = "execution.mecatl.dev/environment";

/// A stray Pod in the namespace with these labels.
async fn stray_pod(world: &World, name: &str, labels: BTreeMap<String, String>) {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".to_owned(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    world
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_work_queue_reconciles_runtime_events_and_relevant_changes_but_not_its_own_writes() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let running = Running::start(world.reconciler(&templates, EXECUTOR_ACCOUNT)).await;
    let queued = || running.reconciler.queued_reconciles();
    wait_until("the executor Pod is created", || async {
        world.pod().await.is_some()
    })
    .await;
    // The kubelet's Ready flip is a labelled Pod event: it alone makes the environment Ready.
    world.mark_pod_ready().await;
    wait_until("the Pod event is reconciled", || async {
        ready(&world.env().await) == Some((ConditionStatus::True, "Reconciled".to_owned()))
    })
    .await;
    settle().await;
    let idle = queued();
    settle().await;
    assert_eq!(queued(), idle, "a Ready environment is not requeued");

    // Controller-owned status alone: not reconciled, so the erased condition stays erased.
    world
        .edit_status(|s| {
            s.conditions.clear();
            s.observed_generation = None;
        })
        .await;
    settle().await;
    assert_eq!(queued(), idle, "the reconciler's own fields do not enqueue");
    assert!(ready(&world.env().await).is_none());

    // A relevant status change (the fence state) is reconciled: Ready is written again.
    world
        .edit_status(|s| s.fence_state = Some(FenceState::Healthy))
        .await;
    wait_until("the fence-state change is reconciled", || async {
        ready(&world.env().await).is_some()
    })
    .await;
    settle().await;
    let after_status = queued();
    assert!(after_status > idle);

    // A labelled PVC update enqueues; stray Pods without the label, or with an empty one, do not.
    stray_pod(&world, "unlabelled", BTreeMap::new()).await;
    stray_pod(
        &world,
        "empty-label",
        BTreeMap::from([(LABEL.to_owned(), String::new())]),
    )
    .await;
    settle().await;
    assert_eq!(queued(), after_status, "unlabelled objects enqueue nothing");
    let mut pvc = world.pvc().await.unwrap();
    pvc.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("touched".to_owned(), "yes".to_owned());
    world
        .pvcs()
        .replace(&pvc_name(ENV), &PostParams::default(), &pvc)
        .await
        .unwrap();
    settle().await;
    assert!(queued() > after_status, "a labelled PVC event enqueues");

    // An admitted lifecycle operation enqueues and is acted on without any other event.
    let status = world.env().await.status.unwrap();
    let (pod_uid, pvc_uid) = (status.pod.unwrap().uid, status.pvc.unwrap().uid);
    world
        .edit_status(|s| {
            s.lifecycle_operation = Some(LifecycleOperation {
                expected_pod_uid: Some(pod_uid.clone()),
                expected_pvc_uid: Some(pvc_uid.clone()),
                ..lifecycle(LifecyclePhase::Quiescing)
            });
        })
        .await;
    wait_until("the admitted operation is picked up", || async {
        world
            .pod()
            .await
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    let env = world.env().await;
    assert_ne!(
        env.status.unwrap().lifecycle_operation.unwrap().phase,
        LifecyclePhase::Quiescing
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_labelled_pvc_alone_wakes_the_reconciler() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let running = Running::start(world.reconciler(&templates, EXECUTOR_ACCOUNT)).await;
    wait_until("the executor Pod is created", || async {
        world.pod().await.is_some()
    })
    .await;
    world.mark_pod_ready().await;
    wait_until("the environment is Ready", || async {
        ready(&world.env().await) == Some((ConditionStatus::True, "Reconciled".to_owned()))
    })
    .await;
    settle().await;
    let idle = running.reconciler.queued_reconciles();
    world
        .pvcs()
        .delete(&pvc_name(ENV), &Default::default())
        .await
        .unwrap();
    wait_until("the delete event is reconciled", || async {
        ready(&world.env().await).is_some_and(|(_, reason)| reason == "PVCUnavailable")
    })
    .await;
    assert!(running.reconciler.queued_reconciles() > idle);
    assert!(world.pvc().await.is_none(), "never re-created");
    running.stop().await;
}
