//! Start-up of the reconciler (k8s-executor §2.1): the preflight of every RuntimeClass and
//! StorageClass the templates name, the capacity ledger's presence, readiness reasons, and
//! that starting never mutates an environment a peer replica may be working on.

mod reconciler_support;

use std::time::Duration;

use execution_provider::kube::crd::{FenceState, RfcTime};
use execution_provider::reconciler::Reconciler;
use reconciler_support::*;
use serde_json::json;

async fn refused(world: &World) -> (String, std::sync::Arc<Reconciler>) {
    refused_as(world, "profile-resource-unavailable").await
}

async fn refused_as(world: &World, reason: &str) -> (String, std::sync::Arc<Reconciler>) {
    let templates = registry();
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    let version = world.api.resource_version();
    let error = reconciler.clone().run(async {}).await.unwrap_err();
    assert_eq!(
        world.api.resource_version(),
        version,
        "preflight writes nothing"
    );
    assert_eq!(reconciler.readiness_reason(), reason);
    assert!(!reconciler.is_ready());
    (error.to_string(), reconciler)
}

#[tokio::test]
async fn initialize_refuses_a_missing_runtime_class() {
    let world = World::bare();
    world.add_storage_class("standard").await;
    world.add_ledger(&[]).await;
    let templates = registry();
    world.create_env(&templates).await;
    let (message, _) = refused(&world).await;
    assert!(
        message.starts_with("profile preflight: RuntimeClass \"sandboxed\" unavailable"),
        "{message}"
    );
    assert!(world.pod().await.is_none());
}

#[tokio::test]
async fn initialize_refuses_a_runtime_class_that_defines_scheduling() {
    for scheduling in [
        json!({"nodeSelector": {"pool": "sandbox"}}),
        json!({"tolerations": [{"key": "sandbox", "operator": "Exists"}]}),
    ] {
        let world = World::bare();
        world.add_runtime_class("sandboxed", Some(scheduling)).await;
        world.add_storage_class("standard").await;
        world.add_ledger(&[]).await;
        let (message, _) = refused(&world).await;
        assert_eq!(
            message,
            "profile preflight: RuntimeClass \"sandboxed\" must not define scheduling"
        );
    }
}

#[tokio::test]
async fn initialize_refuses_a_missing_storage_class_or_ledger() {
    let world = World::bare();
    world.add_runtime_class("sandboxed", None).await;
    world.add_ledger(&[]).await;
    let (message, _) = refused(&world).await;
    assert!(
        message.starts_with("profile preflight: StorageClass \"standard\" unavailable"),
        "{message}"
    );

    let world = World::bare();
    world.add_runtime_class("sandboxed", None).await;
    world.add_storage_class("standard").await;
    let (message, _) = refused_as(&world, "capacity-ledger-unavailable").await;
    assert!(
        message.starts_with("capacity ledger: capacity ledger ConfigMap"),
        "{message}"
    );
}

/// k8s-executor §2.1: a cache that cannot fill (here the executor Pods cannot be listed) is a
/// start-up failure with its own readiness reason, never a replica that waits forever, and the
/// replica is not ready while only the environment cache is filled.
#[tokio::test]
async fn a_cache_that_never_fills_ends_start_up_with_an_error() {
    for kind in ["pods", "persistentvolumeclaims"] {
        let world = World::new().await;
        let templates = registry();
        world.create_env(&templates).await;
        world.hooks.rule(hooks::Rule {
            method: "GET",
            path: kind,
            suffix: "",
            times: usize::MAX,
            action: hooks::Action::Refuse(403, "Forbidden", "injected list refusal"),
        });
        let reconciler = world.reconciler_syncing_within(&templates, Duration::from_secs(3));
        let running = tokio::spawn(reconciler.clone().run(std::future::pending()));
        let mut ever_ready = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !running.is_finished() {
            ever_ready |= reconciler.is_ready();
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind}: start-up gives up by its deadline"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!ever_ready, "{kind}: never ready without every cache");
        let error = running.await.unwrap().unwrap_err();
        assert!(
            error.to_string().contains("caches did not fill"),
            "{kind}: {error}"
        );
        assert_eq!(
            reconciler.readiness_reason(),
            "controller-cache-unavailable"
        );
    }
}

#[tokio::test]
async fn preflight_covers_deprecated_and_revoked_revisions_too() {
    let world = World::new().await;
    let revoked = execution(|e| e["runtimeClassName"] = json!("legacy"));
    let templates = registry_of(&[(execution(|_| {}), false), (revoked, true)]);
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    let error = reconciler.initialize().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("RuntimeClass \"legacy\" unavailable"),
        "{error}"
    );
    // The first error is remembered.
    world.add_runtime_class("legacy", None).await;
    assert!(reconciler.initialize().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn two_reconcilers_over_the_same_environment_at_start_up_change_nothing() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let first = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    first.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    first.reconcile(ENV).await.unwrap();
    let expires = RfcTime::from_system_time(world.now() + Duration::from_secs(3600));
    world
        .edit_status(|s| {
            s.fence_state = Some(FenceState::Healthy);
            s.active_operation = Some(
                serde_json::from_value(json!({
                    "id": "peer-op", "operation": "command", "startedAt": expires,
                    "claimID": "c", "runID": "r", "epoch": 1, "holderID": "peer",
                    "renewedAt": expires, "expiresAt": expires,
                }))
                .unwrap(),
            );
        })
        .await;
    let before = world.env().await;
    let version = world.api.resource_version();

    let (a, b) = (
        world.reconciler(&templates, EXECUTOR_ACCOUNT),
        world.reconciler(&templates, EXECUTOR_ACCOUNT),
    );
    assert_eq!(a.readiness_reason(), "controller-starting");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shared = futures::FutureExt::shared(async move {
        let _ = stopped.await;
    });
    let ta = tokio::spawn(a.clone().run(shared.clone()));
    let tb = tokio::spawn(b.clone().run(shared));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !(a.is_ready() && b.is_ready()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both become ready: {} {} {}",
            a.readiness_reason(),
            b.readiness_reason(),
            ta.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let both controllers work through their queues (paused time: runs until idle).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        world.api.resource_version(),
        version,
        "start-up wrote nothing"
    );
    let after = world.env().await;
    assert_eq!(after.status, before.status);
    assert_eq!(
        after.status.as_ref().unwrap().fence_state,
        Some(FenceState::Healthy)
    );
    assert_eq!(
        after.status.unwrap().active_operation.unwrap().id,
        "peer-op"
    );
    let _ = stop.send(());
    ta.await.unwrap().unwrap();
    tb.await.unwrap().unwrap();
}
