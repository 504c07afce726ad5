//! The reconciler against a cluster that refuses or rewrites its requests (k8s-executor
//! §2.4-§2.6, §2.9 and the §7 catalogue: PreservesCreateAndConditionErrors,
//! AdmissionInjectedPullSecretFailsClosed, RetriesNeverReplaceAuthoritativeResources,
//! WorkerConvergesWithoutAnotherEvent): both failures of a reconcile are kept, what mutating
//! admission adds is adopted only where the spec tolerates it, a recorded object that vanished
//! is never created again, and quota refusals are retried with backoff until they clear.

mod reconciler_support;

use std::time::Duration;

use execution_provider::kube::crd::{ConditionStatus, ObjectIdentity, pod_name, pvc_name};
use execution_provider::reconciler::ReconcileError;
use reconciler_support::hooks::{Action, Rule};
use reconciler_support::*;
use serde_json::{Value, json};

fn refuse(method: &'static str, path: &'static str, suffix: &'static str, times: usize) -> Rule {
    Rule {
        method,
        path,
        suffix,
        times,
        action: Action::Refuse(500, "InternalError", "injected failure"),
    }
}

fn refuse_status_write(world: &World) {
    world.hooks.rule(Rule {
        action: Action::Refuse(500, "InternalError", "injected status write failure"),
        ..refuse("PUT", "executionenvironments", "/status", 1)
    });
}

fn reason_of(env: &execution_provider::kube::crd::ExecutionEnvironment) -> String {
    ready(env).map(|(_, r)| r).unwrap_or_default()
}

#[tokio::test]
async fn a_failed_create_and_a_failed_condition_write_are_both_kept_in_the_error() {
    for kind in ["persistentvolumeclaims", "pods"] {
        let world = World::new().await;
        let templates = registry();
        world.create_env(&templates).await;
        let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
        world.hooks.rule(Rule {
            action: Action::Refuse(500, "InternalError", "injected create failure"),
            ..refuse("POST", kind, "", 1)
        });
        refuse_status_write(&world);
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, ReconcileError::Joined { .. }),
            "{kind}: {text}"
        );
        assert!(text.contains("injected create failure"), "{kind}: {text}");
        assert!(
            text.contains("injected status write failure"),
            "{kind}: {text}"
        );
        assert!(
            world.env().await.status.unwrap().pod.is_none(),
            "{kind}: nothing recorded"
        );

        // Once the status write goes through, the condition names the failed step.
        world.hooks.rule(Rule {
            action: Action::Refuse(500, "InternalError", "injected create failure"),
            ..refuse("POST", kind, "", 1)
        });
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        assert!(matches!(error, ReconcileError::Kube { .. }), "{error}");
        let wanted = if kind == "pods" {
            "ExecutorUnavailable"
        } else {
            "PVCUnavailable"
        };
        assert_eq!(reason_of(&world.env().await), wanted);
    }
}

fn inject_pull_secret(pod: &mut Value) {
    pod["spec"]["imagePullSecrets"] = json!([{"name": "admission-injected"}]);
}

#[tokio::test]
async fn an_admission_injected_pull_secret_on_create_fails_closed() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    world.hooks.rule(Rule {
        action: Action::Mutate(inject_pull_secret),
        ..refuse("POST", "pods", "", 1)
    });
    for _ in 0..2 {
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        assert!(
            error.to_string().contains("pod image pull secrets differ"),
            "{error}"
        );
        let env = world.env().await;
        assert_eq!(
            ready(&env),
            Some((ConditionStatus::False, "ExecutorUnavailable".to_owned()))
        );
        assert!(env.status.unwrap().pod.is_none(), "never adopted");
    }
    assert_eq!(world.hooks.seen("POST", "pods").len(), 1, "created once");
}

fn default_toleration_seconds(pod: &mut Value) {
    for toleration in pod["spec"]["tolerations"].as_array_mut().unwrap() {
        toleration["tolerationSeconds"] = json!(120);
    }
}

fn extra_toleration(pod: &mut Value) {
    pod["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "injected", "operator": "Exists", "effect": "NoSchedule"}));
}

#[tokio::test]
async fn admission_defaulted_toleration_seconds_are_adopted_but_an_added_toleration_is_not() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    world.hooks.rule(Rule {
        action: Action::Mutate(default_toleration_seconds),
        ..refuse("POST", "pods", "", 1)
    });
    reconciler.reconcile(ENV).await.unwrap();
    let pod = world.pod().await.unwrap();
    let seconds: Vec<Option<i64>> = pod
        .spec
        .unwrap()
        .tolerations
        .unwrap()
        .iter()
        .map(|t| t.toleration_seconds)
        .collect();
    assert_eq!(seconds, [Some(120), Some(120)], "admission's durations");
    assert_eq!(
        world.env().await.status.unwrap().pod.unwrap().uid,
        pod.metadata.uid.unwrap(),
        "adopted"
    );

    let world = World::new().await;
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    world.hooks.rule(Rule {
        action: Action::Mutate(extra_toleration),
        ..refuse("POST", "pods", "", 1)
    });
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(error.to_string().contains("toleration"), "{error}");
    assert!(world.env().await.status.unwrap().pod.is_none());
}

#[tokio::test]
async fn retries_never_create_a_recorded_object_that_vanished() {
    for kind in ["persistentvolumeclaims", "pods"] {
        let world = World::new().await;
        let templates = registry();
        world.create_env(&templates).await;
        world
            .edit_status(|s| {
                let recorded = |name: String| {
                    Some(ObjectIdentity {
                        name,
                        uid: "recorded-uid".to_owned(),
                    })
                };
                if kind == "pods" {
                    s.pod = recorded(pod_name(ENV));
                } else {
                    s.pvc = recorded(pvc_name(ENV));
                }
            })
            .await;
        let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
        for attempt in 0..3 {
            let outcome = reconciler.reconcile(ENV).await;
            if kind == "persistentvolumeclaims" {
                let error = outcome.unwrap_err();
                assert!(
                    error.to_string().contains("authoritative PVC disappeared"),
                    "{attempt}: {error}"
                );
            }
        }
        assert!(
            world.hooks.seen("POST", kind).is_empty(),
            "{kind}: no create is ever issued"
        );
    }
}

/// A namespace quota refuses the workspace 24 times: the worker retries with a growing
/// backoff (not a hot loop), records the failure once, and converges with exactly one PVC and
/// one Pod once the quota clears, without any further Kubernetes event.
#[tokio::test(start_paused = true)]
async fn quota_refusals_are_retried_with_backoff_and_converge_without_another_event() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    const REFUSALS: usize = 24;
    world.hooks.rule(Rule {
        action: Action::Refuse(
            403,
            "Forbidden",
            "persistentvolumeclaims is forbidden: exceeded quota: execution-provider",
        ),
        ..refuse("POST", "persistentvolumeclaims", "", REFUSALS)
    });
    let running = Running::start(world.reconciler(&templates, EXECUTOR_ACCOUNT)).await;
    poll_until(
        "the executor Pod is created after the refusals",
        Duration::from_secs(1),
        Duration::from_secs(6 * 3600),
        || async { world.pod().await.is_some() },
    )
    .await;
    let creates = world.hooks.seen("POST", "persistentvolumeclaims");
    assert_eq!(creates.len(), REFUSALS + 1);
    assert!(creates[..REFUSALS].iter().all(|s| s.code == 403));
    assert_eq!(creates[REFUSALS].code, 201);
    let spread = creates[REFUSALS - 1].at - creates[0].at;
    assert!(
        spread >= Duration::from_millis(200),
        "rate limited: {spread:?}"
    );
    for pair in creates.windows(2).take(REFUSALS - 1) {
        assert!(pair[1].at > pair[0].at, "never two attempts at one instant");
    }
    let failure_writes = world
        .hooks
        .seen("PUT", "executionenvironments")
        .into_iter()
        .filter(|s| s.path.ends_with("/status") && s.at <= creates[REFUSALS - 1].at)
        .count();
    assert_eq!(failure_writes, 1, "the unchanged failure is written once");

    world.mark_pod_ready().await;
    wait_until("the environment becomes Ready", || async {
        ready(&world.env().await) == Some((ConditionStatus::True, "Reconciled".to_owned()))
    })
    .await;
    let status = world.env().await.status.unwrap();
    assert_eq!(world.pvc_count().await, 1);
    assert_eq!(world.pod_count().await, 1);
    assert_eq!(
        status.pvc.unwrap().uid,
        world.pvc().await.unwrap().metadata.uid.unwrap()
    );
    assert_eq!(
        status.pod.unwrap().uid,
        world.pod().await.unwrap().metadata.uid.unwrap()
    );
    running.stop().await;
}

/// A namespace ResourceQuota (`count/executionenvironments…`) refusing a fresh environment is
/// a definitive rejection like any other 403 (store.md §2.2f): the allocation answers
/// `internal` with the generic message (no quota detail crosses the wire), releases its ledger
/// slot and leaves no resource behind.
#[tokio::test]
async fn a_quota_refused_environment_create_answers_internal_and_releases_its_slot() {
    use execution_provider::store::ensure::EnsureRequest;
    use execution_provider::store::naming::owner_hash;
    use execution_provider::store::{Caller, Store};

    let world = World::new().await;
    let templates = registry();
    let store = Store::new(
        world.hooks.client(NAMESPACE),
        NAMESPACE,
        std::sync::Arc::new(templates.clone()),
        std::sync::Arc::new(execution_provider::executor::pod_exec::PodExecutor::new(
            world.client.clone(),
        )),
        world.runtime.clone(),
    );
    let request = |binding: &str| EnsureRequest {
        caller: Caller {
            client: "spiffe://test.local/ns/default/client".to_owned(),
            owner_hash: owner_hash("https://issuer.test", "alice"),
        },
        owner_issuer: "https://issuer.test".to_owned(),
        owner_subject: "alice".to_owned(),
        binding_id: binding.to_owned(),
        template_id: TEMPLATE.to_owned(),
        template_revision: templates.default_revision(TEMPLATE).unwrap().to_owned(),
        operation_id: format!("op-{binding}"),
    };
    let cases = [
        (
            "quota",
            "executionenvironments.execution.mecatl.dev \"x\" is forbidden: exceeded quota: \
             execution-provider, requested: count/executionenvironments.execution.mecatl.dev=1, \
             used: count/executionenvironments.execution.mecatl.dev=4, limited: \
             count/executionenvironments.execution.mecatl.dev=4",
            // store.md §2.2f: every definitive create rejection answers internal.
            tonic::Code::Internal,
            "internal",
        ),
        (
            "rbac",
            "executionenvironments.execution.mecatl.dev is forbidden: User cannot create",
            tonic::Code::Internal,
            "internal",
        ),
    ];
    for (binding, message, code, detail) in cases {
        world.hooks.rule(Rule {
            action: Action::Refuse(403, "Forbidden", message),
            ..refuse("POST", "executionenvironments", "", 1)
        });
        let error = store.ensure_template(&request(binding)).await.unwrap_err();
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), code, "{binding}");
        assert_eq!(
            status.message(),
            execution_provider::server::status::GENERIC_MESSAGE,
            "{binding}"
        );
        let sent = execution_provider::server::status::error_detail(&status).expect("ErrorDetail");
        assert_eq!(
            (sent.code.as_str(), sent.retryable),
            (detail, false),
            "{binding}"
        );
        assert!(
            world
                .envs()
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty(),
            "{binding}: nothing created"
        );
        assert!(
            world.ledger_names().await.is_empty(),
            "{binding}: the slot is released"
        );
    }
}
