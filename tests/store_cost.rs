//! The Kubernetes API requests each uncontended store operation makes, counted by the fault
//! layer in front of the in-process API server (documented in docs/store.md).

mod store_support;

use std::time::Duration;

use execution_provider::executor::protocol::ExecutorRequest;
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
        "ensure (new, first of its template on this replica): env, ledger root (no entry \
         of the format before sharding), ledger home shard, init, final reads"
    );
    let second = ensure_request(&world, CLIENT, "alice", "b-second", "roomy", "op-e2");
    store.ensure_template(&second).await.expect("second");
    assert_eq!(
        take(&world),
        (4, 3),
        "ensure (new): env, ledger home shard, init, final reads; no list"
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
    let validated = store
        .validate_run_claim(&req.caller, &rc)
        .await
        .expect("validate");
    assert_eq!(take(&world), (1, 0), "validate");
    store
        .execute_validated(validated, stat("a"))
        .await
        .expect("execute");
    assert_eq!(
        take(&world),
        (0, 2),
        "execute after validation: admission, completion"
    );
    store
        .execute(&req.caller, &rc, stat("a"))
        .await
        .expect("execute");
    assert_eq!(take(&world), (1, 2), "execute without validation");
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

/// A whole data-plane call as the handler makes it: validation, then the dispatch.
async fn data_plane_call(world: &World, c: &Claimed, request: ExecutorRequest) -> (usize, usize) {
    let store = world.store();
    take(world);
    let validated = store
        .validate_run_claim(&c.caller, &c.rc)
        .await
        .expect("validate");
    store
        .execute_validated(validated, request)
        .await
        .expect("dispatch");
    take(world)
}

#[tokio::test(start_paused = true)]
async fn an_uncontended_file_or_command_call_costs_exactly_one_read_and_two_writes() {
    let world = World::new().await;
    let c = claimed(&world, &world.store(), "alice", "b1").await;
    assert_eq!(data_plane_call(&world, &c, stat("a")).await, (1, 2), "file");
    world.executor.push(Script::Command {
        receipt: "done",
        output: 3,
    });
    let command = ExecutorRequest::command("cmd".to_owned(), "true".to_owned());
    assert_eq!(
        data_plane_call(&world, &c, command).await,
        (1, 2),
        "command"
    );
    let f = world.faults.lock().expect("faults");
    assert_eq!(
        f.count("GET", "pods"),
        0,
        "the Pod name comes from the status"
    );
}

#[tokio::test(start_paused = true)]
async fn each_lease_renewal_of_a_long_call_adds_one_write_and_no_read() {
    let world = World::new().await;
    let c = claimed(&world, &world.store(), "alice", "b1").await;
    // 35 s: renewals at 10, 20 and 30 s.
    world.executor.push(Script::Sleep(Duration::from_secs(35)));
    assert_eq!(data_plane_call(&world, &c, stat("a")).await, (1, 5));
}

#[tokio::test(start_paused = true)]
async fn a_lost_race_costs_one_more_read_and_write_and_is_decided_on_fresh_state() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let validated = store
        .validate_run_claim(&c.caller, &c.rc)
        .await
        .expect("validate");
    // Another writer changes the environment between validation and admission.
    let api = world.environments();
    let mut o = api.get(&c.env.id).await.expect("get");
    let status = o.status.as_mut().expect("status");
    status.conditions[0].message = "observed again".to_owned();
    api.replace_status(&c.env.id, &Default::default(), &o)
        .await
        .expect("peer write");
    take(&world);
    store
        .execute_validated(validated, stat("a"))
        .await
        .expect("dispatch");
    assert_eq!(
        take(&world),
        (1, 3),
        "409 on admission, re-read, admission, completion"
    );
}

#[tokio::test(start_paused = true)]
async fn each_reference_transition_costs_one_read_and_one_write() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    store
        .release_run(&c.caller, &c.rc)
        .await
        .expect("release run");
    let (env, caller) = (&c.env, &c.caller);
    take(&world);
    store
        .reserve_successor(env, caller, "b1", "b2", "op-r")
        .await
        .expect("reserve");
    assert_eq!(take(&world), (1, 1), "reserve successor");
    store
        .abort_reference(env, caller, "b2", "op-r")
        .await
        .expect("abort");
    assert_eq!(take(&world), (1, 1), "abort");
    store
        .prepare_reference_delete(env, caller, "b1", "op-d")
        .await
        .expect("prepare");
    assert_eq!(take(&world), (1, 1), "prepare delete");
    store
        .find_reference_intent(env, caller, "b1")
        .await
        .expect("find");
    assert_eq!(take(&world), (1, 0), "find intent");
    store
        .cancel_reference_delete(env, caller, "b1", "op-d")
        .await
        .expect("cancel");
    assert_eq!(take(&world), (1, 1), "cancel delete");
    store
        .prepare_reference_delete(env, caller, "b1", "op-d2")
        .await
        .expect("prepare");
    take(&world);
    store
        .confirm_reference_delete(env, caller, "b1", "op-d2")
        .await
        .expect("confirm");
    assert_eq!(take(&world), (1, 1), "confirm delete");
    store
        .reserve_successor(env, caller, "b1", "b3", "op-r3")
        .await
        .expect_err("source gone");
    assert_eq!(take(&world), (1, 0), "a refusal writes nothing");
}

#[tokio::test(start_paused = true)]
async fn releasing_a_reference_and_the_detached_command_queries_cost_one_read() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    take(&world);
    store
        .validate_run_claim(&c.caller, &c.rc)
        .await
        .expect("command status / cancel authorize like this, then answer UNIMPLEMENTED");
    assert_eq!(take(&world), (1, 0), "command status / cancel");
    store
        .release_reference(&c.env, &c.caller, "b1")
        .await
        .expect("release reference");
    assert_eq!(take(&world), (1, 1), "release reference");
}
