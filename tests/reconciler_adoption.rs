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

/// An environment on `templates` whose Pod was created, then edited by `edit` before its
/// identity was recorded: the outcome of the next reconcile.
async fn adopt_after(
    templates: &execution_provider::templates::TemplateRegistry,
    account: &str,
    edit: impl FnOnce(&mut k8s_openapi::api::core::v1::Pod),
) -> (
    World,
    Result<Next, execution_provider::reconciler::ReconcileError>,
) {
    let world = World::new().await;
    world.create_env(templates).await;
    let reconciler = world.reconciler(templates, account);
    reconciler.reconcile(ENV).await.unwrap();
    world.edit_status(|s| s.pod = None).await;
    world.replace_pod(edit).await;
    world.mark_pod_ready().await;
    let outcome = reconciler.reconcile(ENV).await;
    (world, outcome)
}

fn secrets(names: &[&str]) -> Option<Vec<LocalObjectReference>> {
    Some(
        names
            .iter()
            .map(|n| LocalObjectReference {
                name: (*n).to_owned(),
            })
            .collect(),
    )
}

#[tokio::test]
async fn pull_identity_is_applied_in_order_and_any_other_identity_is_refused() {
    let templates = registry_of(&[(
        execution(|e| e["imagePullSecrets"] = serde_json::json!(["pull-a", "pull-b"])),
        false,
    )]);
    let (world, outcome) = adopt_after(&templates, EXECUTOR_ACCOUNT, |_| {}).await;
    assert_eq!(outcome.unwrap(), Next::Wait);
    let spec = world.pod().await.unwrap().spec.unwrap();
    assert_eq!(spec.image_pull_secrets, secrets(&["pull-a", "pull-b"]));
    assert_eq!(spec.service_account_name.as_deref(), Some(EXECUTOR_ACCOUNT));

    type Edit = fn(&mut k8s_openapi::api::core::v1::Pod);
    let refused: [(&str, Edit); 5] = [
        ("missing secret", |p| {
            p.spec.as_mut().unwrap().image_pull_secrets = secrets(&["pull-a"])
        }),
        ("reordered secrets", |p| {
            p.spec.as_mut().unwrap().image_pull_secrets = secrets(&["pull-b", "pull-a"])
        }),
        ("injected secret", |p| {
            p.spec.as_mut().unwrap().image_pull_secrets = secrets(&["pull-a", "pull-b", "injected"])
        }),
        ("provider account", |p| {
            p.spec.as_mut().unwrap().service_account_name = Some("execution-provider".into())
        }),
        ("default account", |p| {
            p.spec.as_mut().unwrap().service_account_name = Some("default".into())
        }),
    ];
    for (what, edit) in refused {
        let (world, outcome) = adopt_after(&templates, EXECUTOR_ACCOUNT, edit).await;
        let error = outcome.expect_err(what);
        assert_eq!(error.code(), ErrorCode::Conflict, "{what}: {error}");
        assert!(world.env().await.status.unwrap().pod.is_none(), "{what}");
    }
}

fn toleration(key: &str, effect: &str) -> serde_json::Value {
    serde_json::json!({"key": key, "operator": "Exists", "effect": effect})
}

/// The suffix after `configured` tolerations.
fn defaults_after(
    configured: &[serde_json::Value],
) -> (execution_provider::templates::TemplateRegistry, Vec<String>) {
    let templates = registry_of(&[(
        execution(|e| {
            e["tolerations"] = serde_json::Value::Array(configured.to_vec());
            e["nodeSelector"] = serde_json::json!({"pool": "sandbox"});
        }),
        false,
    )]);
    let revision = templates.default_template(TEMPLATE).unwrap();
    let env: execution_provider::kube::crd::ExecutionEnvironment = serde_json::from_value(
        serde_json::json!({"apiVersion": "execution.mecatl.dev/v1alpha1",
            "kind": "ExecutionEnvironment", "metadata": {"name": ENV, "uid": "u"},
            "spec": {"schemaVersion": 2, "allocationID": ENV, "revision": "r",
                "ownerHash": "0".repeat(64), "clientHash": "0".repeat(64), "bindingID": "b",
                "requestFingerprint": "0".repeat(64), "templateID": TEMPLATE,
                "templateRevision": revision.revision(), "templateDigest": revision.digest(),
                "image": revision.execution().image(), "storageClass": "standard",
                "storageSize": "1Gi", "resources": {"cpuRequest": "1", "memoryRequest": "1",
                "cpuLimit": "1", "memoryLimit": "1"}, "desired": "Active"}}),
    )
    .unwrap();
    let pod =
        execution_provider::reconciler::render::executor_pod(&env, revision.execution(), "sa");
    let suffix = pod.spec.unwrap().tolerations.unwrap()[configured.len()..]
        .iter()
        .map(|t| {
            format!(
                "{}/{}/{}",
                t.key.clone().unwrap_or_default(),
                t.effect.clone().unwrap_or_default(),
                t.toleration_seconds.unwrap_or_default()
            )
        })
        .collect();
    (templates, suffix)
}

#[test]
fn the_default_toleration_suffix_is_suppressed_only_by_the_same_key_with_no_execute() {
    let not_ready = "node.kubernetes.io/not-ready/NoExecute/300";
    let unreachable = "node.kubernetes.io/unreachable/NoExecute/300";
    let cases: [(&str, Vec<serde_json::Value>, Vec<&str>); 4] = [
        ("none configured", vec![], vec![not_ready, unreachable]),
        (
            "same key, NoExecute",
            vec![toleration("node.kubernetes.io/not-ready", "NoExecute")],
            vec![unreachable],
        ),
        (
            "same key, another effect",
            vec![toleration("node.kubernetes.io/not-ready", "NoSchedule")],
            vec![not_ready, unreachable],
        ),
        (
            "wildcard key",
            vec![toleration("", "NoExecute")],
            vec![not_ready, unreachable],
        ),
    ];
    for (what, configured, expected) in cases {
        let (_, suffix) = defaults_after(&configured);
        assert_eq!(suffix, expected, "{what}");
    }
}

#[tokio::test]
async fn scheduling_variants_a_cluster_may_produce_are_adopted_and_tampering_is_refused() {
    let configured = [toleration("example.com/sandbox", "NoSchedule")];
    let (templates, _) = defaults_after(&configured);
    type Edit = fn(&mut k8s_openapi::api::core::v1::Pod);
    let adopted: [(&str, Edit); 3] = [
        ("legacy Pod without the suffix", |p| {
            p.spec
                .as_mut()
                .unwrap()
                .tolerations
                .as_mut()
                .unwrap()
                .truncate(1)
        }),
        ("cluster default of a day", |p| {
            for t in &mut p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[1..] {
                t.toleration_seconds = Some(86_400);
            }
        }),
        ("cluster default of zero", |p| {
            p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[2].toleration_seconds = Some(0)
        }),
    ];
    for (what, edit) in adopted {
        let (_, outcome) = adopt_after(&templates, EXECUTOR_ACCOUNT, edit).await;
        assert_eq!(outcome.expect(what), Next::Wait, "{what}");
    }
    let refused: [(&str, Edit); 5] = [
        ("suffix operator changed", |p| {
            let t = &mut p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[1];
            t.operator = Some("Equal".into());
            t.value = Some("x".into());
        }),
        ("suffix value set", |p| {
            p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[1].value = Some("x".into())
        }),
        ("configured toleration dropped", |p| {
            p.spec
                .as_mut()
                .unwrap()
                .tolerations
                .as_mut()
                .unwrap()
                .remove(0);
        }),
        ("selector emptied", |p| {
            p.spec.as_mut().unwrap().node_selector = None
        }),
        ("negative duration", |p| {
            p.spec.as_mut().unwrap().tolerations.as_mut().unwrap()[1].toleration_seconds = Some(-1)
        }),
    ];
    for (what, edit) in refused {
        let (world, outcome) = adopt_after(&templates, EXECUTOR_ACCOUNT, edit).await;
        let error = outcome.expect_err(what);
        assert!(
            error.to_string().contains("pod tolerations differ")
                || error.to_string().contains("pod node selector differs"),
            "{what}: {error}"
        );
        assert!(world.env().await.status.unwrap().pod.is_none(), "{what}");
    }
}

/// An executor Pod of the previous release's shape (a controller owner reference instead of
/// the allocation-uid label, the API server's defaults for the fields this release renders)
/// keeps serving after an upgrade: the reconciler moves its metadata to the current shape, the
/// same Pod with the same UID, so the garbage collector can no longer delete it ahead of the
/// provider's lifecycle. It is neither refused nor fenced.
#[tokio::test]
async fn a_previous_release_pod_is_moved_to_the_current_shape_and_stays_ready() {
    use execution_provider::kube::crd::{ConditionStatus, FenceState, LABEL_ALLOCATION_UID};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let world = World::new().await;
    let templates = registry();
    let env = world.create_env(&templates).await;
    let reconciler = world.reconciler(&templates, EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.unwrap();
    let owner = OwnerReference {
        api_version: "execution.mecatl.dev/v1alpha1".to_owned(),
        kind: "ExecutionEnvironment".to_owned(),
        name: ENV.to_owned(),
        uid: env.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    world
        .replace_pod(move |p| {
            p.metadata
                .labels
                .as_mut()
                .unwrap()
                .remove(LABEL_ALLOCATION_UID);
            p.metadata.owner_references = Some(vec![owner]);
            let spec = p.spec.as_mut().unwrap();
            spec.enable_service_links = Some(true);
            spec.security_context
                .as_mut()
                .unwrap()
                .fs_group_change_policy = None;
        })
        .await;
    world.mark_pod_ready().await;
    let before = world.pod().await.unwrap();
    reconciler.reconcile(ENV).await.unwrap();
    let after = world.pod().await.unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid, "the same Pod");
    assert!(
        after
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "the owner reference is gone"
    );
    assert_eq!(
        after.metadata.labels.unwrap().get(LABEL_ALLOCATION_UID),
        env.metadata.uid.as_ref()
    );
    let env = world.env().await;
    assert_eq!(ready(&env).map(|(s, _)| s), Some(ConditionStatus::True));
    assert_ne!(
        env.status.unwrap().fence_state,
        Some(FenceState::FenceUnknown)
    );
}
