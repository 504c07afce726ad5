//! The RPC limiter over real mTLS on loopback (api-security §7, §9.27): a bounded load test
//! driving ten times the limiter's capacity. Calls admitted while slots are free succeed,
//! the rest are refused at once with RESOURCE_EXHAUSTED (nothing queues), bounds are never
//! exceeded, and the limiter's state returns to empty. Bounds configured in the manifest or
//! by flags (flags win) are the ones enforced.

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::state_dir::StateDir;
use execution_provider::server::limiter::{LimiterBounds, RpcLimiter};
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

const SECOND_URI: &str = "spiffe://dev.local/ns/default/second";

fn admit_second_client(m: &mut serde_json::Value) {
    m["clients"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({ "uri": SECOND_URI }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_configured_in_the_manifest_are_enforced_after_a_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    assert_eq!(dev.security.limiter().bounds(), (128, 32), "the defaults");
    edit_manifest(tmp.path(), |m| {
        admit_second_client(m);
        m["limits"] = serde_json::json!({"maxConcurrentRPCs": 3, "maxConcurrentRPCsPerClient": 2});
    });
    reload(&dev).await;
    let limiter = dev.security.limiter();
    assert_eq!(limiter.bounds(), (3, 2));
    let first = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let second = connect(
        dev.addr,
        tmp.path(),
        Some(&identity_from_dev_ca(tmp.path(), SECOND_URI)),
    )
    .await;
    assert_eq!(burst(&first, 1).await, (1, 0), "a free slot admits");

    let mine: Vec<_> = (0..2)
        .map(|_| limiter.try_acquire(DEV_URI).unwrap())
        .collect();
    assert_eq!(
        burst(&first, 3).await,
        (0, 3),
        "the configured per-client bound"
    );
    assert_eq!(
        burst(&second, 1).await,
        (1, 0),
        "the global bound has one slot left"
    );
    let theirs = limiter.try_acquire(SECOND_URI).unwrap();
    assert_eq!(
        burst(&second, 3).await,
        (0, 3),
        "the configured global bound"
    );
    drop((mine, theirs));
    assert_eq!(burst(&first, 2).await, (2, 0));
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_flags_win_over_the_manifest_and_a_clash_fails_the_reload_closed() {
    let tmp = tempfile::tempdir().unwrap();
    StateDir::open_or_init(tmp.path()).unwrap();
    edit_manifest(tmp.path(), |m| {
        m["limits"] = serde_json::json!({"maxConcurrentRPCs": 6, "maxConcurrentRPCsPerClient": 4});
    });
    let flags = LimiterBounds {
        global: None,
        per_client: Some(2),
    };
    let dev = start_dev_with(tmp.path(), std::sync::Arc::default(), flags).await;
    let limiter = dev.security.limiter();
    assert_eq!(
        limiter.bounds(),
        (6, 2),
        "the flag wins; the manifest fills the rest"
    );
    let client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let held: Vec<_> = (0..2)
        .map(|_| limiter.try_acquire(DEV_URI).unwrap())
        .collect();
    assert_eq!(
        burst(&client, 2).await,
        (0, 2),
        "the flag's per-client bound"
    );
    drop(held);
    edit_manifest(tmp.path(), |m| m["limits"]["maxConcurrentRPCs"] = 5.into());
    reload(&dev).await;
    assert_eq!(dev.security.limiter().bounds(), (5, 2), "applied on reload");
    assert_eq!(burst(&client, 2).await, (2, 0));

    // A global bound below the flag's per-client bound: the reload fails, fail closed.
    edit_manifest(tmp.path(), |m| m["limits"]["maxConcurrentRPCs"] = 1.into());
    assert!(dev.security_manager.reload().await.is_err());
    let status = client
        .clone()
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap_err();
    assert_refused(&status, tonic::Code::Unavailable, "not_ready", true);
    dev.stop().await.unwrap();
}
