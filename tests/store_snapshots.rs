//! insta snapshots of the status document after the canonical sequences: ensure, commit,
//! claim, dispatch, revoke, retire, recovery. Clock, ids and names are deterministic, so any
//! change in what the store writes shows up as a snapshot diff.

mod store_support;

use execution_provider::kube::crd::ExecutionEnvironmentStatus;
use execution_provider::store::admin::AdminRequest;
use store_support::*;

async fn status(world: &World, name: &str) -> ExecutionEnvironmentStatus {
    world.get(name).await.status.expect("status")
}

#[tokio::test(start_paused = true)]
async fn the_status_document_after_each_canonical_step() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-ensure");
    let a = store.ensure_template(&req).await.expect("ensure");
    insta::assert_yaml_snapshot!("1_ensured", status(&world, &a.env.id).await);
    let c = claimed(&world, &store, "alice", "b1").await;
    insta::assert_yaml_snapshot!("2_claimed", status(&world, &a.env.id).await);
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect("dispatch");
    insta::assert_yaml_snapshot!("3_dispatched", status(&world, &a.env.id).await);
    let q = AdminRequest {
        env: c.env.clone(),
        owner_hash: c.caller.owner_hash.clone(),
        actor: CLIENT.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: c.rc.epoch,
        expected_pod_uid: format!("pod-uid-{}", c.env.id),
        expected_pvc_uid: format!("pvc-uid-{}", c.env.id),
        operation_id: "revoke-1".to_owned(),
    };
    store.revoke_environment(&q, 1).await.expect("revoke");
    insta::assert_yaml_snapshot!("4_revoked", status(&world, &a.env.id).await);
    store
        .release_reference(&c.env, &c.caller, "b1")
        .await
        .expect("release");
    let retire = AdminRequest {
        operation_id: "retire-1".to_owned(),
        ..q
    };
    store.retire_environment(&retire).await.expect("retire");
    insta::assert_yaml_snapshot!("5_retiring", status(&world, &a.env.id).await);
}

#[tokio::test(start_paused = true)]
async fn the_status_document_after_an_uncertain_dispatch() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Break);
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("fenced");
    insta::assert_yaml_snapshot!("fenced", status(&world, &c.env.id).await);
}
