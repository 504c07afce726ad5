//! Administrator lifecycle and revocation (store §7, DECISIONS 3 and 10) against the
//! in-process API server: subject rules, exact identity admission, termination proof,
//! recovery, retained deletion admission, revocation receipts, and migration refusal.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironment, FenceState, LifecyclePhase,
    LifecycleType, ObjectIdentity, RfcTime,
};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::{Caller, EnvRef, Store};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaim,
    Pod, PodSpec, PodStatus,
};
use kube::api::{Api, ObjectMeta, PostParams};
use store_support::*;

const ADMIN: &str = "spiffe://test.local/ns/ops/admin";

async fn edit(world: &World, name: &str, f: impl FnOnce(&mut ExecutionEnvironment)) {
    let api = world.environments();
    let mut o = api.get(name).await.expect("get");
    f(&mut o);
    api.replace_status(name, &PostParams::default(), &o)
        .await
        .expect("edit");
}

/// Creates the executor Pod and workspace PVC objects and records their identities.
async fn runtime_objects(world: &World, env: &str, terminal: bool) -> (String, String) {
    let client = world.server.client(NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, NAMESPACE);
    let meta = |name: String| ObjectMeta {
        name: Some(name),
        ..ObjectMeta::default()
    };
    let pod = Pod {
        metadata: meta(format!("executor-{env}")),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "executor".to_owned(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    if terminal {
        let mut pod = pod.clone();
        pod.status = Some(PodStatus {
            phase: Some("Succeeded".to_owned()),
            container_statuses: Some(vec![ContainerStatus {
                name: "executor".to_owned(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        pods.replace_status(&format!("executor-{env}"), &PostParams::default(), &pod)
            .await
            .expect("terminal");
    }
    let pvc = PersistentVolumeClaim {
        metadata: meta(format!("workspace-{env}")),
        ..PersistentVolumeClaim::default()
    };
    let pvc = pvcs
        .create(&PostParams::default(), &pvc)
        .await
        .expect("pvc");
    let (pod_uid, pvc_uid) = (
        pod.metadata.uid.expect("uid"),
        pvc.metadata.uid.expect("uid"),
    );
    let (pu, vu) = (pod_uid.clone(), pvc_uid.clone());
    edit(world, env, move |o| {
        let status = o.status.as_mut().expect("status");
        status.pod = Some(ObjectIdentity {
            name: format!("executor-{env}"),
            uid: pu,
        });
        status.pvc = Some(ObjectIdentity {
            name: format!("workspace-{env}"),
            uid: vu,
        });
    })
    .await;
    (pod_uid, pvc_uid)
}

/// A Ready environment of alice's binding `b1`, committed.
async fn ready_env(world: &World, store: &Store) -> (EnvRef, Caller) {
    let req = ensure_request(world, CLIENT, "alice", "b1", "roomy", "op-e");
    let a = store.ensure_template(&req).await.expect("ensure");
    store
        .commit_reference(&a.env, &req.caller, "b1", "op-e")
        .await
        .expect("commit");
    world.make_ready(&a.env.id).await;
    (a.env, req.caller)
}

async fn admin_of(
    world: &World,
    env: &EnvRef,
    caller: &Caller,
    actor: &str,
    op: &str,
) -> AdminRequest {
    let o = world.get(&env.id).await;
    let status = o.status.expect("status");
    AdminRequest {
        env: env.clone(),
        owner_hash: caller.owner_hash.clone(),
        actor: actor.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: status.epoch.expect("epoch"),
        expected_pod_uid: status.pod.map(|p| p.uid).unwrap_or_default(),
        expected_pvc_uid: status.pvc.map(|p| p.uid).unwrap_or_default(),
        operation_id: op.to_owned(),
    }
}

fn acquire(env: &EnvRef, caller: &Caller, op: &str) -> AcquireRequest {
    AcquireRequest {
        env: env.clone(),
        caller: caller.clone(),
        binding_id: "b1".to_owned(),
        run_id: "run".to_owned(),
        operation_id: op.to_owned(),
        ttl: Duration::from_secs(60),
    }
}

fn status_of(
    o: &ExecutionEnvironment,
) -> execution_provider::kube::crd::ExecutionEnvironmentStatus {
    o.status.clone().expect("status")
}

#[tokio::test]
async fn revocation_ends_the_claim_without_changing_the_epoch_and_replays_by_operation() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let epoch = c.rc.epoch;
    let q = admin_of(&world, &c.env, &c.caller, CLIENT, "rev-1").await;
    assert_eq!(store.revoke_environment(&q, 1).await.expect("revoke"), 2);
    let o = world.get(&c.env.id).await;
    assert_eq!(status_of(&o).epoch, Some(epoch));
    assert!(
        status_of(&o).active_run.is_none(),
        "DECISIONS 10: the claim is ended"
    );
    let stale = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("stale");
    assert_eq!(stale.code(), ErrorCode::Conflict);
    assert_eq!(world.executor.call_count(), 0);
    assert_eq!(store.revoke_environment(&q, 1).await.expect("replay"), 2);
    let again = admin_of(&world, &c.env, &c.caller, CLIENT, "rev-2").await;
    let err = store
        .revoke_environment(&again, 1)
        .await
        .expect_err("stale expected");
    assert_eq!(err.code(), ErrorCode::Conflict);
    let reuse = store
        .revoke_environment(&q, 2)
        .await
        .expect_err("op id reused");
    assert_eq!(reuse.code(), ErrorCode::Conflict);
    let claim = store
        .acquire_run(&acquire(&c.env, &c.caller, "op-new"))
        .await
        .expect("fresh");
    assert_eq!(claim.grant_generation, 2);
    assert_eq!(
        status_of(&world.get(&c.env.id).await)
            .revocation_receipts
            .len(),
        1
    );
}

#[tokio::test]
async fn revocation_overflow_and_bad_arguments_fail_closed() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    let q = admin_of(&world, &env, &caller, CLIENT, "rev").await;
    for expected in [0, i64::MAX as u64, u64::MAX] {
        let err = store
            .revoke_environment(&q, expected)
            .await
            .expect_err("range");
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }
}

#[tokio::test]
async fn an_admin_out_of_scope_sees_not_found_and_a_scoped_admin_acts() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    let mut q = admin_of(&world, &env, &caller, ADMIN, "rev").await;
    let err = store
        .revoke_environment(&q, 1)
        .await
        .expect_err("out of scope");
    assert_eq!(err.code(), ErrorCode::NotFound);
    q.administrator_for = vec![CLIENT.to_owned()];
    let mut wrong_owner = q.clone();
    wrong_owner.owner_hash = caller_of(CLIENT, "bob").owner_hash;
    let err = store
        .revoke_environment(&wrong_owner, 1)
        .await
        .expect_err("owner");
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(store.revoke_environment(&q, 1).await.expect("scoped"), 2);
}

#[tokio::test]
async fn retirement_requires_exact_identity_no_references_and_blocks_new_work() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    runtime_objects(&world, &env.id, false).await;
    let q = admin_of(&world, &env, &caller, CLIENT, "retire-1").await;
    let refs = store
        .retire_environment(&q)
        .await
        .expect_err("still referenced");
    assert_eq!(refs.code(), ErrorCode::Conflict);
    store
        .release_reference(&env, &caller, "b1")
        .await
        .expect("release");
    let mut stale = q.clone();
    stale.expected_epoch += 1;
    let err = store.retire_environment(&stale).await.expect_err("epoch");
    assert_eq!(err.code(), ErrorCode::Conflict);
    store.retire_environment(&q).await.expect("admitted");
    store
        .retire_environment(&q)
        .await
        .expect("in-progress replay");
    let op = status_of(&world.get(&env.id).await)
        .lifecycle_operation
        .expect("op");
    assert_eq!(
        (op.type_, op.phase),
        (LifecycleType::RetireEnvironment, LifecyclePhase::Quiescing)
    );
    let other = admin_of(&world, &env, &caller, CLIENT, "retire-2").await;
    let err = store
        .retire_environment(&other)
        .await
        .expect_err("other op");
    assert_eq!(err.code(), ErrorCode::Conflict);
    let err = store
        .acquire_run(&acquire(&env, &caller, "op-a"))
        .await
        .expect_err("blocked");
    assert_eq!(err.code(), ErrorCode::NotReady);
    let err = store
        .replace_executor(&other)
        .await
        .expect_err("single lifecycle");
    assert_eq!(err.code(), ErrorCode::Conflict);
}

#[tokio::test]
async fn a_live_claim_blocks_lifecycle_and_an_expired_exact_claim_is_reclaimed_atomically() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    runtime_objects(&world, &c.env.id, false).await;
    let q = admin_of(&world, &c.env, &c.caller, CLIENT, "replace-1").await;
    let before = world.server.resource_version();
    let err = store.replace_executor(&q).await.expect_err("live claim");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_eq!(world.server.resource_version(), before, "zero mutation");
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(31)).await;
    store.replace_executor(&q).await.expect("admitted");
    let status = status_of(&world.get(&c.env.id).await);
    assert!(status.active_run.is_none());
    assert!(status.lifecycle_operation.is_some());
}

#[tokio::test]
async fn a_not_ready_environment_needs_a_terminal_proof_of_its_exact_pod() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    runtime_objects(&world, &env.id, false).await;
    edit(&world, &env.id, |o| {
        o.status.as_mut().expect("status").conditions.clear();
    })
    .await;
    let q = admin_of(&world, &env, &caller, CLIENT, "replace-1").await;
    let err = store
        .replace_executor(&q)
        .await
        .expect_err("running pod proves nothing");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert!(
        status_of(&world.get(&env.id).await)
            .termination_proof
            .is_none()
    );
    // The same Pod has since terminated on its own.
    let pods: Api<Pod> = Api::namespaced(world.server.client(NAMESPACE), NAMESPACE);
    let mut pod = pods
        .get(&format!("executor-{}", env.id))
        .await
        .expect("pod");
    pod.status = Some(PodStatus {
        phase: Some("Failed".to_owned()),
        container_statuses: Some(vec![ContainerStatus {
            name: "executor".to_owned(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    });
    pods.replace_status(
        &format!("executor-{}", env.id),
        &PostParams::default(),
        &pod,
    )
    .await
    .expect("terminal");
    store
        .replace_executor(&q)
        .await
        .expect("admitted with proof");
    let status = status_of(&world.get(&env.id).await);
    let proof = status.termination_proof.expect("proof");
    assert_eq!(
        (proof.pod_uid, proof.operation_id),
        (q.expected_pod_uid.clone(), q.operation_id.clone())
    );
    assert!(status.lifecycle_operation.is_some());
}

#[tokio::test]
async fn recovery_clears_the_fence_only_on_proof_of_the_exact_terminal_pod() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Break);
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("fenced");
    let (pod_uid, _) = runtime_objects(&world, &c.env.id, false).await;
    let q = admin_of(&world, &c.env, &c.caller, CLIENT, "recover-1").await;
    assert_eq!(q.expected_pod_uid, pod_uid);
    let before = world.get(&c.env.id).await;
    let err = store
        .recover_environment(&q)
        .await
        .expect_err("pod still running");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert_eq!(
        world.get(&c.env.id).await.status,
        before.status,
        "failed recovery changes nothing"
    );
    let pods: Api<Pod> = Api::namespaced(world.server.client(NAMESPACE), NAMESPACE);
    pods.delete(&format!("executor-{}", c.env.id), &Default::default())
        .await
        .expect("delete");
    let err = store
        .recover_environment(&q)
        .await
        .expect_err("a missing pod proves nothing");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
}

#[tokio::test]
async fn recovery_with_a_terminal_pod_restores_health_without_readiness() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Break);
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("fenced");
    runtime_objects(&world, &c.env.id, true).await;
    let q = admin_of(&world, &c.env, &c.caller, CLIENT, "recover-1").await;
    store.recover_environment(&q).await.expect("recovered");
    store.recover_environment(&q).await.expect("replay");
    let status = status_of(&world.get(&c.env.id).await);
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none() && status.active_run.is_none());
    assert_eq!(status.epoch, Some(c.rc.epoch), "epoch unchanged");
    let not_fenced = admin_of(&world, &c.env, &c.caller, CLIENT, "recover-2").await;
    let err = store
        .recover_environment(&not_fenced)
        .await
        .expect_err("not fenced");
    assert_eq!(err.code(), ErrorCode::Conflict);
}

#[tokio::test]
async fn deletion_of_a_retired_environment_is_admitted_only_when_safely_retained() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    runtime_objects(&world, &env.id, false).await;
    let q = admin_of(&world, &env, &caller, CLIENT, "delete-1").await;
    let err = store
        .delete_retired_environment(&q)
        .await
        .expect_err("not retired");
    assert_eq!(err.code(), ErrorCode::Conflict);
    store
        .release_reference(&env, &caller, "b1")
        .await
        .expect("release");
    let now = RfcTime::from_system_time(world.clock_now());
    edit(&world, &env.id, |o| {
        let conditions = &mut o.status.as_mut().expect("status").conditions;
        conditions.clear();
        for t in ["Retired", "ExecutorTerminated"] {
            conditions.push(EnvironmentCondition {
                type_: t.to_owned(),
                status: ConditionStatus::True,
                reason: "Retained".to_owned(),
                message: String::new(),
                observed_generation: 1,
                last_transition_time: now,
            });
        }
    })
    .await;
    let mut wrong = q.clone();
    wrong.expected_pvc_uid = "other".to_owned();
    let err = store
        .delete_retired_environment(&wrong)
        .await
        .expect_err("pvc uid");
    assert_eq!(err.code(), ErrorCode::Conflict);
    store
        .delete_retired_environment(&q)
        .await
        .expect("admitted");
    store.delete_retired_environment(&q).await.expect("replay");
    let op = status_of(&world.get(&env.id).await)
        .lifecycle_operation
        .expect("op");
    assert_eq!(op.phase, LifecyclePhase::DeletingPvc);
}

#[tokio::test]
async fn migration_refuses_every_environment_it_does_not_know_how_to_upgrade() {
    let world = World::new().await;
    let store = world.store();
    let (env, caller) = ready_env(&world, &store).await;
    runtime_objects(&world, &env.id, false).await;
    let q = admin_of(&world, &env, &caller, CLIENT, "migrate-1").await;
    let before = world.server.resource_version();
    let err = store
        .migrate_environment(&q, 1)
        .await
        .expect_err("already current");
    assert_eq!(err.code(), ErrorCode::Conflict);
    let err = store
        .migrate_environment(&q, 2)
        .await
        .expect_err("unknown source");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(world.server.resource_version(), before, "nothing rewritten");
}
