//! Reclaiming a capacity slot kept after an ambiguous create (docs/store.md, "The capacity
//! ledger"): only once it is proven that no create of it can still land (its deadline, the
//! clock-skew bound and a second have passed, and a read made after that finds no object or a
//! void one), never while the create may still land, and a create that lands late is still
//! accounted for: before its deadline it holds its slot, after it it is void. Also the sharded
//! ledger of a large template: one shard per write, overflow into other shards, exhaustion.

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::store::ledger::{Reservation, landed_late};
use store_support::*;

/// Longer than the create window (30 s), the clock-skew bound (30 s) and the rounding.
const PAST_PROOF: Duration = Duration::from_secs(63);

async fn advance(by: Duration) {
    tokio::time::advance(by).await;
}

/// Alice's ensure of `small` (limit 1) whose create meets `fault`; the error code.
async fn ambiguous_ensure(world: &World, fault: Fault) -> ErrorCode {
    world.fail_write(1, fault, "executionenvironments");
    let req = ensure_request(world, CLIENT, "alice", "b1", "small", "op-1");
    let err = world
        .store()
        .ensure_template(&req)
        .await
        .expect_err("ambiguous");
    world.clear_faults();
    err.code()
}

async fn bob(world: &World) -> Result<String, ErrorCode> {
    let req = ensure_request(world, CLIENT, "bob", "b2", "small", "op-2");
    world
        .store()
        .ensure_template(&req)
        .await
        .map(|a| a.env.id)
        .map_err(|e| e.code())
}

fn alice_name(world: &World) -> String {
    let req = ensure_request(world, CLIENT, "alice", "b1", "small", "op-1");
    execution_provider::store::naming::allocation_name(CLIENT, &req.caller.owner_hash, "b1")
}

#[tokio::test(start_paused = true)]
async fn a_slot_kept_after_an_unanswered_create_is_reclaimed_only_once_no_create_can_land() {
    let world = World::new().await;
    assert_eq!(
        ambiguous_ensure(&world, Fault::Transport).await,
        ErrorCode::Internal
    );
    let alice = alice_name(&world);
    assert_eq!(world.ledger("small").await, vec![alice.clone()], "kept");
    assert_eq!(bob(&world).await, Err(ErrorCode::ResourceExhausted));
    // The deadline has passed, but not the clock-skew bound: a delayed create could still
    // land before the API server's clock reaches the deadline.
    advance(Duration::from_secs(45)).await;
    assert_eq!(bob(&world).await, Err(ErrorCode::ResourceExhausted));
    assert_eq!(world.ledger("small").await, vec![alice]);
    advance(PAST_PROOF - Duration::from_secs(45)).await;
    let b = bob(&world).await.expect("the slot was reclaimed");
    assert_eq!(world.ledger("small").await, vec![b]);
    assert_eq!(world.names().await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_create_that_landed_keeps_its_slot_after_its_deadline() {
    let world = World::new().await;
    assert_eq!(
        ambiguous_ensure(&world, Fault::LostAnswer).await,
        ErrorCode::Internal
    );
    let alice = alice_name(&world);
    advance(PAST_PROOF).await;
    assert_eq!(bob(&world).await, Err(ErrorCode::ResourceExhausted));
    assert_eq!(
        world.ledger_slots("small").await.get(&alice),
        Some(&0),
        "confirmed as held by the environment"
    );
    let req = ensure_request(&world, CLIENT, "alice", "b1", "small", "op-1");
    let a = world.store().ensure_template(&req).await.expect("retry");
    assert_eq!(a.env.id, alice);
}

#[tokio::test(start_paused = true)]
async fn a_create_delivered_late_but_before_its_deadline_holds_its_slot() {
    let world = World::new().await;
    assert_eq!(
        ambiguous_ensure(&world, Fault::Delayed).await,
        ErrorCode::Internal
    );
    advance(Duration::from_secs(20)).await;
    assert_eq!(world.deliver_delayed().await, vec![201]);
    let alice = alice_name(&world);
    assert!(!landed_late(&world.get(&alice).await));
    advance(PAST_PROOF).await;
    assert_eq!(bob(&world).await, Err(ErrorCode::ResourceExhausted));
    assert_eq!(world.ledger("small").await, vec![alice.clone()]);
    let req = ensure_request(&world, CLIENT, "alice", "b1", "small", "op-1");
    let a = world.store().ensure_template(&req).await.expect("served");
    assert_eq!(a.env.id, alice);
}

#[tokio::test(start_paused = true)]
async fn a_create_delivered_after_its_slot_was_reclaimed_is_void_and_never_served() {
    let world = World::new().await;
    assert_eq!(
        ambiguous_ensure(&world, Fault::Delayed).await,
        ErrorCode::Internal
    );
    advance(PAST_PROOF).await;
    let b = bob(&world).await.expect("reclaimed");
    // The API server applies the held-back create now, long after its deadline.
    assert_eq!(world.deliver_delayed().await, vec![201]);
    let alice = alice_name(&world);
    assert!(landed_late(&world.get(&alice).await), "void");
    assert_eq!(world.ledger("small").await, vec![b], "not counted");
    let req = ensure_request(&world, CLIENT, "alice", "b1", "small", "op-1");
    let err = world.store().ensure_template(&req).await.expect_err("void");
    assert_eq!(err.code(), ErrorCode::NotReady);
    assert!(
        world.get(&alice).await.status.is_none(),
        "never initialized"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_refreshes_the_deadline_so_its_own_create_is_never_reclaimed_under_it() {
    let world = World::new().await;
    ambiguous_ensure(&world, Fault::Transport).await;
    let alice = alice_name(&world);
    let first = world.ledger_slots("small").await[&alice];
    advance(PAST_PROOF).await;
    // The retry's create is held back: the slot now carries the retry's deadline.
    ambiguous_ensure(&world, Fault::Delayed).await;
    let second = world.ledger_slots("small").await[&alice];
    assert!(second > first, "{second} > {first}");
    assert_eq!(bob(&world).await, Err(ErrorCode::ResourceExhausted));
    assert_eq!(world.deliver_delayed().await, vec![201]);
    let req = ensure_request(&world, CLIENT, "alice", "b1", "small", "op-1");
    world.store().ensure_template(&req).await.expect("served");
}

#[tokio::test(start_paused = true)]
async fn a_large_template_writes_one_shard_per_reservation_and_fills_every_shard() {
    let world = World::new().await;
    let ledger = world.ledger_view();
    let now = world.clock_now();
    let reserve = |name: String| {
        let ledger = ledger.clone();
        async move {
            ledger
                .reserve(&Reservation {
                    template_id: "vast",
                    name: &name,
                    limit: 1_040,
                    deadline: 4_000_000_000,
                    now,
                })
                .await
        }
    };
    let api = world.ledger_through_faults();
    for i in 0..50 {
        world.faults.lock().unwrap().reset_counts();
        api.reserve(&Reservation {
            template_id: "vast",
            name: &format!("exec-probe-{i:04}"),
            limit: 1_040,
            deadline: 4_000_000_000,
            now,
        })
        .await
        .expect("reserve");
        let faults = world.faults.lock().unwrap();
        assert_eq!(faults.count("PUT", "configmaps"), 1, "one shard written");
        assert!(
            faults.count("GET", "configmaps") <= 2,
            "root check and home"
        );
    }
    for i in 50..1_040 {
        reserve(format!("exec-probe-{i:04}")).await.expect("room");
    }
    let err = reserve("exec-one-too-many".to_owned())
        .await
        .expect_err("full");
    assert_eq!(err.code(), ErrorCode::ResourceExhausted);
    assert_eq!(world.ledger("vast").await.len(), 1_040);
    // A name placed away from its full home shard is found again, not counted twice.
    let slots = world.ledger_slots("vast").await;
    assert_eq!(slots.len(), 1_040);
    reserve("exec-probe-1039".to_owned())
        .await
        .expect("idempotent");
    ledger
        .release("vast", "exec-probe-1039")
        .await
        .expect("release");
    reserve("exec-one-too-many".to_owned())
        .await
        .expect("the released slot");
    assert_eq!(world.ledger("vast").await.len(), 1_040);
}
