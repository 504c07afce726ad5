//! §9.29 (api-security): a compare-and-swap retry during which the environment's creator
//! changes concurrently answers NOT_FOUND, because every attempt rechecks the subject on
//! its fresh read. A peer rewrites the creator (client or owner) just before the store's
//! first status write is served, so that write loses (409) and the retry sees the new
//! creator; nothing is written after the peer.

mod store_support;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::store::Store;
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::error::StoreError;
use execution_provider::store::naming::{client_hash, owner_hash};
use kube::api::PostParams;
use store_support::*;

type Outcome<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// A store operation of the subject `c.caller` on its environment.
type Operation = for<'a> fn(&'a Store, &'a Claimed) -> Outcome<'a>;

fn acquire<'a>(store: &'a Store, c: &'a Claimed) -> Outcome<'a> {
    Box::pin(async move {
        let req = AcquireRequest {
            env: c.env.clone(),
            caller: c.caller.clone(),
            binding_id: c.rc.binding_id.clone(),
            run_id: "run-2".to_owned(),
            operation_id: "op-acquire-2".to_owned(),
            ttl: std::time::Duration::from_secs(60),
        };
        store.acquire_run(&req).await.map(drop)
    })
}

fn renew<'a>(store: &'a Store, c: &'a Claimed) -> Outcome<'a> {
    let ttl = std::time::Duration::from_secs(60);
    Box::pin(async move {
        store
            .renew_run(&c.caller, &c.rc, "renew-1", ttl)
            .await
            .map(drop)
    })
}

fn release_run<'a>(store: &'a Store, c: &'a Claimed) -> Outcome<'a> {
    Box::pin(store.release_run(&c.caller, &c.rc))
}

fn release_reference<'a>(store: &'a Store, c: &'a Claimed) -> Outcome<'a> {
    Box::pin(store.release_reference(&c.env, &c.caller, &c.rc.binding_id))
}

fn prepare_delete<'a>(store: &'a Store, c: &'a Claimed) -> Outcome<'a> {
    Box::pin(store.prepare_reference_delete(&c.env, &c.caller, &c.rc.binding_id, "op-delete"))
}

/// How the peer changes the creator.
#[derive(Debug, Clone, Copy)]
enum NewCreator {
    /// Another client of the same owner.
    Client,
    /// The same client, another owner.
    Owner,
}

/// Arms a peer that rewrites the creator just before the next status write, and returns
/// where the object it wrote will be.
fn peer_changes_creator(
    world: &World,
    name: &str,
    change: NewCreator,
) -> Arc<Mutex<Option<ExecutionEnvironment>>> {
    let written = Arc::new(Mutex::new(None));
    let (api, name, slot) = (world.environments(), name.to_owned(), written.clone());
    world.before_write("/status", move || async move {
        let mut env = api.get(&name).await.expect("the peer reads");
        match change {
            NewCreator::Client => env.spec.client_hash = client_hash(OTHER_CLIENT),
            NewCreator::Owner => env.spec.owner_hash = owner_hash(ISSUER, "mallory"),
        }
        let env = api
            .replace(&name, &PostParams::default(), &env)
            .await
            .expect("the peer writes");
        *slot.lock().expect("slot") = Some(env);
    });
    written
}

/// Runs `operation` on a claimed environment (its run released first when `idle`) while a
/// peer changes the creator, and checks the refusal.
async fn assert_refused_after_a_creator_change(operation: Operation, what: &str, idle: bool) {
    for change in [NewCreator::Client, NewCreator::Owner] {
        let world = World::new().await;
        let store = world.store();
        let c = claimed(&world, &store, "alice", "b1").await;
        if idle {
            store.release_run(&c.caller, &c.rc).await.expect("release");
        }
        let peer = peer_changes_creator(&world, &c.env.id, change);
        world.faults.lock().expect("faults").reset_counts();

        let err = operation(&store, &c).await.expect_err(what);
        assert_eq!(err.code(), ErrorCode::NotFound, "{what} {change:?}: {err}");
        let after_peer = peer.lock().expect("slot").clone();
        let after_peer = after_peer.unwrap_or_else(|| panic!("{what}: the peer never ran"));
        assert_eq!(
            world.get(&c.env.id).await,
            after_peer,
            "{what} {change:?}: nothing is written after the peer"
        );
        let faults = world.faults.lock().expect("faults");
        assert!(
            faults.count("GET", "executionenvironments") >= 2,
            "{what} {change:?}: the store read again after losing its write: {:?}",
            faults.counts
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_acquire_whose_creator_changes_between_attempts_is_not_found() {
    assert_refused_after_a_creator_change(acquire, "acquire", true).await;
}

#[tokio::test(start_paused = true)]
async fn a_renewal_whose_creator_changes_between_attempts_is_not_found() {
    assert_refused_after_a_creator_change(renew, "renew", false).await;
}

#[tokio::test(start_paused = true)]
async fn a_run_release_whose_creator_changes_between_attempts_is_not_found() {
    assert_refused_after_a_creator_change(release_run, "release run", false).await;
}

#[tokio::test(start_paused = true)]
async fn a_reference_release_whose_creator_changes_between_attempts_is_not_found() {
    assert_refused_after_a_creator_change(release_reference, "release reference", false).await;
}

#[tokio::test(start_paused = true)]
async fn a_reference_delete_whose_creator_changes_between_attempts_is_not_found() {
    assert_refused_after_a_creator_change(prepare_delete, "prepare delete", false).await;
}
