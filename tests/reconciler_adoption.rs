//! Exact adoption (k8s-executor §2.4-§2.5): a PVC or Pod under the derived name is adopted
//! only when it has exactly the shape the reconciler creates (quantities compared by value,
//! DECISIONS 14); anything else is refused, never recorded, and leaves the environment not
//! Ready. A shared executor account creates nothing.

mod reconciler_support;

use execution_provider::errors::ErrorCode;
use execution_provider::reconciler::Next;
use k8s_openapi::api::core::v1::{LocalObjectReference, PersistentVolumeClaim, Toleration};
use kube::api::{ObjectMeta, PostParams};
use reconciler_support::*;

fn reason_of(env: &execution_provider::kube::crd::ExecutionEnvironment) -> String {
    ready(env).map(|(_, r)| r).unwrap_or_default()
}

#[tokio::test]
async fn a_foreign_pvc_under_the_derived_name_is_never_adopted() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let foreign = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(execution_provider::kube::crd::pvc_name(ENV)),
            ..ObjectMeta::default()
        },
        spec: Some(Default::default()),
        ..PersistentVolumeClaim::default()
    };
    world
        .pvcs()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    let error = reconciler.reconcile(ENV).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("PVC ownership or immutable specification mismatch"),
        "{error}"
    );
    let env = world.env().await;
    assert_eq!(reason_of(&env), "PVCUnavailable");
    assert!(env.status.unwrap().pvc.is_none());
    assert!(world.pod().await.is_none());
}

#[tokio::test]
async fn an_empty_or_default_executor_service_account_creates_no_pod() {
    for account in ["", "default"] {
        let world = World::new().await;
        let templates = registry();
        world.create_env(&templates).await;
        let reconciler = world.reconciler(&templates, account);
        let error = reconciler.reconcile(ENV).await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("executor ServiceAccount must be dedicated")
        );
        assert!(world.pod().await.is_none());
        assert_eq!(reason_of(&world.env().await), "ExecutorUnavailable");
    }
}

/// Each tampering of an existing Pod is refused: the Pod is not adopted, its UID is not
/// recorded and the environment is not Ready.
#[tokio::test]
async fn a_pod_that_differs_from_the_hardened_shape_is_never_adopted() {
    type Edit = fn(&mut k8s_openapi::api::core::v1::Pod);
    let cases: [(&str, Edit); 9] = [
        ("default service account", |p| {
            p.spec.as_mut().unwrap().service_account_name = Some("default".into())
        }),
        ("token enabled", |p| {
            p.spec.as_mut().unwrap().automount_service_account_token = Some(true)
        }),
        ("injected pull secret", |p| {
            p.spec.as_mut().unwrap().image_pull_secrets = Some(vec![LocalObjectReference {
                name: "injected".into(),
            }])
        }),
        ("changed selector", |p| {
            p.spec.as_mut().unwrap().node_selector =
                Some([("zone".to_owned(), "b".to_owned())].into())
        }),
        ("injected affinity", |p| {
            p.spec.as_mut().unwrap().affinity = Some(Default::default())
        }),
        ("extra toleration", |p| {
            p.spec
                .as_mut()
                .unwrap()
                .tolerations
                .as_mut()
                .unwrap()
                .push(Toleration {
                    key: Some("extra".into()),
                    operator: Some("Exists".into()),
                    ..Toleration::default()
                })
        }),
        ("suffix beyond a day", |p| {
            p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[0].toleration_seconds =
                Some(86_401)
        }),
        ("privilege escalation", |p| {
            let c = &mut p.spec.as_mut().unwrap().containers[0];
            c.security_context
                .as_mut()
                .unwrap()
                .allow_privilege_escalation = Some(true)
        }),
        ("extra resource", |p| {
            let c = &mut p.spec.as_mut().unwrap().containers[0];
            c.resources
                .as_mut()
                .unwrap()
                .limits
                .as_mut()
                .unwrap()
                .insert(
                    "nvidia.com/gpu".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
                );
        }),
    ];
    for (what, edit) in cases {
        let world = World::new().await;
        let templates = registry();
        world.create_env(&templates).await;
        let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
        // Create the Pod, then tamper with it before its identity is recorded.
        reconciler.reconcile(ENV).await.unwrap();
        world.edit_status(|s| s.pod = None).await;
        world.replace_pod(edit).await;
        world.mark_pod_ready().await;
        let error = reconciler.reconcile(ENV).await.expect_err(what);
        assert_eq!(error.code(), ErrorCode::Conflict, "{what}: {error}");
        let env = world.env().await;
        assert_eq!(reason_of(&env), "ExecutorUnavailable", "{what}");
        assert!(
            env.status.unwrap().pod.is_none(),
            "{what}: UID not recorded"
        );
    }
}

#[tokio::test]
async fn quantities_written_differently_but_equal_in_value_are_adopted() {
    let world = World::new().await;
    let templates = registry();
    world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    world.edit_status(|s| s.pod = None).await;
    world
        .replace_pod(|p| {
            let c = &mut p.spec.as_mut().unwrap().containers[0];
            let requests = c.resources.as_mut().unwrap().requests.as_mut().unwrap();
            requests.insert(
                "cpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("0.1".into()),
            );
        })
        .await;
    world.mark_pod_ready().await;
    assert_eq!(reconciler.reconcile(ENV).await.unwrap(), Next::Wait);
    assert_eq!(reason_of(&world.env().await), "Reconciled");
}
