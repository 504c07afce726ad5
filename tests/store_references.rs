//! Reference intents (store §6) against the in-process API server: exact two-phase
//! transitions and replays, successor reservation with atomic reclaim of an expired run,
//! strict parsing, the limit of 64, and the three discovery modes.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{ExecutionEnvironment, ReferenceState};
use execution_provider::store::Store;
use kube::api::PostParams;
use store_support::*;

fn states(o: &ExecutionEnvironment) -> Vec<(String, ReferenceState)> {
    o.status
        .as_ref()
        .map(|s| {
            s.references
                .iter()
                .map(|r| (r.binding_id.clone(), r.state))
                .collect()
        })
        .unwrap_or_default()
}

async fn edit(world: &World, name: &str, f: impl FnOnce(&mut ExecutionEnvironment)) {
    let api = world.environments();
    let mut o = api.get(name).await.expect("get");
    f(&mut o);
    api.replace_status(name, &PostParams::default(), &o)
        .await
        .expect("edit");
}

async fn published(world: &World, store: &Store, subject: &str, binding: &str) -> Claimed {
    let req = ensure_request(world, CLIENT, subject, binding, "roomy", "op-ensure");
    let a = store.ensure_template(&req).await.expect("ensure");
    store
        .commit_reference(&a.env, &req.caller, binding, "op-ensure")
        .await
        .expect("commit");
    let rc = execution_provider::store::ClaimContext {
        env: a.env.clone(),
        binding_id: binding.to_owned(),
        run_id: String::new(),
        claim_id: String::new(),
        epoch: 0,
        grant_generation: 0,
    };
    Claimed {
        caller: req.caller,
        env: a.env,
        rc,
    }
}

#[tokio::test]
async fn reference_transactions_replay_and_never_change_the_source() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    for _ in 0..2 {
        store
            .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
            .await
            .expect("reserve (and replay)");
    }
    let found = store
        .find_reference_intent(&c.env, &c.caller, "dst")
        .await
        .expect("find");
    assert_eq!(found.record.state, ReferenceState::PendingCreate);
    assert_eq!(found.record.source_binding_id.as_deref(), Some("src"));
    let listed = store
        .list_reference_intents(&c.caller, 0)
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    store
        .commit_reference(&c.env, &c.caller, "dst", "op-r")
        .await
        .expect("commit");
    store
        .commit_reference(&c.env, &c.caller, "dst", "op-r")
        .await
        .expect("replay");
    store
        .prepare_reference_delete(&c.env, &c.caller, "dst", "op-d")
        .await
        .expect("prepare");
    store
        .prepare_reference_delete(&c.env, &c.caller, "dst", "op-d")
        .await
        .expect("prepare replay");
    let other = store
        .cancel_reference_delete(&c.env, &c.caller, "dst", "op-other")
        .await
        .expect_err("other op");
    assert_eq!(other.code(), ErrorCode::Conflict);
    store
        .cancel_reference_delete(&c.env, &c.caller, "dst", "op-d")
        .await
        .expect("cancel");
    let o = world.get(&c.env.id).await;
    assert_eq!(
        states(&o),
        vec![
            ("dst".to_owned(), ReferenceState::Published),
            ("src".to_owned(), ReferenceState::Published)
        ]
    );
}

#[tokio::test]
async fn abort_and_confirm_remove_records_and_replay_as_success() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    store
        .reserve_successor(&c.env, &c.caller, "src", "a", "op-a")
        .await
        .expect("reserve");
    let wrong = store
        .abort_reference(&c.env, &c.caller, "a", "op-x")
        .await
        .expect_err("op");
    assert_eq!(wrong.code(), ErrorCode::Conflict);
    store
        .abort_reference(&c.env, &c.caller, "a", "op-a")
        .await
        .expect("abort");
    store
        .abort_reference(&c.env, &c.caller, "a", "op-a")
        .await
        .expect("abort replay");
    store
        .prepare_reference_delete(&c.env, &c.caller, "src", "op-d")
        .await
        .expect("prepare");
    let released = store
        .release_reference(&c.env, &c.caller, "src")
        .await
        .expect_err("pending");
    assert_eq!(released.code(), ErrorCode::Conflict);
    store
        .confirm_reference_delete(&c.env, &c.caller, "src", "op-d")
        .await
        .expect("confirm");
    store
        .confirm_reference_delete(&c.env, &c.caller, "src", "op-d")
        .await
        .expect("replay");
    assert!(states(&world.get(&c.env.id).await).is_empty());
    let missing = store
        .commit_reference(&c.env, &c.caller, "src", "op-d")
        .await
        .expect_err("gone");
    assert_eq!(missing.code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn a_foreign_caller_sees_not_found_before_any_state() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    edit(&world, &c.env.id, |o| {
        o.status.as_mut().expect("status").lifecycle_operation = Some(
            serde_json::from_value(serde_json::json!({
                "id": "life", "type": "RetireEnvironment", "phase": "Quiescing",
                "expectedPVCUID": "pvc", "createdAt": "2027-01-15T08:00:00Z"
            }))
            .expect("lifecycle"),
        );
    })
    .await;
    let mine = store
        .prepare_reference_delete(&c.env, &c.caller, "src", "op")
        .await;
    assert_eq!(mine.expect_err("transitioning").code(), ErrorCode::NotReady);
    let bob = caller_of(CLIENT, "bob");
    let foreign = store
        .prepare_reference_delete(&c.env, &bob, "src", "op")
        .await;
    assert_eq!(foreign.expect_err("foreign").code(), ErrorCode::NotFound);
    let other_client = caller_of(OTHER_CLIENT, "alice");
    let foreign = store
        .reserve_successor(&c.env, &other_client, "src", "d", "op")
        .await;
    assert_eq!(foreign.expect_err("foreign").code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn reserve_successor_reclaims_only_an_expired_quiescent_run() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "src", Duration::from_secs(30)).await;
    let live = store
        .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
        .await;
    assert_eq!(live.expect_err("unexpired").code(), ErrorCode::Conflict);
    assert_eq!(states(&world.get(&c.env.id).await).len(), 1, "no change");
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(31)).await;
    edit(&world, &c.env.id, |o| {
        let status = o.status.as_mut().expect("status");
        status.active_operation = Some(
            serde_json::from_value(serde_json::json!({
                "id": "op", "operation": "file.stat", "startedAt": "2027-01-15T08:00:00Z",
                "claimID": c.rc.claim_id, "runID": "run-1", "epoch": c.rc.epoch, "holderID": "h",
                "renewedAt": "2027-01-15T08:00:00Z", "expiresAt": "2027-01-15T08:00:30Z"
            }))
            .expect("op"),
        );
    })
    .await;
    let busy = store
        .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
        .await;
    assert_eq!(busy.expect_err("active op").code(), ErrorCode::Conflict);
    edit(&world, &c.env.id, |o| {
        o.status.as_mut().expect("status").active_operation = None;
    })
    .await;
    store
        .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
        .await
        .expect("reclaimed");
    let o = world.get(&c.env.id).await;
    assert!(
        o.status.as_ref().expect("status").active_run.is_none(),
        "run removed atomically"
    );
    assert_eq!(states(&o).len(), 2);
}

#[tokio::test]
async fn the_sixty_fifth_reference_is_refused() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    for i in 0..63 {
        store
            .reserve_successor(
                &c.env,
                &c.caller,
                "src",
                &format!("d{i:02}"),
                &format!("op{i}"),
            )
            .await
            .expect("reserve");
    }
    let err = store
        .reserve_successor(&c.env, &c.caller, "src", "overflow", "op-x")
        .await
        .expect_err("limit");
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    assert_eq!(
        store
            .list_reference_intents(&c.caller, 0)
            .await
            .expect("list")
            .len(),
        63
    );
    assert_eq!(
        store
            .list_reference_intents(&c.caller, 5)
            .await
            .expect("list")
            .len(),
        5
    );
}

#[tokio::test]
async fn corrupt_reference_records_fail_closed() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    edit(&world, &c.env.id, |o| {
        let refs = &mut o.status.as_mut().expect("status").references;
        refs.push(refs[0].clone());
    })
    .await;
    let err = store
        .reserve_successor(&c.env, &c.caller, "src", "d", "op")
        .await;
    assert_eq!(err.expect_err("duplicate").code(), ErrorCode::Conflict);
    let err = store.list_reference_intents(&c.caller, 0).await;
    assert_eq!(
        err.expect_err("listing fails whole").code(),
        ErrorCode::Conflict
    );
}

#[tokio::test]
async fn exact_intent_lookup_is_not_truncated_by_the_listing_limit() {
    let world = World::new().await;
    let store = world.store();
    let mut last = None;
    for i in 0..66 {
        let binding = format!("b{i:02}");
        let req = ensure_request(&world, CLIENT, "alice", &binding, "roomy", "op-e");
        let a = store.ensure_template(&req).await.expect("ensure");
        last = Some((a.env, req.caller, binding));
    }
    let (env, caller, binding) = last.expect("made");
    assert_eq!(
        store
            .list_reference_intents(&caller, 0)
            .await
            .expect("list")
            .len(),
        64
    );
    let found = store
        .find_reference_intent(&env, &caller, &binding)
        .await
        .expect("exact");
    assert_eq!(found.record.binding_id, binding);
    let bob = caller_of(CLIENT, "bob");
    let foreign = store.find_reference_intent(&env, &bob, &binding).await;
    assert_eq!(
        foreign.expect_err("other owner").code(),
        ErrorCode::NotFound
    );
    let other = caller_of(OTHER_CLIENT, "alice");
    let foreign = store.find_reference_intent(&env, &other, &binding).await;
    assert_eq!(
        foreign.expect_err("other client").code(),
        ErrorCode::NotFound
    );
}

#[tokio::test]
async fn the_client_scoped_listing_carries_the_owner_only_to_the_owning_client() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    store
        .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
        .await
        .expect("reserve");
    let mine = store
        .list_reference_intents_for_client(CLIENT, 0)
        .await
        .expect("mine");
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].owner, Some((ISSUER.to_owned(), "alice".to_owned())));
    let theirs = store
        .list_reference_intents_for_client(OTHER_CLIENT, 0)
        .await
        .expect("theirs");
    assert!(theirs.is_empty());
}

#[tokio::test]
async fn a_tampered_owner_attestation_exposes_no_intents() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "src").await;
    store
        .reserve_successor(&c.env, &c.caller, "src", "dst", "op-r")
        .await
        .expect("reserve");
    // The spec is write-once in a real cluster; the in-process server lets the test forge it.
    let api = world.environments();
    let mut o = api.get(&c.env.id).await.expect("get");
    o.spec.owner_subject = Some("mallory".to_owned());
    api.replace(&c.env.id, &PostParams::default(), &o)
        .await
        .expect("forge");
    let before = world.server.resource_version();
    let err = store.list_reference_intents_for_client(CLIENT, 0).await;
    assert_eq!(err.expect_err("tampered").code(), ErrorCode::Conflict);
    assert_eq!(world.server.resource_version(), before, "no writes");
}

#[tokio::test]
async fn a_published_binding_reattaches_without_a_new_ensure_operation() {
    let world = World::new().await;
    let store = world.store();
    let c = published(&world, &store, "alice", "b1").await;
    world.make_ready(&c.env.id).await;
    let again = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-new");
    let err = store.ensure_template(&again).await.expect_err("new op id");
    assert_eq!(err.code(), ErrorCode::Conflict);
    let before = world.server.resource_version();
    let a = store.attach(&c.env, &c.caller, "b1").await.expect("attach");
    assert!(a.ready);
    let wrong_rev = execution_provider::store::EnvRef {
        id: c.env.id.clone(),
        revision: "0".repeat(32),
    };
    assert_eq!(
        store
            .attach(&wrong_rev, &c.caller, "b1")
            .await
            .expect_err("rev")
            .code(),
        ErrorCode::Conflict
    );
    assert_eq!(
        store
            .attach(&c.env, &caller_of(CLIENT, "bob"), "b1")
            .await
            .expect_err("owner")
            .code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        store
            .attach(&c.env, &c.caller, "b2")
            .await
            .expect_err("binding")
            .code(),
        ErrorCode::NotFound
    );
    assert_eq!(world.server.resource_version(), before, "no durable change");
}
