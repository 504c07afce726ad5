//! Checks that today's flows mask with other checks, each shown on its own. A presented run
//! claim is compared field by field (store §4.4): a context that differs from the stored claim
//! in exactly one field (the claim id, the epoch, or the environment's grant generation) is
//! refused by validation, dispatch, renewal and release, and nothing reaches the executor or
//! the store. In today's flows a new claim has a new id, a new epoch and a new run, and a
//! revocation ends the run, so each test presents or stores exactly the one difference. Ensure
//! compares the stored request fingerprint besides each identity field it covers; a stored
//! fingerprint that alone differs refuses the replay. Validation refuses an environment that
//! is not serving for each reason alone: the binding's reference not Published, or the
//! environment retiring (in today's flows retiring also withdraws the references).

mod store_support;

use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{Desired, ReferenceState};
use execution_provider::store::{ClaimContext, Store};
use kube::api::PostParams;
use store_support::*;

const MINUTE: Duration = Duration::from_secs(60);

/// Every claim-checking entry point refuses `rc` with a conflict (the claim is not current),
/// calls no executor and writes nothing.
async fn refused_everywhere(world: &World, store: &Store, c: &Claimed, rc: &ClaimContext) {
    let before = world.get(&c.env.id).await;
    let validate = store.validate_run_claim(&c.caller, rc).await;
    assert_eq!(
        validate.err().expect("validation refuses").code(),
        ErrorCode::Conflict
    );
    let execute = store.execute(&c.caller, rc, stat("a")).await;
    assert_eq!(
        execute.expect_err("dispatch refuses").code(),
        ErrorCode::Conflict
    );
    assert_eq!(world.executor.call_count(), 0, "nothing was dispatched");
    let renew = store.renew_run(&c.caller, rc, "renew-x", MINUTE).await;
    assert_eq!(
        renew.expect_err("renewal refuses").code(),
        ErrorCode::Conflict
    );
    let release = store.release_run(&c.caller, rc).await;
    assert_eq!(
        release.expect_err("release refuses").code(),
        ErrorCode::Conflict
    );
    let after = world.get(&c.env.id).await;
    assert_eq!(after.status, before.status, "nothing was written");
}

#[tokio::test(start_paused = true)]
async fn a_context_with_only_another_claim_id_is_refused() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    let rc = ClaimContext {
        claim_id: format!("{}-other", c.rc.claim_id),
        ..c.rc.clone()
    };
    refused_everywhere(&world, &store, &c, &rc).await;
    // The true claim still works: the refusal was about the claim id alone.
    store
        .validate_run_claim(&c.caller, &c.rc)
        .await
        .expect("the stored claim is current");
}

#[tokio::test(start_paused = true)]
async fn a_context_with_only_another_epoch_is_refused() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    for epoch in [c.rc.epoch + 1, c.rc.epoch - 1] {
        if epoch == 0 {
            continue;
        }
        let rc = ClaimContext {
            epoch,
            ..c.rc.clone()
        };
        refused_everywhere(&world, &store, &c, &rc).await;
    }
    store
        .validate_run_claim(&c.caller, &c.rc)
        .await
        .expect("the stored claim is current");
}

#[tokio::test(start_paused = true)]
async fn a_claim_under_a_generation_the_environment_has_left_is_refused() {
    let world = World::new().await;
    let store = world.store();
    let c = claimed(&world, &store, "alice", "b1").await;
    // The stored run still names the presented generation, but the environment's current
    // grant generation is past it: only the comparison with the environment's generation
    // can refuse.
    let api = world.environments();
    let mut o = api.get(&c.env.id).await.expect("get");
    let status = o.status.as_mut().expect("status");
    assert_eq!(status.grant_generation, Some(c.rc.grant_generation));
    status.grant_generation = Some(c.rc.grant_generation + 1);
    api.replace_status(&c.env.id, &PostParams::default(), &o)
        .await
        .expect("edit");
    let stored = world.get(&c.env.id).await;
    let run = stored.status.as_ref().and_then(|s| s.active_run.as_ref());
    assert_eq!(
        run.map(|r| r.grant_generation),
        Some(c.rc.grant_generation),
        "the run itself still matches the context"
    );
    refused_everywhere(&world, &store, &c, &c.rc).await;
}

#[tokio::test(start_paused = true)]
async fn an_ensure_replay_is_refused_when_only_the_stored_request_fingerprint_differs() {
    let world = World::new().await;
    let store = world.store();
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-ensure");
    let allocation = store.ensure_template(&req).await.expect("ensure");
    store
        .ensure_template(&req)
        .await
        .expect("the same request replays");
    let name = allocation.env.id.clone();
    let api = world.environments();
    let mut o = api.get(&name).await.expect("get");
    assert_ne!(o.spec.request_fingerprint, "0".repeat(64));
    o.spec.request_fingerprint = "0".repeat(64);
    api.replace(&name, &PostParams::default(), &o)
        .await
        .expect("edit");
    let before = world.get(&name).await;
    let err = store
        .ensure_template(&req)
        .await
        .expect_err("the stored request is not this one");
    assert_eq!(err.code(), ErrorCode::Conflict);
    let after = world.get(&name).await;
    assert_eq!(after.spec, before.spec);
    assert_eq!(after.status, before.status, "nothing was written");
}

/// One stored difference that makes an environment not serving.
#[derive(Debug, Clone, Copy)]
enum NotServing {
    /// The binding's reference record is no longer Published; the environment stays Active.
    ReferenceNotPublished,
    /// The environment is retiring; the binding's reference stays Published.
    Retiring,
}

#[tokio::test(start_paused = true)]
async fn validation_refuses_an_unpublished_reference_or_a_retiring_environment_each_alone() {
    // Validation answers not ready for both; the dispatch's admission, which does not
    // validate first, answers not found for a reference that is not published.
    for (difference, dispatch_code) in [
        (NotServing::ReferenceNotPublished, ErrorCode::NotFound),
        (NotServing::Retiring, ErrorCode::NotReady),
    ] {
        let world = World::new().await;
        let store = world.store();
        let c = claimed(&world, &store, "alice", "b1").await;
        let api = world.environments();
        let mut o = api.get(&c.env.id).await.expect("get");
        match difference {
            NotServing::ReferenceNotPublished => {
                let status = o.status.as_mut().expect("status");
                let reference = status
                    .references
                    .iter_mut()
                    .find(|r| r.binding_id == c.rc.binding_id)
                    .expect("the binding's reference");
                assert_eq!(reference.state, ReferenceState::Published);
                reference.state = ReferenceState::PendingDelete;
                api.replace_status(&c.env.id, &PostParams::default(), &o)
                    .await
                    .expect("edit");
            }
            NotServing::Retiring => {
                assert_eq!(o.spec.desired, Desired::Active);
                o.spec.desired = Desired::Retiring;
                api.replace(&c.env.id, &PostParams::default(), &o)
                    .await
                    .expect("edit");
            }
        }
        let before = world.get(&c.env.id).await;
        let validate = store.validate_run_claim(&c.caller, &c.rc).await;
        assert_eq!(
            validate.err().expect("validation refuses").code(),
            ErrorCode::NotReady,
            "{difference:?}"
        );
        let execute = store.execute(&c.caller, &c.rc, stat("a")).await;
        assert_eq!(
            execute.expect_err("dispatch refuses").code(),
            dispatch_code,
            "{difference:?}"
        );
        assert_eq!(world.executor.call_count(), 0, "nothing was dispatched");
        let after = world.get(&c.env.id).await;
        assert_eq!(after.status, before.status, "nothing was written");
    }
}
