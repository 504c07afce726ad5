//! The reconciler's fence of an expired operation lease guards its compare-and-swap on the
//! exact operation it judged expired (issue 15, item 4): a completion, a renewal or a
//! `RecoverEnvironment` that lands between the reconciler's read and its write is never
//! overwritten, and an acknowledged recovery stays recovered.

mod reconciler_support;

use std::sync::Arc;
use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::executor::pod_exec::PodExecutor;
use execution_provider::kube::crd::{
    ActiveOperation, ConditionStatus, ExecutionEnvironment, ExecutionEnvironmentStatus, FenceState,
    RfcTime, condition,
};
use execution_provider::metrics::Metrics;
use execution_provider::reconciler::{Reconciler, ReconcilerConfig};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::naming::{client_hash, owner_hash};
use execution_provider::store::{EnvRef, Store};
use kube::api::{Api, PostParams};
use reconciler_support::hooks::{Action, Rule};
use reconciler_support::*;

const ADMIN: &str = "spiffe://test.local/ns/ops/admin";
const ISSUER: &str = "https://issuer.test";
const MESSAGE: &str = "operation holder lease expired; operation identity retained for recovery";

/// An operation `op-1` whose lease ran out a second ago.
fn expired_operation(world: &World) -> ActiveOperation {
    let expired = RfcTime::from_system_time(world.now() - Duration::from_secs(1));
    let started = RfcTime::from_system_time(world.now() - Duration::from_secs(60));
    ActiveOperation {
        id: "op-1".to_owned(),
        operation: "command".to_owned(),
        started_at: started,
        claim_id: "c".to_owned(),
        run_id: "r".to_owned(),
        epoch: 1,
        holder_id: "replica-a".to_owned(),
        renewed_at: started,
        expires_at: expired,
    }
}

/// A Ready environment created by [`ADMIN`] for alice, its store and its reconciler.
async fn provisioned(world: &World) -> (Store, Arc<Reconciler>) {
    let templates = registry();
    let mut env = world.create_env(&templates).await;
    env.spec.client_hash = client_hash(ADMIN);
    env.spec.owner_hash = owner_hash(ISSUER, "alice");
    world
        .envs()
        .replace(ENV, &PostParams::default(), &env)
        .await
        .unwrap();
    world
        .edit_status(|s| s.fence_state = Some(FenceState::Healthy))
        .await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_ready().await;
    reconciler.reconcile(ENV).await.unwrap();
    let store = Store::new(
        world.client.clone(),
        NAMESPACE,
        Arc::new(templates),
        Arc::new(PodExecutor::new(world.client.clone())),
        world.runtime.clone(),
    );
    (store, reconciler)
}

/// Just before the reconciler's next status write, `edit` changes the live status directly
/// (a peer replica's store landing between the reconciler's read and its write).
fn before_next_status_write(
    world: &World,
    edit: impl Fn(&mut ExecutionEnvironmentStatus) + Send + Sync + 'static,
) {
    let envs: Api<ExecutionEnvironment> = world.envs();
    let edit = Arc::new(edit);
    world.hooks.rule(Rule {
        method: "PUT",
        path: "executionenvironments",
        suffix: "/status",
        times: 1,
        action: Action::Before(Arc::new(move || {
            let (envs, edit) = (envs.clone(), edit.clone());
            Box::pin(async move {
                let mut env = envs.get(ENV).await.unwrap();
                edit(env.status.get_or_insert_with(Default::default));
                envs.replace_status(ENV, &PostParams::default(), &env)
                    .await
                    .unwrap();
            })
        })),
    });
}

#[tokio::test]
async fn a_completion_landing_before_the_expiry_fence_is_not_overwritten() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let op = expired_operation(&world);
    world.edit_status(|s| s.active_operation = Some(op)).await;
    // The holder's completion write clears the operation.
    before_next_status_write(&world, |s| s.active_operation = None);
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    // The next pass sees the completed environment and leaves it healthy.
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
}

#[tokio::test]
async fn a_renewal_landing_before_the_expiry_fence_is_not_overwritten() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let op = expired_operation(&world);
    world.edit_status(|s| s.active_operation = Some(op)).await;
    let renewed = RfcTime::from_system_time(world.now() + Duration::from_secs(30));
    // The holder's renewal moves the expiry forward; the operation id is unchanged.
    before_next_status_write(&world, move |s| {
        let op = s.active_operation.as_mut().unwrap();
        op.renewed_at = op.expires_at;
        op.expires_at = renewed;
    });
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert_eq!(status.active_operation.unwrap().expires_at, renewed);
}

#[tokio::test]
async fn a_different_operation_under_the_same_expiry_is_not_fenced() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let op = expired_operation(&world);
    world.edit_status(|s| s.active_operation = Some(op)).await;
    // The operation completed and the next one was started with the same recorded expiry.
    before_next_status_write(&world, |s| {
        s.active_operation.as_mut().unwrap().id = "op-2".into()
    });
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
}

#[tokio::test]
async fn an_unraced_expired_operation_is_fenced_keeping_its_identity() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let op = expired_operation(&world);
    world.edit_status(|s| s.active_operation = Some(op)).await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert_eq!(status.active_operation.unwrap().id, "op-1");
    let (value, reason) = ready(&world.env().await).unwrap();
    assert_eq!(
        (value, reason.as_str()),
        (ConditionStatus::False, "FenceUnknown")
    );
    let message = cond(&world.env().await, condition::READY).unwrap().message;
    assert_eq!(message, MESSAGE);
}

/// The admin request of a recovery of the environment as it stands.
async fn recovery(world: &World) -> AdminRequest {
    let env = world.env().await;
    let status = env.status.unwrap();
    AdminRequest {
        env: EnvRef {
            id: ENV.to_owned(),
            revision: env.spec.revision,
        },
        owner_hash: owner_hash(ISSUER, "alice"),
        actor: ADMIN.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: status.epoch.unwrap(),
        expected_pod_uid: status.pod.map(|p| p.uid).unwrap_or_default(),
        expected_pvc_uid: status.pvc.map(|p| p.uid).unwrap_or_default(),
        operation_id: "op-recover".to_owned(),
    }
}

#[tokio::test]
async fn an_acknowledged_recovery_landing_before_the_expiry_fence_stays_recovered() {
    let world = World::new().await;
    let (store, reconciler) = provisioned(&world).await;
    // The dispatch's outcome was unknown: the store fenced and kept the operation on record;
    // the executor has since exited, so a recovery can prove termination.
    let op = expired_operation(&world);
    world
        .edit_status(|s| {
            s.active_operation = Some(op);
            s.fence_state = Some(FenceState::FenceUnknown);
        })
        .await;
    world.mark_pod_terminated("Failed").await;
    let request = recovery(&world).await;
    let peer = store.clone();
    let recover = request.clone();
    world.hooks.rule(Rule {
        method: "PUT",
        path: "executionenvironments",
        suffix: "/status",
        times: 1,
        action: Action::Before(Arc::new(move || {
            let (peer, recover) = (peer.clone(), recover.clone());
            Box::pin(async move {
                peer.recover_environment(&recover)
                    .await
                    .expect("the recovery is acknowledged");
            })
        })),
    });
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy), "recovered");
    assert!(status.active_operation.is_none());
    // Replaying the acknowledged recovery answers success, and the environment it describes
    // is the one the server holds: healthy, also after the next reconcile.
    store.recover_environment(&request).await.unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert_ne!(
        ready(&world.env().await).map(|(_, reason)| reason),
        Some("FenceUnknown".to_owned())
    );
}

/// The value of the series `line_prefix` (`name{labels}`) in a scrape.
fn scraped(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not in the scrape:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn fences_are_counted_once_by_reason_and_recoveries_by_outcome() {
    let world = World::new().await;
    let (store, _) = provisioned(&world).await;
    let metrics = Metrics::new(Default::default(), world.runtime.clock.clone());
    let templates = registry();
    let reconciler = Reconciler::metered(
        world.hooks.client(NAMESPACE),
        ReconcilerConfig {
            namespace: NAMESPACE.to_owned(),
            executor_service_account: EXECUTOR_ACCOUNT.to_owned(),
            cache_sync_deadline: execution_provider::reconciler::DEFAULT_CACHE_SYNC_DEADLINE,
        },
        Arc::new(templates),
        world.runtime.clone(),
        metrics.lifecycle().clone(),
        metrics.reconcile().clone(),
    );
    let expired = r#"execution_provider_fences_total{reason="lease_expired"}"#;
    // A fence that loses its race to a completion writes nothing and counts nothing.
    world
        .edit_status(|s| s.active_operation = Some(expired_operation(&world)))
        .await;
    before_next_status_write(&world, |s| s.active_operation = None);
    reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(scraped(&metrics, expired), 0.0);

    world
        .edit_status(|s| s.active_operation = Some(expired_operation(&world)))
        .await;
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(scraped(&metrics, expired), 1.0);
    // Reconciling the fenced environment again is not a second fence.
    reconciler.reconcile(ENV).await.unwrap();
    assert_eq!(scraped(&metrics, expired), 1.0);
    let other = r#"execution_provider_fences_total{reason="outcome_unknown"}"#;
    assert_eq!(scraped(&metrics, other), 0.0);

    let store = store.with_metrics(metrics.lifecycle().clone());
    let recovered = r#"execution_provider_recoveries_total{outcome="ok"}"#;
    let unproven = r#"execution_provider_recoveries_total{outcome="fence_unknown"}"#;
    // The executor still runs: nothing proves termination.
    let refused = store.recover_environment(&recovery(&world).await).await;
    assert_eq!(refused.unwrap_err().code(), ErrorCode::FenceUnknown);
    assert_eq!(scraped(&metrics, unproven), 1.0);
    world.mark_pod_terminated("Failed").await;
    store
        .recover_environment(&recovery(&world).await)
        .await
        .unwrap();
    assert_eq!(scraped(&metrics, recovered), 1.0);
}
