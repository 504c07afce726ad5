//! The claimed, fenced dispatch and its operation lease (store §5, §8; DECISIONS 11-12)
//! against the in-process API server with a scripted executor and paused time.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::executor::protocol::{ExecutorRequest, Operation};
use execution_provider::kube::crd::FenceState;
use kube::api::PostParams;
use store_support::*;

fn fence_state(o: &execution_provider::kube::crd::ExecutionEnvironment) -> Option<FenceState> {
    o.status.as_ref().and_then(|s| s.fence_state)
}

fn active_op(o: &execution_provider::kube::crd::ExecutionEnvironment) -> Option<String> {
    o.status
        .as_ref()
        .and_then(|s| s.active_operation.as_ref())
        .map(|op| op.id.clone())
}

#[tokio::test(start_paused = true)]
async fn clean_completion_clears_the_lease_without_fencing() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect("stat");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::Healthy));
    assert_eq!(active_op(&o), None);
    assert_eq!(world.executor.call_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_controlled_executor_error_clears_the_operation_without_fencing() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Refuse(
        execution_provider::executor::ErrorCode::NotFound,
    ));
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), ErrorCode::NotFound);
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::Healthy));
    assert_eq!(active_op(&o), None);
    assert_eq!(world.executor.call_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_outcome_fences_and_keeps_the_operation_on_record() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Break);
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert!(err.to_string().contains("termination unconfirmed"), "{err}");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert!(active_op(&o).is_some());
    let again = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("fenced");
    assert_eq!(again.code(), ErrorCode::NotReady);
    assert_eq!(
        world.executor.call_count(),
        1,
        "nothing dispatched while fenced"
    );
    let attach = store
        .attach(&c.env, &c.caller, "b1")
        .await
        .expect_err("attach");
    assert_eq!(attach.code(), ErrorCode::NotReady);
}

#[tokio::test(start_paused = true)]
async fn a_command_without_a_terminal_receipt_fences() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Command {
        receipt: "",
        output: 0,
    });
    let mut request = ExecutorRequest::new(Operation::CommandStart);
    request.command = "true".to_owned();
    let err = store
        .execute(&c.caller, &c.rc, request)
        .await
        .expect_err("no receipt");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert_eq!(
        fence_state(&world.get(&c.env.id).await),
        Some(FenceState::FenceUnknown)
    );
}

#[tokio::test(start_paused = true)]
async fn command_output_beyond_the_template_bound_is_truncated_not_refused() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Command {
        receipt: "r",
        output: 4096,
    });
    let mut request = ExecutorRequest::new(Operation::CommandStart);
    request.command = "yes".to_owned();
    let response = store.execute(&c.caller, &c.rc, request).await.expect("ran");
    let command = response.command.expect("command");
    assert!(command.truncated);
    assert_eq!(command.stdout.len(), 1024, "cut at maxCommandBytes");
    assert_eq!(
        fence_state(&world.get(&c.env.id).await),
        Some(FenceState::Healthy)
    );
}

/// A renewal whose write is lost cancels the call; the completion then fences, and the
/// caller is told the lease was lost (not that the executor's end went unconfirmed).
#[tokio::test(start_paused = true)]
async fn a_lost_renewal_cancels_the_call_fences_and_says_the_lease_was_lost() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::WaitForCancel);
    // Admission is environment write 1; the first renewal (after 10 s) is write 2.
    world.fail_write(2, Fault::Transport, "executionenvironments");
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("lost");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert!(err.to_string().contains("lease renewal failed"), "{err}");
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 1);
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert!(active_op(&o).is_some(), "identity kept for recovery");
}

#[tokio::test(start_paused = true)]
async fn ordinary_renewal_keeps_a_long_operation_alive_and_never_cancels_it() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Sleep(Duration::from_secs(95)));
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect("long stat");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::Healthy));
    assert_eq!(active_op(&o), None);
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 0);
    assert!(
        world
            .faults
            .lock()
            .expect("faults")
            .count("PUT", "executionenvironments")
            >= 9,
        "admission, renewals every 10 s and completion were written"
    );
}

async fn wait_for_dispatch(world: &World) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while world.executor.call_count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "executor never called"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn revocation_mid_dispatch_cancels_the_executor_and_fences() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::WaitForCancel);
    let task = {
        let (store, caller, rc) = (store.clone(), c.caller.clone(), c.rc.clone());
        tokio::spawn(async move { store.execute(&caller, &rc, stat("a")).await })
    };
    wait_for_dispatch(&world).await;
    let api = world.environments();
    let mut o = api.get(&c.env.id).await.expect("get");
    let status = o.status.as_mut().expect("status");
    status.grant_generation = Some(status.grant_generation.unwrap_or(1) + 1);
    api.replace_status(&c.env.id, &PostParams::default(), &o)
        .await
        .expect("revoke by hand");
    let err = task.await.expect("join").expect_err("authority lost");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 1);
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert!(active_op(&o).is_some(), "identity kept for recovery");
}

#[tokio::test(start_paused = true)]
async fn run_expiry_mid_dispatch_cancels_the_executor_and_fences() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    world.executor.push(Script::WaitForCancel);
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("lost");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 1);
    assert_eq!(
        fence_state(&world.get(&c.env.id).await),
        Some(FenceState::FenceUnknown)
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_completion_write_fences_and_no_replica_can_dispatch_again() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    // Admission is environment write 1; the completion write 2 is lost in transport.
    world.fail_write(2, Fault::Transport, "executionenvironments");
    let err = store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect_err("lost");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    world.clear_faults();
    let fresh = world.store();
    let again = fresh
        .execute(&c.caller, &c.rc, stat("b"))
        .await
        .expect_err("busy");
    assert_eq!(
        again.code(),
        ErrorCode::Conflict,
        "the operation is still on record"
    );
    assert_eq!(world.executor.call_count(), 1, "never executed twice");
    // Only lease expiry fences it: the reconcile after the deadline, under compare-and-swap,
    // keeping the identity.
    let op = active_op(&world.get(&c.env.id).await).expect("op");
    tokio::time::advance(Duration::from_secs(31)).await;
    world
        .reconciler()
        .reconcile(&c.env.id)
        .await
        .expect("fence");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert_eq!(active_op(&o), Some(op));
}

#[tokio::test(start_paused = true)]
async fn a_new_store_instance_never_touches_an_operation_it_did_not_start() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.executor.push(Script::Sleep(Duration::from_secs(5)));
    let task = {
        let (store, caller, rc) = (store.clone(), c.caller.clone(), c.rc.clone());
        tokio::spawn(async move { store.execute(&caller, &rc, stat("a")).await })
    };
    wait_for_dispatch(&world).await;
    let before = world.get(&c.env.id).await;
    let _restarted = world.store();
    assert_eq!(
        world.get(&c.env.id).await.status,
        before.status,
        "start-up wrote nothing"
    );
    let op = active_op(&before).expect("op");
    let renew = world.store().renew_operation_lease(&c.rc, &op).await;
    assert_eq!(
        renew.expect_err("other holder").code(),
        ErrorCode::FenceUnknown
    );
    task.await.expect("join").expect("the holder completes");
    assert_eq!(
        fence_state(&world.get(&c.env.id).await),
        Some(FenceState::Healthy)
    );
}

#[tokio::test(start_paused = true)]
async fn a_data_plane_call_reads_once_and_confirms_on_the_admission_response() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    world.faults.lock().expect("faults").reset_counts();
    store
        .execute(&c.caller, &c.rc, stat("a"))
        .await
        .expect("stat");
    let f = world.faults.lock().expect("faults");
    assert_eq!(f.count("PUT", "executionenvironments"), 2, "{:?}", f.counts);
    // The admission reads; the confirmation before dispatch uses the admission write's
    // response, and the completion starts from it.
    assert_eq!(f.count("GET", "executionenvironments"), 1, "{:?}", f.counts);
}

#[tokio::test(start_paused = true)]
async fn a_claim_renewed_by_its_client_during_a_long_call_keeps_the_lease() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed_for(&world, &store, "alice", "b1", Duration::from_secs(30)).await;
    world.executor.push(Script::Sleep(Duration::from_secs(45)));
    let task = {
        let (store, caller, rc) = (store.clone(), c.caller.clone(), c.rc.clone());
        tokio::spawn(async move { store.execute(&caller, &rc, stat("a")).await })
    };
    wait_for_dispatch(&world).await;
    tokio::time::advance(Duration::from_secs(25)).await;
    // The renewal at 30 s starts from the object it wrote at 20 s, where the claim ends at
    // 30 s: that refusal must be re-decided on the fresh state, which holds the renewal.
    store
        .renew_run(&c.caller, &c.rc, "op-renew", Duration::from_secs(60))
        .await
        .expect("renew run");
    task.await.expect("join").expect("the call completes");
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::Healthy));
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 0);
}

/// A client policy the test withdraws at will.
#[derive(Default)]
struct Switch(std::sync::atomic::AtomicBool);

impl execution_provider::store::policy::PolicyCheck for Switch {
    fn current(&self, _template_id: &str) -> bool {
        !self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Switch {
    fn withdraw(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_policy_withdrawn_during_a_command_cancels_it_and_fences_keeping_the_operation() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let policy = std::sync::Arc::new(Switch::default());
    let validated = store
        .validate_run_claim_under(&c.caller, &c.rc, policy.clone())
        .await
        .expect("validate");
    world.executor.push(Script::WaitForCancel);
    let task = {
        let store = store.clone();
        let command = ExecutorRequest::command("cmd".to_owned(), "sleep 600".to_owned());
        tokio::spawn(async move { store.execute_validated(validated, command).await })
    };
    wait_for_dispatch(&world).await;
    policy.withdraw();
    let err = task.await.expect("join").expect_err("policy withdrawn");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert_eq!(*world.executor.cancelled.lock().expect("cancelled"), 1);
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    let op = active_op(&o).expect("identity kept for recovery");
    // No takeover: another replica cannot dispatch, nor can this one.
    let again = world.store().execute(&c.caller, &c.rc, stat("b")).await;
    assert_eq!(again.expect_err("fenced").code(), ErrorCode::NotReady);
    assert_eq!(world.executor.call_count(), 1);
    assert_eq!(active_op(&world.get(&c.env.id).await), Some(op));
}

#[tokio::test(start_paused = true)]
async fn a_policy_withdrawn_before_completion_fences_with_authority_changed() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let policy = std::sync::Arc::new(Switch::default());
    let validated = store
        .validate_run_claim_under(&c.caller, &c.rc, policy.clone())
        .await
        .expect("validate");
    // Shorter than a renewal period: only the completion write sees the withdrawal.
    world.executor.push(Script::Sleep(Duration::from_secs(5)));
    let task = {
        let store = store.clone();
        tokio::spawn(async move { store.execute_validated(validated, stat("a")).await })
    };
    wait_for_dispatch(&world).await;
    policy.withdraw();
    let err = task.await.expect("join").expect_err("authority changed");
    assert_eq!(err.code(), ErrorCode::FenceUnknown);
    assert!(
        err.to_string()
            .contains("authority changed before completion"),
        "{err}"
    );
    let o = world.get(&c.env.id).await;
    assert_eq!(fence_state(&o), Some(FenceState::FenceUnknown));
    assert!(active_op(&o).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_policy_is_refused_at_validation_without_any_write() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let policy = std::sync::Arc::new(Switch::default());
    policy.withdraw();
    world.faults.lock().expect("faults").reset_counts();
    let err = store
        .validate_run_claim_under(&c.caller, &c.rc, policy)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), ErrorCode::NotReady);
    assert_eq!(world.faults.lock().expect("faults").writes, 0);
    assert_eq!(world.executor.call_count(), 0);
}
