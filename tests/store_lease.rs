//! The operation lease at its edges (store §8; catalogue [lease] and [prov]): the expiry
//! fence re-validates under compare-and-swap what it observed, and the completion write
//! re-checks the run's authority even when no renewal ran, and the lease holds strictly
//! before its expiry.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{ExecutionEnvironment, FenceState, RfcTime};
use execution_provider::store::claims::AcquireRequest;
use kube::api::PostParams;
use store_support::*;

fn fence_state(o: &ExecutionEnvironment) -> Option<FenceState> {
    o.status.as_ref().and_then(|s| s.fence_state)
}

fn active_op(o: &ExecutionEnvironment) -> Option<String> {
    o.status
        .as_ref()
        .and_then(|s| s.active_operation.as_ref())
        .map(|op| op.id.clone())
}

/// Waits (virtual time) until the executor has been called `n` times.
async fn wait_for_calls(world: &World, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while world.executor.call_count() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "executor not called"
        );
        tokio::task::yield_now().await;
    }
}

/// The production expiry fence (the reconciler's `fence_expired`) decided on an observation
/// that has since gone stale never writes: not after the holder renewed the lease, not after
/// it completed, not after another operation replaced it; decided on a current observation
/// of an operation whose holder is gone, it fences and keeps the operation's identity.
#[tokio::test(start_paused = true)]
async fn the_expiry_fence_revalidates_the_lease_under_compare_and_swap() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Sleep(Duration::from_secs(45)));
    let call = |store: execution_provider::store::Store| {
        let (caller, rc) = (c.caller.clone(), c.rc.clone());
        tokio::spawn(async move { store.execute(&caller, &rc, stat("a")).await })
    };
    let first = call(store.clone());
    wait_for_calls(&world, 1).await;
    let observed = world.get(&c.env.id).await;
    assert!(active_op(&observed).is_some(), "the operation is on record");
    // Observed at admission; 35 s later the holder has renewed it (same id, later expiry).
    // Sleeping (not jumping the clock) lets the holder's renewals run at their times.
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(active_op(&world.get(&c.env.id).await), active_op(&observed));
    let renewed = world.fence_expired_as_observed(&observed).await;
    assert_eq!(renewed.expect_err("renewed").code(), ErrorCode::Conflict);
    first.await.expect("join").expect("completes");
    // Completed: the observation is stale, nothing is written.
    let completed = world.fence_expired_as_observed(&observed).await;
    assert_eq!(
        completed.expect_err("completed").code(),
        ErrorCode::Conflict
    );
    // Replaced by another operation: the old observation fences nothing either.
    world.executor.push(Script::Sleep(Duration::from_secs(5)));
    let second = call(store.clone());
    wait_for_calls(&world, 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let replaced = world.fence_expired_as_observed(&observed).await;
    assert_eq!(replaced.expect_err("replaced").code(), ErrorCode::Conflict);
    second.await.expect("join").expect("completes");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::Healthy));
    assert_eq!(active_op(&o), None);
    // A holder that is gone (its store dropped mid-call) leaves its operation to expire: the
    // reconcile that finds it past its deadline fences it, keeping its identity.
    world.executor.push(Script::Sleep(Duration::from_secs(600)));
    let orphan = call(world.store());
    wait_for_calls(&world, 3).await;
    orphan.abort();
    let held = active_op(&world.get(&c.env.id).await).expect("the orphaned operation");
    tokio::time::advance(Duration::from_secs(31)).await;
    world
        .reconciler()
        .reconcile(&c.env.id)
        .await
        .expect("fenced");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert_eq!(active_op(&o), Some(held));
}

#[tokio::test(start_paused = true)]
async fn completion_rechecks_the_claim_even_when_no_renewal_ran() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    tokio::time::advance(Duration::from_secs(25)).await;
    // Admitted at 25 s with the claim live; the claim ends at 30 s, the call at 33 s, and
    // the first renewal would only run at 35 s.
    world.executor.push(Script::Sleep(Duration::from_secs(8)));
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("authority lost before completion");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert!(
        err.to_string()
            .contains("authority changed before completion"),
        "{err}"
    );
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert!(active_op(&o).is_some(), "identity kept for recovery");
    // No takeover of the expired run while its operation is on record.
    let takeover = store
        .acquire_run(&AcquireRequest {
            env: c.env.clone(),
            caller: c.caller.clone(),
            binding_id: "b1".to_owned(),
            run_id: "run-2".to_owned(),
            operation_id: "op-takeover".to_owned(),
            ttl: Duration::from_secs(60),
        })
        .await;
    // Fenced, so not ready; the operation stays for recovery.
    assert_eq!(takeover.expect_err("refused").code(), ErrorCode::NotReady);
    assert_eq!(world.executor.call_count(), 1);
}

/// The operation lease is current strictly before its expiry (store §8): a completion at the
/// very instant the lease expires is outside it and fences, keeping the operation on record;
/// the same completion one nanosecond earlier clears the operation.
#[tokio::test(start_paused = true)]
async fn a_completion_at_the_exact_lease_expiry_fences() {
    for (margin, fences) in [(Duration::ZERO, true), (Duration::from_nanos(1), false)] {
        let world = World::new().await;
        let store = world.store();
        let c = claimed(&world, &store, "alice", "b1").await;
        // The call takes 5 s, less than the first renewal's wait, so nothing renews the lease.
        let call = Duration::from_secs(5);
        world.executor.push(Script::Sleep(call));
        let arm_peer = async {
            wait_for_calls(&world, 1).await;
            let completion_at = world.clock_now() + call;
            // Just before the completion write, a peer moves the lease's expiry to the
            // completion instant plus `margin`.
            let (api, name) = (world.environments(), c.env.id.clone());
            let clock = world.clock.clone();
            world.before_write("/status", move || async move {
                use execution_provider::runtime::Clock;
                assert_eq!(clock.wall(), completion_at, "no time passed since the call");
                let mut o = api.get(&name).await.expect("the peer reads");
                let op = o
                    .status
                    .as_mut()
                    .and_then(|s| s.active_operation.as_mut())
                    .expect("the operation is on record");
                op.expires_at = RfcTime::from_system_time(completion_at + margin);
                api.replace_status(&name, &PostParams::default(), &o)
                    .await
                    .expect("the peer writes");
            });
        };
        let (result, ()) = tokio::join!(store.execute(&c.caller, &c.rc, stat("a")), arm_peer);
        let o = world.get(&c.env.id).await;
        if fences {
            let err = result.expect_err("the lease ended at the completion instant");
            assert_eq!(err.code(), ErrorCode::FenceUnknown);
            assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
            assert!(active_op(&o).is_some(), "identity kept for recovery");
        } else {
            result.expect("the lease was still current");
            assert_eq!(fence_state(&o), Some(FenceState::Healthy));
            assert_eq!(active_op(&o), None);
        }
    }
}
