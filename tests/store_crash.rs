//! Crash tests: a fault is injected at every API write of a multi-step operation (the write
//! fails, ambiguously or definitively), then a fresh store instance retries. Nothing
//! acknowledged is lost, nothing runs twice, capacity stays exact, no stale holder is accepted.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::FenceState;
use store_support::*;

/// The writes an uncontended allocation makes: ledger reservation, create, status init.
const ENSURE_WRITES: usize = 3;

#[tokio::test]
async fn an_allocation_interrupted_at_any_write_converges_on_retry_with_exact_capacity() {
    for fault in [
        Fault::Transport,
        Fault::LostAnswer,
        Fault::Status(500),
        Fault::Status(403),
    ] {
        for n in 1..=ENSURE_WRITES {
            let world = World::new().await;
            let req = ensure_request(&world, CLIENT, "alice", "b1", "pair", "op-1");
            world.fail_write(n, fault, "");
            let first = world.store().ensure_template(&req).await;
            world.clear_faults();
            let a = world
                .store()
                .ensure_template(&req)
                .await
                .unwrap_or_else(|e| panic!("{fault:?} at write {n}: retry failed: {e}"));
            if let Ok(before) = first {
                assert_eq!(before, a, "an acknowledged allocation is unchanged");
            }
            assert_eq!(
                world.names().await,
                vec![a.env.id.clone()],
                "{fault:?} at {n}"
            );
            assert_eq!(
                world.ledger("pair").await,
                vec![a.env.id.clone()],
                "{fault:?} at {n}"
            );
            let second = ensure_request(&world, CLIENT, "bob", "b2", "pair", "op-2");
            world
                .store()
                .ensure_template(&second)
                .await
                .expect("the second slot is free");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_dispatch_interrupted_at_any_write_never_runs_twice_and_never_clears_unknowns() {
    // Environment writes of one dispatch: admission, completion.
    for n in 1..=2 {
        let world = World::new().await;
        let store = world.store();
        let c = claimed(&world, &store, "alice", "b1").await;
        world.fail_write(n, Fault::Transport, "executionenvironments");
        let result = store.execute(&c.caller, &c.rc, stat("a")).await;
        world.clear_faults();
        let calls = world.executor.call_count();
        let o = world.get(&c.env.id).await;
        let status = o.status.clone().expect("status");
        match n {
            1 => {
                assert_eq!(
                    result.expect_err("admission lost").code(),
                    ErrorCode::Internal
                );
                assert_eq!(calls, 0, "nothing dispatched without a durable admission");
                assert!(status.active_operation.is_none());
            }
            _ => {
                assert_eq!(
                    result.expect_err("completion lost").code(),
                    ErrorCode::FenceUnknown
                );
                assert_eq!(calls, 1);
                assert!(
                    status.active_operation.is_some(),
                    "the unknown stays on record"
                );
            }
        }
        let fresh = world.store();
        let retry = fresh.execute(&c.caller, &c.rc, stat("a")).await;
        if n == 1 {
            retry.expect("a retry after a lost admission runs once");
            assert_eq!(world.executor.call_count(), 1);
        } else {
            assert_eq!(
                retry.expect_err("still in flight").code(),
                ErrorCode::Conflict
            );
            assert_eq!(world.executor.call_count(), 1, "never executed twice");
            tokio::time::advance(Duration::from_secs(31)).await;
            let op = status.active_operation.expect("op").id;
            world
                .reconciler()
                .reconcile(&c.env.id)
                .await
                .expect("fenced at expiry");
            let fenced = world.get(&c.env.id).await.status.expect("status");
            assert_eq!(fenced.fence_state, Some(FenceState::FenceUnknown));
            assert_eq!(fenced.active_operation.map(|o| o.id), Some(op));
        }
    }
}

#[tokio::test]
async fn a_reservation_interrupted_at_its_write_replays_exactly_once() {
    for fault in [Fault::Transport, Fault::LostAnswer] {
        let world = World::new().await;
        let store = world.store();
        let req = ensure_request(&world, CLIENT, "alice", "src", "roomy", "op-e");
        let a = store.ensure_template(&req).await.expect("ensure");
        store
            .commit_reference(&a.env, &req.caller, "src", "op-e")
            .await
            .expect("commit");
        world.fail_write(1, fault, "executionenvironments");
        let lost = store
            .reserve_successor(&a.env, &req.caller, "src", "dst", "op-r")
            .await;
        assert!(lost.is_err(), "{fault:?}");
        world.clear_faults();
        let fresh = world.store();
        fresh
            .reserve_successor(&a.env, &req.caller, "src", "dst", "op-r")
            .await
            .expect("retry");
        fresh
            .reserve_successor(&a.env, &req.caller, "src", "dst", "op-r")
            .await
            .expect("replay");
        let refs = world
            .get(&a.env.id)
            .await
            .status
            .expect("status")
            .references;
        assert_eq!(refs.len(), 2, "{fault:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_applied_dispatch_write_whose_answer_is_lost_never_runs_twice_and_hides_no_unknown() {
    // Environment writes of one dispatch: admission, completion; each lands, its answer is lost.
    for n in 1..=2 {
        let world = World::new().await;
        let store = world.store();
        let c = claimed(&world, &store, "alice", "b1").await;
        world.fail_write(n, Fault::LostAnswer, "executionenvironments");
        let result = store.execute(&c.caller, &c.rc, stat("a")).await;
        world.clear_faults();
        let status = world.get(&c.env.id).await.status.expect("status");
        if n == 1 {
            // The operation landed but was never confirmed: fenced at once (DECISIONS 11),
            // kept on record, and nothing was dispatched.
            assert_eq!(
                result.expect_err("admission unanswered").code(),
                ErrorCode::Internal
            );
            assert_eq!(world.executor.call_count(), 0);
            assert!(status.active_operation.is_some());
            assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
            let retry = world.store().execute(&c.caller, &c.rc, stat("a")).await;
            assert_eq!(retry.expect_err("fenced").code(), ErrorCode::NotReady);
            assert_eq!(world.executor.call_count(), 0, "never dispatched");
        } else {
            // The completion landed (the operation is cleared, Healthy) but the caller cannot
            // know it: it is told fence_unknown, never a success it cannot prove.
            assert_eq!(
                result.expect_err("completion unanswered").code(),
                ErrorCode::FenceUnknown
            );
            assert_eq!(world.executor.call_count(), 1);
            assert!(status.active_operation.is_none());
            assert_eq!(status.fence_state, Some(FenceState::Healthy));
        }
    }
}
