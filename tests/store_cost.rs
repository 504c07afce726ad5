//! The Kubernetes API requests each uncontended store operation makes, counted by the fault
//! layer in front of the in-process API server (documented in docs/store.md).

mod store_support;

use std::time::Duration;

use execution_provider::store::admin::AdminRequest;
use execution_provider::store::claims::AcquireRequest;
use store_support::*;

/// (reads, writes) since the last reset: GET/LIST vs POST/PUT/PATCH/DELETE.
fn take(world: &World) -> (usize, usize) {
    let mut f = world.faults.lock().expect("faults");
    let reads = f
        .counts
        .iter()
        .filter(|(k, _)| k.starts_with("GET"))
        .map(|(_, v)| v)
        .sum();
    let writes = f.writes;
    f.reset_counts();
    (reads, writes)
}

#[tokio::test(start_paused = true)]
async fn each_uncontended_operation_costs_what_the_documentation_says() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-e");
    take(&world);
    let a = store.ensure_template(&req).await.expect("ensure");
    assert_eq!(
        take(&world),
        (5, 3),
        "ensure (new): env, ledger, list, init, final reads"
    );
    store.ensure_template(&req).await.expect("replay");
    assert_eq!(take(&world), (3, 0), "ensure (replay)");
    store
        .commit_reference(&a.env, &req.caller, "b1", "op-e")
        .await
        .expect("commit");
    assert_eq!(take(&world), (1, 1), "commit");
    world.make_ready(&a.env.id).await;
    store
        .attach(&a.env, &req.caller, "b1")
        .await
        .expect("attach");
    assert_eq!(take(&world), (1, 0), "attach");
    let claim = store
        .acquire_run(&AcquireRequest {
            env: a.env.clone(),
            caller: req.caller.clone(),
            binding_id: "b1".into(),
            run_id: "r".into(),
            operation_id: "op-a".into(),
            ttl: Duration::from_secs(60),
        })
        .await
        .expect("acquire");
    assert_eq!(take(&world), (1, 1), "acquire");
    let rc = execution_provider::store::ClaimContext {
        env: a.env.clone(),
        binding_id: "b1".into(),
        run_id: claim.run_id.clone(),
        claim_id: claim.claim_id.clone(),
        epoch: claim.epoch,
        grant_generation: claim.grant_generation,
    };
    store
        .validate_run_claim(&req.caller, &rc)
        .await
        .expect("validate");
    assert_eq!(take(&world), (1, 0), "validate");
    store
        .execute(&req.caller, &rc, stat("a"))
        .await
        .expect("execute");
    assert_eq!(take(&world), (2, 2), "execute");
    store.release_run(&req.caller, &rc).await.expect("release");
    assert_eq!(take(&world), (1, 1), "release run");
    let q = AdminRequest {
        env: a.env.clone(),
        owner_hash: req.caller.owner_hash.clone(),
        actor: CLIENT.into(),
        administrator_for: Vec::new(),
        expected_epoch: 0,
        expected_pod_uid: String::new(),
        expected_pvc_uid: String::new(),
        operation_id: "rev".into(),
    };
    store.revoke_environment(&q, 1).await.expect("revoke");
    assert_eq!(take(&world), (1, 1), "revoke");
    store
        .reserve_successor(&a.env, &req.caller, "b1", "b2", "op-r")
        .await
        .expect("reserve");
    assert_eq!(take(&world), (1, 1), "reserve successor");
    store
        .list_reference_intents(&req.caller, 0)
        .await
        .expect("list");
    assert_eq!(take(&world), (1, 0), "list intents");
}
