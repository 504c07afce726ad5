//! The RPC limiter over real mTLS on loopback (api-security §7, §9.27): a bounded load test
//! driving ten times the limiter's capacity. Calls admitted while slots are free succeed,
//! the rest are refused at once with RESOURCE_EXHAUSTED (nothing queues), bounds are never
//! exceeded, and the limiter's state returns to empty.

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::server::limiter::RpcLimiter;
use security::*;

const DEV_URI: &str = "spiffe://dev.local/ns/default/client";
const CAPACITY: usize = 4;
const CALLS: usize = 10 * CAPACITY;

async fn burst(client: &Client, calls: usize) -> (usize, usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..calls {
        let mut client = client.clone();
        tasks.spawn(async move {
            client
                .list_execution_templates(pb::ListExecutionTemplatesRequest {})
                .await
        });
    }
    let (mut admitted, mut refused) = (0, 0);
    while let Some(result) = tasks.join_next().await {
        match result.unwrap() {
            Ok(_) => admitted += 1,
            Err(status) => {
                assert_refused(
                    &status,
                    tonic::Code::ResourceExhausted,
                    "resource_exhausted",
                    false,
                );
                refused += 1;
            }
        }
    }
    (admitted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_capacity_is_admitted_up_to_the_bounds_and_the_rest_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let limiter = RpcLimiter::new(CAPACITY, CAPACITY).unwrap();
    dev.security.set_limiter(limiter.clone());
    let client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;

    // Every slot is taken by calls in flight: the whole burst is refused, without waiting.
    let held: Vec<_> = (0..CAPACITY)
        .map(|_| limiter.try_acquire(DEV_URI).unwrap())
        .collect();
    let (admitted, refused) = tokio::time::timeout(Duration::from_secs(20), burst(&client, CALLS))
        .await
        .expect("refusals are immediate");
    assert_eq!((admitted, refused), (0, CALLS));

    // With half the slots free, calls run while they find a slot; none waits for one.
    drop(held.into_iter().take(CAPACITY / 2).collect::<Vec<_>>());
    let _still_held: Vec<_> = (0..CAPACITY / 2)
        .map(|_| limiter.try_acquire(DEV_URI).unwrap())
        .collect();
    let (admitted, refused) = tokio::time::timeout(Duration::from_secs(20), burst(&client, CALLS))
        .await
        .expect("the burst completes");
    assert_eq!(admitted + refused, CALLS);
    assert!(admitted >= 1, "free slots admit calls");
    assert!(
        limiter.peak() <= CAPACITY,
        "the bound held: peak {}",
        limiter.peak()
    );
    drop(_still_held);

    // Everything released: the limiter is empty again, and the next burst all succeeds
    // when it fits.
    eventually(Duration::from_secs(5), "all slots released", || {
        let active = limiter.active();
        async move { (active == (0, 0)).then_some(()) }
    })
    .await;
    let (admitted, _) = burst(&client, CAPACITY / 2).await;
    assert_eq!(admitted, CAPACITY / 2);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_its_own_bound_does_not_starve_another_client() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let limiter = RpcLimiter::new(2 * CAPACITY, CAPACITY).unwrap();
    dev.security.set_limiter(limiter.clone());
    edit_manifest(tmp.path(), |m| {
        m["clients"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"uri": "spiffe://dev.local/ns/default/second"}));
    });
    reload(&dev).await;
    let held: Vec<_> = (0..CAPACITY)
        .map(|_| limiter.try_acquire(DEV_URI).unwrap())
        .collect();
    let first = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let (admitted, _) = burst(&first, 2).await;
    assert_eq!(admitted, 0, "the first client is at its bound");
    let second_identity = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/second");
    let second = connect(dev.addr, tmp.path(), Some(&second_identity)).await;
    let (admitted, _) = burst(&second, 2).await;
    assert_eq!(admitted, 2, "the second client has its own slots");
    // An unauthenticated peer never takes a slot.
    let stranger = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/stranger");
    let mut stranger = connect(dev.addr, tmp.path(), Some(&stranger)).await;
    let status = stranger
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    drop(held);
    assert_eq!(limiter.active(), (0, 0));
    dev.stop().await.unwrap();
}
