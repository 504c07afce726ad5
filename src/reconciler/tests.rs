//! Snapshots of what the reconciler creates for every revision of the fixture templates (the
//! hardened executor Pod and the retained workspace PVC), and checks that what it renders is
//! what its own validation adopts.

use k8s_openapi::api::core::v1::Toleration;
use kube::core::ObjectMeta;

use super::pvc::validate_pvc;
use super::render::{executor_pod, workspace_pvc};
use super::validate_pod::validate_pod;
use crate::kube::crd::{ExecutionEnvironment, ExecutionEnvironmentSpec, ExecutorResources};
use crate::templates::{TemplateRegistry, TemplateRevision};

const FIXTURES: [&str; 2] = ["templates.yaml", "templates/history.yaml"];

fn fixture(name: &str) -> TemplateRegistry {
    TemplateRegistry::load(format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// An environment on `revision`, with fixed names and UIDs.
fn environment(revision: &TemplateRevision) -> ExecutionEnvironment {
    let spec = revision.execution();
    let hex = "0".repeat(64);
    let mut env = ExecutionEnvironment::new(
        "exec-00112233445566778899aabbccddeeff00112233",
        ExecutionEnvironmentSpec {
            schema_version: 2,
            allocation_id: "exec-00112233445566778899aabbccddeeff00112233".to_owned(),
            revision: "0123456789abcdef0123456789abcdef".to_owned(),
            owner_hash: hex.clone(),
            owner_issuer: None,
            owner_subject: None,
            client_hash: hex.clone(),
            binding_id: "binding".to_owned(),
            request_fingerprint: hex,
            template_id: revision.template_id().to_owned(),
            template_revision: revision.revision().to_owned(),
            template_digest: revision.digest().to_owned(),
            image: spec.image().to_owned(),
            storage_class: spec.storage_class().to_owned(),
            storage_size: spec.storage_size().as_str().to_owned(),
            resources: ExecutorResources::default(),
            desired: crate::kube::crd::Desired::Active,
        },
    );
    env.metadata = ObjectMeta {
        namespace: Some("execution".to_owned()),
        uid: Some("7d3c1f0e-0000-4000-8000-000000000001".to_owned()),
        ..env.metadata
    };
    env
}

fn every_revision() -> Vec<(String, TemplateRevision)> {
    let mut all = Vec::new();
    for file in FIXTURES {
        for template in fixture(file).templates().values() {
            for (key, revision) in template.revisions() {
                let label = format!(
                    "{}__{}__{}",
                    file.replace(['/', '.'], "_"),
                    template.id(),
                    &key[3..15]
                );
                all.push((label, revision.clone()));
            }
        }
    }
    all
}

#[test]
fn the_rendered_pod_and_pvc_of_every_fixture_revision_are_pinned() {
    for (label, revision) in every_revision() {
        let env = environment(&revision);
        let pod = executor_pod(&env, revision.execution(), "execution-executor");
        let pvc = workspace_pvc(&env, revision.execution());
        insta::assert_yaml_snapshot!(format!("pod__{label}"), pod);
        insta::assert_yaml_snapshot!(format!("pvc__{label}"), pvc);
    }
}

#[test]
fn what_the_reconciler_renders_its_own_validation_adopts() {
    for (label, revision) in every_revision() {
        let env = environment(&revision);
        let spec = revision.execution();
        let pod = executor_pod(&env, spec, "execution-executor");
        assert_eq!(
            validate_pod(&env, spec, "execution-executor", &pod),
            Ok(()),
            "{label}"
        );
        assert_eq!(
            validate_pvc(&env, spec, &workspace_pvc(&env, spec)),
            Ok(()),
            "{label}"
        );
        assert_eq!(
            validate_pod(&env, spec, "another-account", &pod),
            Err("pod service account differs"),
            "{label}"
        );
    }
}

#[test]
fn a_configured_no_execute_toleration_suppresses_only_its_own_default() {
    let (_, revision) = every_revision()
        .into_iter()
        .find(|(_, r)| !r.execution().tolerations().is_empty())
        .expect("a fixture revision with tolerations");
    let env = environment(&revision);
    let pod = executor_pod(&env, revision.execution(), "execution-executor");
    let tolerations: Vec<Toleration> = pod.spec.unwrap().tolerations.unwrap();
    let configured = revision.execution().tolerations().len();
    let expected: Vec<Option<&str>> = revision
        .execution()
        .tolerations()
        .iter()
        .map(|t| Some(t.key.as_str()))
        .collect();
    let rendered: Vec<Option<&str>> = tolerations[..configured]
        .iter()
        .map(|t| t.key.as_deref().or(Some("")))
        .collect();
    assert_eq!(rendered, expected, "configured tolerations first, in order");
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let no_execute = tolerations
            .iter()
            .filter(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some("NoExecute"))
            .count();
        assert_eq!(no_execute, 1, "exactly one NoExecute toleration for {key}");
    }
}

fn pod_with(spec: serde_json::Value, status: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "executor-x"}, "spec": spec, "status": status,
    }))
    .unwrap()
}

#[test]
fn a_pod_is_terminal_only_when_every_declared_container_terminated_by_name() {
    use super::pod::pod_terminal;
    use serde_json::json;
    let spec = json!({"initContainers": [{"name": "init"}], "containers": [{"name": "executor"}]});
    let done = |name: &str| {
        json!({"name": name, "ready": false, "restartCount": 0, "image": "i",
        "imageID": "i", "state": {"terminated": {"exitCode": 0}}})
    };
    let running = |name: &str| {
        json!({"name": name, "ready": true, "restartCount": 0, "image": "i",
        "imageID": "i", "state": {"running": {}}})
    };
    let terminal = json!({"phase": "Failed", "initContainerStatuses": [done("init")],
        "containerStatuses": [done("executor")]});
    assert!(pod_terminal(&pod_with(spec.clone(), terminal)));
    let cases = [
        (
            "still running",
            json!({"phase": "Running", "initContainerStatuses": [done("init")], "containerStatuses": [running("executor")]}),
        ),
        (
            "init running",
            json!({"phase": "Failed", "initContainerStatuses": [running("init")], "containerStatuses": [done("executor")]}),
        ),
        (
            "init missing",
            json!({"phase": "Failed", "containerStatuses": [done("executor")]}),
        ),
        (
            "duplicate status",
            json!({"phase": "Failed", "initContainerStatuses": [done("init")], "containerStatuses": [done("executor"), done("executor")]}),
        ),
        (
            "wrong name",
            json!({"phase": "Succeeded", "initContainerStatuses": [done("init")], "containerStatuses": [done("other")]}),
        ),
    ];
    for (what, status) in cases {
        assert!(!pod_terminal(&pod_with(spec.clone(), status)), "{what}");
    }
    assert!(
        !pod_terminal(&pod_with(
            json!({"containers": []}),
            json!({"phase": "Failed"})
        )),
        "no containers"
    );
}
