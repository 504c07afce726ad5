//! Run-claim scenarios of the §12 catalogue (store §4, DECISIONS 8-9) against the in-process
//! API server with paused time.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::FenceState;
use execution_provider::store::claims::AcquireRequest;
use kube::api::PostParams;
use store_support::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn renewal_at_the_exact_expiry_is_refused_and_leaves_the_expiry_untouched() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let before = world
        .get(&c.env.id)
        .await
        .status
        .expect("status")
        .active_run;
    let err = store
        .renew_run(&c.caller, &c.rc, "renew-1", MINUTE)
        .await
        .expect_err("boundary");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_eq!(
        world
            .get(&c.env.id)
            .await
            .status
            .expect("status")
            .active_run,
        before
    );
}

#[tokio::test(start_paused = true)]
async fn a_renewal_replay_returns_the_first_expiry_without_extending() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", MINUTE).await;
    let first = store
        .renew_run(&c.caller, &c.rc, "renew-1", MINUTE)
        .await
        .expect("renew");
    tokio::time::advance(Duration::from_secs(10)).await;
    let replay = store
        .renew_run(&c.caller, &c.rc, "renew-1", MINUTE)
        .await
        .expect("replay");
    assert_eq!(replay.expires_at, first.expires_at);
    let other_ttl = store
        .renew_run(&c.caller, &c.rc, "renew-1", Duration::from_secs(90))
        .await;
    assert_eq!(
        other_ttl.expect_err("same op, other ttl").code(),
        ErrorCode::Conflict
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    let late = store.renew_run(&c.caller, &c.rc, "renew-1", MINUTE).await;
    assert_eq!(
        late.expect_err("receipt expired").code(),
        ErrorCode::Conflict
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_claim_with_an_active_operation_cannot_be_replaced() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    world.executor.push(Script::Break);
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("fenced");
    // The fence cleared by hand (as if recovered wrongly) must not let a takeover through.
    let api = world.environments();
    let mut o = api.get(&c.env.id).await.expect("get");
    o.status.as_mut().expect("status").fence_state = Some(FenceState::Healthy);
    api.replace_status(&c.env.id, &PostParams::default(), &o)
        .await
        .expect("edit");
    tokio::time::advance(Duration::from_secs(31)).await;
    let err = store
        .acquire_run(&AcquireRequest {
            env: c.env.clone(),
            caller: c.caller.clone(),
            binding_id: "b1".into(),
            run_id: "run-2".into(),
            operation_id: "op-2".into(),
            ttl: MINUTE,
        })
        .await
        .expect_err("no takeover");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    let release = store
        .release_run(&c.caller, &c.rc)
        .await
        .expect_err("op in flight");
    assert_eq!(release.code(), ErrorCode::FenceUnknown);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_caller_neither_abandons_the_helper_call_nor_its_completion_write() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Sleep(Duration::from_secs(25)));
    let task = {
        let (store, caller, rc) = (store.clone(), c.caller.clone(), c.rc.clone());
        tokio::spawn(async move { store.execute(&caller, &rc, stat("a")).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while world.executor.call_count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never dispatched");
        tokio::task::yield_now().await;
    }
    task.abort();
    let _ = task.await;
    let o = world.get(&c.env.id).await.status.expect("status");
    assert!(
        o.active_operation.is_some(),
        "the operation stays on record while it runs"
    );
    let again = world
        .store()
        .execute(&c.caller, &c.rc, stat("b"))
        .await
        .expect_err("busy");
    assert_eq!(again.code(), ErrorCode::Conflict);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = world.get(&c.env.id).await.status.expect("status");
        if status.active_operation.is_none() {
            assert_eq!(status.fence_state, Some(FenceState::Healthy));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "completion never written"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(world.executor.call_count(), 1, "executed exactly once");
}

#[tokio::test(start_paused = true)]
async fn replaying_an_expired_acquisition_is_refused_not_handed_back() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    tokio::time::advance(Duration::from_secs(31)).await;
    let err = store
        .acquire_run(&AcquireRequest {
            env: c.env.clone(),
            caller: c.caller.clone(),
            binding_id: "b1".into(),
            run_id: "run-1".into(),
            operation_id: "op-acquire".into(),
            ttl: Duration::from_secs(30),
        })
        .await
        .expect_err("DECISIONS 9");
    assert_eq!(err.code(), ErrorCode::ClaimExpired);
}

/// Rewrites the stored status by hand (a corrupting or concurrent writer).
async fn edit_status(
    world: &World,
    name: &str,
    f: impl FnOnce(&mut execution_provider::kube::crd::ExecutionEnvironmentStatus),
) {
    let api = world.environments();
    let mut o = api.get(name).await.expect("get");
    f(o.status.as_mut().expect("status"));
    api.replace_status(name, &PostParams::default(), &o)
        .await
        .expect("edit");
}

#[tokio::test(start_paused = true)]
async fn renewal_refuses_a_claim_whose_owner_or_client_hash_drifted() {
    let drifts: [fn(&mut execution_provider::kube::crd::ActiveRun); 4] = [
        |run| run.owner_hash = "0".repeat(64),
        |run| run.owner_hash.clear(),
        |run| run.client_hash = "0".repeat(64),
        |run| run.client_hash.clear(),
    ];
    for drift in drifts {
        let world = World::new().await;
        let store = world.store();
        let c = claimed_for(&world, &store, "alice", "b1", MINUTE).await;
        edit_status(&world, &c.env.id, |s| {
            drift(s.active_run.as_mut().expect("run"))
        })
        .await;
        let before = world.get(&c.env.id).await.status;
        let err = store
            .renew_run(&c.caller, &c.rc, "renew-1", MINUTE)
            .await
            .expect_err("drifted claim");
        assert_eq!(err.code(), ErrorCode::Conflict);
        assert_eq!(world.get(&c.env.id).await.status, before, "nothing written");
        let validate = store.validate_run_claim(&c.caller, &c.rc).await;
        assert_eq!(
            validate.err().expect("not current").code(),
            ErrorCode::Conflict
        );
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_and_revoke_each_retry_a_lost_compare_and_swap_and_both_land() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", MINUTE).await;
    store.release_run(&c.caller, &c.rc).await.expect("release");
    // Another writer wins the first write of each operation (409): each re-reads and lands.
    world.fail_write(1, Fault::Status(409), "executionenvironments");
    let claim = store
        .acquire_run(&AcquireRequest {
            env: c.env.clone(),
            caller: c.caller.clone(),
            binding_id: "b1".to_owned(),
            run_id: "run-2".to_owned(),
            operation_id: "op-acquire-2".to_owned(),
            ttl: MINUTE,
        })
        .await
        .expect("acquire after a lost race");
    assert_eq!(claim.epoch, c.rc.epoch + 1);
    world.fail_write(1, Fault::Status(409), "executionenvironments");
    let q = execution_provider::store::admin::AdminRequest {
        env: c.env.clone(),
        owner_hash: c.caller.owner_hash.clone(),
        actor: CLIENT.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: 0,
        expected_pod_uid: String::new(),
        expected_pvc_uid: String::new(),
        operation_id: "revoke-1".to_owned(),
    };
    let generation = store
        .revoke_environment(&q, claim.grant_generation)
        .await
        .expect("revoke after a lost race");
    assert_eq!(generation, claim.grant_generation + 1);
    world.clear_faults();
    let status = world.get(&c.env.id).await.status.expect("status");
    assert_eq!(
        status.epoch,
        Some(claim.epoch),
        "revocation keeps the epoch"
    );
    assert_eq!(status.grant_generation, Some(generation));
    let rc = execution_provider::store::ClaimContext {
        claim_id: claim.claim_id,
        run_id: claim.run_id,
        epoch: claim.epoch,
        grant_generation: claim.grant_generation,
        ..c.rc
    };
    let stale = store.validate_run_claim(&c.caller, &rc).await;
    assert_eq!(stale.err().expect("revoked").code(), ErrorCode::Conflict);
}
