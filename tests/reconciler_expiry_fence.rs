//! The reconciler's fence of an expired operation lease guards its compare-and-swap on the
//! exact operation it judged expired (issue 15, item 4): a completion, a renewal or a
//! `RecoverEnvironment` that lands between the reconciler's read and its write is never
//! overwritten, and an acknowledged recovery stays recovered. After the fence, the automatic
//! recovery of the recovery issue (item 2): the exact Pod deleted with its UID precondition and
//! never forced, its kubelet-confirmed end recorded as the proof that clears the fence, a new
//! executor on the same PVC at epoch + 1; a manual template, a vanished Pod and a Pod stuck
//! terminating stay fenced with a condition that says why; an executor Pod deleted by someone
//! else is fenced once its kubelet reports its end, and recovered the same way.

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
use execution_provider::reconciler::recovery::{self, reason as recovering};
use execution_provider::reconciler::{Reconciler, ReconcilerConfig};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::naming::{client_hash, owner_hash};
use execution_provider::store::{EnvRef, Store};
use execution_provider::templates::TemplateRegistry;
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
    provisioned_with(world, registry()).await
}

/// [`provisioned`] with the template registry `templates`.
async fn provisioned_with(world: &World, templates: TemplateRegistry) -> (Store, Arc<Reconciler>) {
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

/// The `Recovering` condition as (status, reason).
fn recovering_condition(env: &ExecutionEnvironment) -> Option<(ConditionStatus, String)> {
    cond(env, recovering::RECOVERING).map(|c| (c.status, c.reason))
}

/// The DELETE requests of the executor Pod the reconciler sent.
fn pod_deletes(world: &World) -> Vec<reconciler_support::hooks::Seen> {
    world.hooks.seen("DELETE", "/pods/")
}

/// A fenced environment: an operation whose holder vanished mid-call, fenced at its expiry.
async fn fenced_by_expiry(world: &World, reconciler: &Reconciler) {
    world
        .edit_status(|s| s.active_operation = Some(expired_operation(world)))
        .await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
}

#[tokio::test]
async fn a_fenced_environment_is_recovered_by_the_kubelet_confirmed_end_of_its_exact_pod() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let before = world.env().await.status.unwrap();
    let (old_pod, pvc, epoch) = (
        before.pod.clone().unwrap().uid,
        before.pvc.clone().unwrap().uid,
        before.epoch.unwrap(),
    );
    fenced_by_expiry(&world, &reconciler).await;
    // The first pass admits the recovery of exactly this Pod, the next deletes it.
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    let op = env
        .status
        .as_ref()
        .unwrap()
        .lifecycle_operation
        .clone()
        .unwrap();
    assert!(recovery::is_recovery(&op), "{op:?}");
    assert_eq!(op.expected_pod_uid.as_deref(), Some(old_pod.as_str()));
    assert_eq!(
        recovering_condition(&env),
        Some((
            ConditionStatus::True,
            recovering::AWAITING_TERMINAL_EXECUTOR.into()
        ))
    );
    reconciler.reconcile(ENV).await.unwrap();
    let deletes = pod_deletes(&world);
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let delete = &deletes[0].body;
    assert_eq!(delete["preconditions"]["uid"], old_pod.as_str(), "{delete}");
    assert_ne!(
        delete["gracePeriodSeconds"], 0,
        "never a force delete: {delete}"
    );
    // Deleted but not yet terminated: the finalizer holds the Pod, nothing is proven, the
    // environment stays fenced however often it is reconciled.
    let pod = world.pod().await.expect("the finalizer holds the Pod");
    assert!(pod.metadata.deletion_timestamp.is_some());
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.termination_proof.is_none());
    assert_eq!(status.active_operation.unwrap().id, "op-1");
    // The kubelet reports every container terminated: the proof clears fence, operation
    // and claim in one write.
    world.mark_pod_terminated("Failed").await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    assert!(status.active_run.is_none());
    let proof = status.termination_proof.unwrap();
    assert_eq!(
        (proof.pod_uid.as_str(), proof.pvc_uid.as_str()),
        (old_pod.as_str(), pvc.as_str())
    );
    assert_eq!(proof.operation_id, op.id);
    // The ordinary replacement follows: finalizer released, Pod gone, a new executor.
    for _ in 0..8 {
        let status = world.env().await.status.unwrap();
        if status.lifecycle_operation.is_none() {
            break;
        }
        if let Some(pod) = world.pod().await
            && pod.metadata.uid.as_deref() != Some(old_pod.as_str())
            && !execution_provider::reconciler::pod::pod_ready(&pod)
        {
            world.mark_pod_ready().await;
        }
        reconciler.reconcile(ENV).await.unwrap();
    }
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert!(status.lifecycle_operation.is_none(), "{status:?}");
    assert_eq!(status.epoch, Some(epoch + 1));
    assert_eq!(status.pvc.unwrap().uid, pvc, "the same workspace");
    let new_pod = status.pod.unwrap().uid;
    assert_ne!(new_pod, old_pod);
    assert_eq!(world.pvc().await.unwrap().metadata.uid.unwrap(), pvc);
    assert_eq!(ready(&env).unwrap().0, ConditionStatus::True);
    assert_eq!(
        recovering_condition(&env),
        Some((ConditionStatus::False, recovering::RECOVERED.into()))
    );
    assert_eq!(
        pod_deletes(&world)
            .iter()
            .filter(|d| d.body["gracePeriodSeconds"] == 0)
            .count(),
        0
    );
}

#[tokio::test]
async fn a_manual_template_keeps_the_fence_and_says_so() {
    let world = World::new().await;
    let manual = registry_of(&[(
        execution(|v| v["recovery"] = serde_json::json!("manual")),
        false,
    )]);
    let (_store, reconciler) = provisioned_with(&world, manual).await;
    fenced_by_expiry(&world, &reconciler).await;
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.lifecycle_operation.is_none());
    assert!(pod_deletes(&world).is_empty());
    assert_eq!(
        recovering_condition(&env),
        Some((ConditionStatus::False, recovering::MANUAL_RECOVERY.into()))
    );
}

#[tokio::test]
async fn a_vanished_or_foreign_pod_proves_nothing_and_stays_fenced() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    fenced_by_expiry(&world, &reconciler).await;
    // The status records another Pod than the one that runs: nothing proves its end.
    world
        .edit_status(|s| s.pod.as_mut().unwrap().uid = "someone-else".into())
        .await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert!(env.status.as_ref().unwrap().lifecycle_operation.is_none());
    assert!(pod_deletes(&world).is_empty());
    assert_eq!(
        recovering_condition(&env),
        Some((
            ConditionStatus::False,
            recovering::EXECUTOR_IDENTITY_LOST.into()
        ))
    );
    assert_eq!(
        env.status.unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
}

#[tokio::test]
async fn a_recovery_whose_pod_vanishes_before_its_proof_gives_up_and_stays_fenced() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    fenced_by_expiry(&world, &reconciler).await;
    reconciler.reconcile(ENV).await.unwrap(); // admitted
    reconciler.reconcile(ENV).await.unwrap(); // deleted
    // Someone removes the finalizer: the Pod object goes before its end was confirmed.
    world.replace_pod(|p| p.metadata.finalizers = None).await;
    assert!(world.pod().await.is_none());
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::FenceUnknown, "{error}");
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.termination_proof.is_none());
    assert!(status.lifecycle_operation.is_none(), "the recovery gave up");
    assert_eq!(
        recovering_condition(&env),
        Some((
            ConditionStatus::False,
            recovering::EXECUTOR_IDENTITY_LOST.into()
        ))
    );
    // Nothing to prove from now on: the next passes leave it fenced, no new executor.
    reconciler.reconcile(ENV).await.unwrap();
    assert!(world.pod().await.is_none());
    assert_eq!(
        world.env().await.status.unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
}

#[tokio::test(start_paused = true)]
async fn a_pod_stuck_terminating_stays_fenced_with_the_operators_way_out() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    fenced_by_expiry(&world, &reconciler).await;
    reconciler.reconcile(ENV).await.unwrap(); // admitted
    reconciler.reconcile(ENV).await.unwrap(); // deleted
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert_eq!(
        recovering_condition(&env),
        Some((
            ConditionStatus::True,
            recovering::AWAITING_TERMINAL_EXECUTOR.into()
        ))
    );
    // The node is cut off: its kubelet never reports the end.
    tokio::time::advance(recovery::TERMINATION_UNCONFIRMED_AFTER + Duration::from_secs(31)).await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert!(status.termination_proof.is_none());
    let condition = cond(&env, recovering::RECOVERING).unwrap();
    assert_eq!(
        (condition.status, condition.reason.as_str()),
        (ConditionStatus::False, recovering::TERMINATION_UNCONFIRMED)
    );
    assert_eq!(condition.message, recovery::UNCONFIRMED_MESSAGE);
    assert!(
        world.pod().await.is_some(),
        "the finalizer still holds the Pod"
    );
    // Once the node answers again, the recovery finishes.
    world.mark_pod_terminated("Failed").await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.termination_proof.is_some());
}

/// Runs a fenced environment's automatic recovery to its end, playing the kubelet.
async fn recover_automatically(world: &World, reconciler: &Reconciler) {
    let old_pod = world.env().await.status.unwrap().pod.unwrap().uid;
    reconciler.reconcile(ENV).await.unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    world.mark_pod_terminated("Failed").await;
    for _ in 0..10 {
        if world
            .env()
            .await
            .status
            .unwrap()
            .lifecycle_operation
            .is_none()
        {
            return;
        }
        if let Some(pod) = world.pod().await
            && pod.metadata.uid.as_deref() != Some(old_pod.as_str())
            && !execution_provider::reconciler::pod::pod_ready(&pod)
        {
            world.mark_pod_ready().await;
        }
        reconciler.reconcile(ENV).await.unwrap();
    }
    panic!("the recovery did not finish");
}

#[tokio::test]
async fn an_executor_pod_deleted_by_someone_else_is_fenced_once_its_end_is_reported_and_recovered()
{
    // An eviction, a node drain or `kubectl delete pod`: the finalizer holds the Pod.
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    let before = world.env().await.status.unwrap();
    let (old_pod, pvc, epoch) = (
        before.pod.unwrap().uid,
        before.pvc.unwrap().uid,
        before.epoch.unwrap(),
    );
    world
        .pods()
        .delete(
            &execution_provider::kube::crd::pod_name(ENV),
            &Default::default(),
        )
        .await
        .unwrap();
    // Still running: unavailable, not fenced (k8s-executor §2.7).
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(error.to_string().contains("pod is terminating"), "{error}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    // Its kubelet reports every container terminated: it exited (DECISIONS 15), fenced ...
    world.mark_pod_terminated("Failed").await;
    reconciler.reconcile(ENV).await.unwrap();
    let env = world.env().await;
    assert_eq!(
        env.status.as_ref().unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
    assert_eq!(
        ready(&env),
        Some((ConditionStatus::False, "FenceUnknown".to_owned()))
    );
    // ... and recovered without anyone: the same Pod's end is the proof, a new executor
    // serves the same workspace at the next epoch.
    recover_automatically(&world, &reconciler).await;
    let env = world.env().await;
    let status = env.status.clone().unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert_eq!(status.termination_proof.unwrap().pod_uid, old_pod);
    assert_eq!(status.epoch, Some(epoch + 1));
    assert_eq!(status.pvc.unwrap().uid, pvc);
    assert_ne!(status.pod.unwrap().uid, old_pod);
    assert_eq!(ready(&env).unwrap().0, ConditionStatus::True);
}

#[tokio::test]
async fn a_fence_and_its_automatic_recovery_are_events_on_the_environment() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    world.record_events(&reconciler);
    fenced_by_expiry(&world, &reconciler).await;
    // Fenced again (already fenced): no second event.
    reconciler.reconcile(ENV).await.ok();
    recover_automatically(&world, &reconciler).await;
    let step = |phase: &str| event("Normal", "LifecycleStep", phase);
    assert_eq!(
        world.events(7).await,
        vec![
            event("Warning", "Fenced", "LeaseExpired"),
            event("Normal", "RecoveryStarted", "AutomaticRecovery"),
            step("WaitingForTermination"),
            step("RemovingPodFinalizer"),
            step("WaitingForPodDeletion"),
            step("CreatingReplacement"),
            event("Normal", "Recovered", "AutomaticRecovery"),
        ]
    );
}

#[tokio::test]
async fn a_blocked_recovery_is_one_warning_and_an_administrators_recovery_an_event() {
    let world = World::new().await;
    let manual = registry_of(&[(
        execution(|v| v["recovery"] = serde_json::json!("manual")),
        false,
    )]);
    let (store, reconciler) = provisioned_with(&world, manual).await;
    let store = store.with_events(world.record_events(&reconciler));
    fenced_by_expiry(&world, &reconciler).await;
    for _ in 0..3 {
        reconciler.reconcile(ENV).await.unwrap();
    }
    world.mark_pod_terminated("Failed").await;
    store
        .recover_environment(&recovery(&world).await)
        .await
        .unwrap();
    assert_eq!(
        world.events(3).await,
        vec![
            event("Warning", "Fenced", "LeaseExpired"),
            event("Warning", "RecoveryBlocked", recovering::MANUAL_RECOVERY),
            event("Normal", "Recovered", "RecoverEnvironment"),
        ]
    );
}

#[tokio::test]
async fn event_writes_that_fail_or_hang_neither_fail_nor_block_the_reconcile() {
    let world = World::new().await;
    let (_store, reconciler) = provisioned(&world).await;
    world.record_events(&reconciler);
    world.hooks.rule(Rule {
        method: "POST",
        path: "/events",
        suffix: "",
        times: 1,
        action: Action::Refuse(500, "InternalError", "the events store is down"),
    });
    world.hooks.rule(Rule {
        method: "POST",
        path: "/events",
        suffix: "",
        times: 100,
        action: Action::Before(Arc::new(|| Box::pin(futures::future::pending::<()>()))),
    });
    // The fence's event is refused, the recovery's hang: every reconcile still answers.
    fenced_by_expiry(&world, &reconciler).await;
    recover_automatically(&world, &reconciler).await;
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    let refused = world.hooks.seen("POST", "/events");
    assert_eq!(refused.first().map(|s| s.code), Some(500), "{refused:?}");
    assert!(world.events(0).await.is_empty());
}

// Ask before fencing (the recovery issue, item 1): the reconciler asks the executor's
// supervisor about the expired operation's id, and fences only when it cannot answer.

use execution_provider::executor::protocol::CommandState;
use execution_provider::executor::supervisor_protocol::operation_receipt;
use execution_provider::kube::crd::{ActiveRun, RecoveredOperation};
use execution_provider::reconciler::Next;
use execution_provider::store::command_authority::CommandWarden;
use execution_provider::store::expiry::ASK_DEADLINE;
use execution_provider::store::policy::NoPolicyCheck;
use reconciler_support::supervised::{InProcessSupervisor, Reach};

/// A provisioned environment whose reconciler asks `supervisor` (through a store of its
/// own, as the provider's warden is) before it fences; returns that store too.
async fn asking(world: &World) -> (Arc<InProcessSupervisor>, Store, Arc<Reconciler>) {
    let (_store, reconciler) = provisioned(world).await;
    let supervisor = InProcessSupervisor::new(world.runtime.clone());
    let store = Store::new(
        world.hooks.client(NAMESPACE),
        NAMESPACE,
        Arc::new(registry()),
        supervisor.clone(),
        world.runtime.clone(),
    );
    reconciler.watch_commands(CommandWarden::new(store.clone(), Arc::new(NoPolicyCheck)));
    (supervisor, store, reconciler)
}

/// The claim `c`/`r` of [`expired_operation`], current for another minute.
fn current_claim(world: &World) -> ActiveRun {
    ActiveRun {
        binding_id: "binding".to_owned(),
        run_id: "r".to_owned(),
        claim_id: "c".to_owned(),
        operation_id: "acquire".to_owned(),
        owner_hash: owner_hash(ISSUER, "alice"),
        client_hash: client_hash(ADMIN),
        epoch: 1,
        grant_generation: 1,
        expires_at: RfcTime::from_system_time(world.now() + Duration::from_secs(60)),
    }
}

/// The expired operation `op-1`, under the current claim when `claimed`.
async fn expire(world: &World, claimed: bool) {
    let op = expired_operation(world);
    let run = claimed.then(|| current_claim(world));
    world
        .edit_status(move |s| {
            s.active_operation = Some(op);
            s.active_run = run;
        })
        .await;
}

fn assert_fenced_keeping_op_1(status: &ExecutionEnvironmentStatus) {
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert_eq!(status.active_operation.as_ref().unwrap().id, "op-1");
    assert!(status.recovered_operation.is_none());
}

#[tokio::test]
async fn an_expired_operation_whose_end_the_supervisor_proves_is_recorded_and_cleared_unfenced() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.ended("op-1", CommandState::Succeeded, true, b"{\"response\":{}}");
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    let recorded = status.recovered_operation.unwrap();
    assert_eq!(
        recorded,
        RecoveredOperation {
            id: "op-1".into(),
            operation: "command".into(),
            state: "succeeded".into(),
            terminal_receipt: operation_receipt(
                "op-1",
                CommandState::Succeeded,
                b"{\"response\":{}}"
            ),
            cancelled_by_recovery: false,
            recorded_at: recorded.recorded_at,
        }
    );
    assert_eq!(ready(&world.env().await).unwrap().0, ConditionStatus::True);
}

#[tokio::test]
async fn an_expired_operation_whose_end_is_not_proven_is_fenced() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.ended("op-1", CommandState::FenceUnknown, false, b"");
    reconciler.reconcile(ENV).await.unwrap();
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
}

#[tokio::test]
async fn an_expired_operation_still_running_under_its_current_claim_is_adopted_and_keeps_running() {
    let world = World::new().await;
    let (supervisor, store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    let cancelled = supervisor.running("op-1");
    let next = reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    let op = status.active_operation.unwrap();
    assert_eq!(op.id, "op-1");
    assert_eq!(op.holder_id, store.holder_id(), "this replica holds it now");
    assert!(op.renewed_at.to_system_time() > expired_operation(&world).expires_at.to_system_time());
    assert_eq!(
        op.expires_at.to_system_time(),
        op.renewed_at.to_system_time() + Duration::from_secs(30)
    );
    assert_eq!(next, Next::After(Duration::from_secs(30)));
    assert!(!*cancelled.borrow(), "the call keeps running");
    // It ends while adopted: at the adopted lease's expiry its end is recorded.
    supervisor.ended("op-1", CommandState::Succeeded, true, b"{}");
    world
        .edit_status(|s| {
            let op = s.active_operation.as_mut().unwrap();
            op.expires_at = RfcTime::from_system_time(op.renewed_at.to_system_time());
        })
        .await;
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    assert_eq!(status.recovered_operation.unwrap().state, "succeeded");
}

#[tokio::test]
async fn an_expired_operation_still_running_after_its_claim_ended_is_cancelled_and_its_end_recorded()
 {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, false).await;
    let mut cancelled = supervisor.running("op-1");
    // The call ends, proven, once it is cancelled (its helper's stdin closed).
    let ending = supervisor.clone();
    tokio::spawn(async move {
        cancelled.wait_for(|c| *c).await.unwrap();
        ending.ended("op-1", CommandState::Cancelled, true, b"{\"cancelled\":1}");
    });
    reconciler.reconcile(ENV).await.unwrap();
    let status = world.env().await.status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
    assert!(status.active_operation.is_none());
    let recorded = status.recovered_operation.unwrap();
    assert_eq!(
        (recorded.state.as_str(), recorded.cancelled_by_recovery),
        ("cancelled", true)
    );
    assert_eq!(
        recorded.terminal_receipt,
        operation_receipt("op-1", CommandState::Cancelled, b"{\"cancelled\":1}")
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_operation_whose_cancel_proves_no_end_is_fenced() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    // The claim is another one now: the call's claim ended. The call never ends.
    expire(&world, true).await;
    world
        .edit_status(|s| s.active_run.as_mut().unwrap().claim_id = "c2".into())
        .await;
    let cancelled = supervisor.running("op-1");
    reconciler.reconcile(ENV).await.unwrap();
    assert!(*cancelled.borrow(), "the call was cancelled");
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
}

#[tokio::test]
async fn an_expired_operation_the_supervisor_cannot_answer_for_is_fenced() {
    // Unreachable (the Pod gone, the node cut off).
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.set_reach(Reach::Unreachable);
    reconciler.reconcile(ENV).await.unwrap();
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
    // An id the supervisor never journaled (a restarted container, an unjournaled call).
    let world = World::new().await;
    let (_supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    reconciler.reconcile(ENV).await.unwrap();
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_silent_supervisor_is_given_up_on_at_the_ask_deadline_and_fenced() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.set_reach(Reach::Silent);
    let started = tokio::time::Instant::now();
    tokio::time::timeout(ASK_DEADLINE * 4, reconciler.reconcile(ENV))
        .await
        .expect("the ask gives up at its deadline")
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= ASK_DEADLINE && waited < ASK_DEADLINE + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
}

#[tokio::test]
async fn a_completion_landing_between_the_ask_and_the_record_is_not_overwritten() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.ended("op-1", CommandState::Succeeded, true, b"{}");
    // The holder was not gone after all: its completion lands first, and a next operation
    // is admitted under the same recorded expiry.
    before_next_status_write(&world, |s| {
        s.active_operation.as_mut().unwrap().id = "op-2".into()
    });
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.active_operation.unwrap().id, "op-2");
    assert!(status.recovered_operation.is_none());
    assert_eq!(status.fence_state, Some(FenceState::Healthy));
}

#[tokio::test]
async fn a_renewal_landing_between_the_ask_and_the_adoption_is_not_overwritten() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    let renewed = RfcTime::from_system_time(world.now() + Duration::from_secs(25));
    // The holder (or another replica's adoption) renews first.
    before_next_status_write(&world, move |s| {
        let op = s.active_operation.as_mut().unwrap();
        op.holder_id = "replica-b".into();
        op.expires_at = renewed;
    });
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let op = world.env().await.status.unwrap().active_operation.unwrap();
    assert_eq!(
        (op.holder_id.as_str(), op.expires_at),
        ("replica-b", renewed)
    );
}

#[tokio::test]
async fn a_claim_ending_between_the_ask_and_the_adoption_is_not_adopted() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    // The claim is released after the ask: the live object no longer lets it run on.
    before_next_status_write(&world, |s| s.active_run = None);
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let op = world.env().await.status.unwrap().active_operation.unwrap();
    assert_eq!(op.holder_id, "replica-a", "not adopted");
}

#[tokio::test]
async fn a_fence_landing_between_the_ask_and_the_record_stays_fenced() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.ended("op-1", CommandState::Succeeded, true, b"{}");
    // The holder's own fence (an unknown outcome on its side) lands first.
    before_next_status_write(&world, |s| s.fence_state = Some(FenceState::FenceUnknown));
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    assert_fenced_keeping_op_1(&world.env().await.status.unwrap());
}

#[tokio::test]
async fn an_answer_about_another_pod_is_not_recorded() {
    let world = World::new().await;
    let (supervisor, _store, reconciler) = asking(&world).await;
    expire(&world, true).await;
    supervisor.running("op-1");
    supervisor.ended("op-1", CommandState::Succeeded, true, b"{}");
    // The recorded executor changes after the ask: the answer was another Pod's.
    before_next_status_write(&world, |s| s.pod.as_mut().unwrap().uid = "replaced".into());
    let lost = reconciler.reconcile(ENV).await.unwrap_err();
    assert_eq!(lost.code(), ErrorCode::Conflict, "{lost}");
    let status = world.env().await.status.unwrap();
    assert_eq!(status.active_operation.unwrap().id, "op-1");
    assert!(status.recovered_operation.is_none());
}
