//! §9.7 (api-security §3): a failed DeleteRetiredEnvironment logs one bounded WARN record,
//! `"execution backend failure"`, with exactly four fields (`message`, `operation`,
//! `reason`, `environment`); an unclassified backend failure has reason `other`, and the
//! raw error text (here a sentinel in the API server's answer) is never logged. Events are
//! captured by a small tracing layer installed for the test's thread only.

mod store_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{ConditionStatus, EnvironmentCondition, RfcTime};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::error::StoreError;
use kube::api::PostParams;
use store_support::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

const SENTINEL: &str = "sentinel-7f3a-backend-secret";

/// One event of this crate: its level and every field rendered as text.
#[derive(Debug, Clone)]
struct Captured {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("execution_provider") {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let level = *event.metadata().level();
        self.0
            .lock()
            .expect("capture")
            .push(Captured { level, fields });
    }
}

impl Capture {
    fn events(&self) -> Vec<Captured> {
        self.0.lock().expect("capture").clone()
    }
}

/// A retired, unreferenced, run-free environment and the administrator request deleting it.
async fn retired(world: &World) -> AdminRequest {
    let store = world.store();
    let req = ensure_request(world, CLIENT, "alice", "b1", "roomy", "op-e");
    let a = store.ensure_template(&req).await.expect("ensure");
    store
        .commit_reference(&a.env, &req.caller, "b1", "op-e")
        .await
        .expect("commit");
    world.make_ready(&a.env.id).await;
    store
        .release_reference(&a.env, &req.caller, "b1")
        .await
        .expect("release");
    let api = world.environments();
    let mut o = api.get(&a.env.id).await.expect("get");
    let now = RfcTime::from_system_time(world.clock_now());
    let status = o.status.as_mut().expect("status");
    status.conditions.clear();
    for type_ in ["Retired", "ExecutorTerminated"] {
        status.conditions.push(EnvironmentCondition {
            type_: type_.to_owned(),
            status: ConditionStatus::True,
            reason: "Retained".to_owned(),
            message: String::new(),
            observed_generation: 1,
            last_transition_time: now,
        });
    }
    let pvc_uid = status.pvc.as_ref().expect("pvc").uid.clone();
    let epoch = status.epoch.expect("epoch");
    api.replace_status(&a.env.id, &PostParams::default(), &o)
        .await
        .expect("retire");
    AdminRequest {
        env: a.env,
        owner_hash: req.caller.owner_hash,
        actor: CLIENT.to_owned(),
        administrator_for: Vec::new(),
        expected_epoch: epoch,
        expected_pod_uid: String::new(),
        expected_pvc_uid: pvc_uid,
        operation_id: "delete-1".to_owned(),
    }
}

/// Deletes with the admission write failing by `fault`, capturing the events it logs.
async fn delete_failing_with(fault: Fault) -> (StoreError, Vec<Captured>, AdminRequest) {
    let world = World::new().await;
    let q = retired(&world).await;
    let before = world.get(&q.env.id).await;
    world.fail_write(1, fault, "/status");
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let err = world
        .store()
        .delete_retired_environment(&q)
        .await
        .expect_err("the admission write fails");
    drop(_guard);
    assert_eq!(world.get(&q.env.id).await, before, "nothing was written");
    (err, capture.events(), q)
}

fn assert_one_bounded_record(events: &[Captured], q: &AdminRequest, reason: &str) {
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.level, tracing::Level::WARN);
    let expected = BTreeMap::from([
        ("environment".to_owned(), q.env.id.clone()),
        ("message".to_owned(), "execution backend failure".to_owned()),
        ("operation".to_owned(), "delete_retired".to_owned()),
        ("reason".to_owned(), reason.to_owned()),
    ]);
    assert_eq!(event.fields, expected, "exactly these four fields");
}

#[tokio::test]
async fn an_unclassified_delete_retired_failure_logs_four_bounded_fields_and_no_error_text() {
    let (err, events, q) =
        delete_failing_with(Fault::StatusWith(500, "InternalError", SENTINEL)).await;
    assert_eq!(err.code(), ErrorCode::Internal);
    assert!(
        format!("{err}").contains(SENTINEL),
        "the sentinel reached the store error, so the log had the chance to leak it"
    );
    assert_one_bounded_record(&events, &q, "other");
    let logged = format!("{events:?}");
    assert!(!logged.contains(SENTINEL), "{logged}");
}

#[tokio::test]
async fn a_classified_delete_retired_failure_logs_its_class_and_no_error_text() {
    for (code, reason, class) in [
        (429, "TooManyRequests", "rate_limited"),
        (403, "Forbidden", "forbidden"),
        (503, "ServiceUnavailable", "unavailable"),
        (504, "Timeout", "timeout"),
    ] {
        let (_, events, q) = delete_failing_with(Fault::StatusWith(code, reason, SENTINEL)).await;
        assert_one_bounded_record(&events, &q, class);
        assert!(!format!("{events:?}").contains(SENTINEL));
    }
    let (_, events, q) = delete_failing_with(Fault::Transport).await;
    assert_one_bounded_record(&events, &q, "other");
}

#[tokio::test]
async fn a_refused_delete_retired_logs_the_controlled_code_as_its_reason() {
    let world = World::new().await;
    let mut q = retired(&world).await;
    q.expected_pvc_uid = "another-pvc".to_owned();
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let err = world
        .store()
        .delete_retired_environment(&q)
        .await
        .expect_err("identity changed");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_one_bounded_record(&capture.events(), &q, "conflict");
    let admitted = {
        q.expected_pvc_uid = world
            .get(&q.env.id)
            .await
            .status
            .expect("status")
            .pvc
            .expect("pvc")
            .uid;
        world.store().delete_retired_environment(&q).await
    };
    admitted.expect("admitted");
    assert_eq!(capture.events().len(), 1, "a success logs nothing");
}
