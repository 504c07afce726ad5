//! Snapshots of what the reconciler creates for every revision of the fixture templates (the
//! hardened executor Pod and the retained workspace PVC), and checks that what it renders is
//! what its own validation adopts.

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::ObjectMeta;

use super::pvc::validate_pvc;
use super::render::{executor_pod, workspace_pvc};
use super::validate_pod::{PodShape, validate_pod};
use crate::kube::crd::{
    ExecutionEnvironment, ExecutionEnvironmentSpec, ExecutorResources, LABEL_ALLOCATION_UID,
};
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
            create_deadline: None,
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
            Ok(PodShape::Current),
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

/// A Pod as the release before this one rendered it: a controller owner reference instead of
/// the allocation-uid label, and the service links, fsGroup change policy and termination
/// grace left to the API server's defaults.
fn previous_shape(pod: &mut Pod, env: &ExecutionEnvironment) {
    pod.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_ALLOCATION_UID);
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "execution.mecatl.dev/v1alpha1".to_owned(),
        kind: "ExecutionEnvironment".to_owned(),
        name: env.metadata.name.clone().unwrap(),
        uid: env.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let spec = pod.spec.as_mut().unwrap();
    spec.enable_service_links = Some(true);
    spec.termination_grace_period_seconds = Some(30);
    spec.security_context
        .as_mut()
        .unwrap()
        .fs_group_change_policy = None;
}

#[test]
fn the_rendered_pod_has_no_owner_reference_and_names_its_environment_by_labels() {
    let (_, revision) = every_revision().remove(0);
    let env = environment(&revision);
    let pod = executor_pod(&env, revision.execution(), "execution-executor");
    assert!(pod.metadata.owner_references.is_none());
    assert_eq!(
        pod.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(LABEL_ALLOCATION_UID),
        env.metadata.uid.as_ref()
    );
    let spec = pod.spec.unwrap();
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(
        spec.security_context
            .unwrap()
            .fs_group_change_policy
            .as_deref(),
        Some("OnRootMismatch")
    );
}

#[test]
fn the_supervisor_or_the_earlier_idle_shell_is_the_main_process_and_nothing_else() {
    use super::render::LEGACY_EXECUTOR_COMMAND;
    use super::validate_pod::runs_supervisor;
    let (_, revision) = every_revision().remove(0);
    let env = environment(&revision);
    let spec = revision.execution();
    let check = |pod: &Pod| validate_pod(&env, spec, "execution-executor", pod);
    let rendered = executor_pod(&env, spec, "execution-executor");
    assert_eq!(
        rendered.spec.as_ref().unwrap().containers[0].command,
        Some(vec!["/mecatl-executor".to_owned(), "supervise".to_owned()])
    );
    assert!(runs_supervisor(&rendered));
    let with_command = |command: &[&str]| {
        let mut pod = rendered.clone();
        pod.spec.as_mut().unwrap().containers[0].command =
            Some(command.iter().map(|s| (*s).to_owned()).collect());
        pod
    };
    let legacy = with_command(&LEGACY_EXECUTOR_COMMAND);
    assert_eq!(
        check(&legacy),
        Ok(PodShape::Current),
        "adopted, to be replaced"
    );
    assert!(!runs_supervisor(&legacy));
    for other in [
        &["/bin/sh", "-c", "sleep infinity"][..],
        &["/mecatl-executor", "supervise", "--socket", "@elsewhere"][..],
        &["/mecatl-executor"][..],
    ] {
        assert_eq!(
            check(&with_command(other)),
            Err("executor container name, image or command differs"),
            "{other:?}"
        );
    }
    let mut no_command = rendered.clone();
    no_command.spec.as_mut().unwrap().containers[0].command = None;
    assert!(check(&no_command).is_err());
}

#[test]
fn a_previous_shape_pod_is_adopted_as_such_and_a_mixed_one_is_refused() {
    let (_, revision) = every_revision().remove(0);
    let env = environment(&revision);
    let spec = revision.execution();
    let check = |pod: &Pod| validate_pod(&env, spec, "execution-executor", pod);
    let rendered = executor_pod(&env, spec, "execution-executor");

    let mut previous = rendered.clone();
    previous_shape(&mut previous, &env);
    assert_eq!(check(&previous), Ok(PodShape::Previous));

    let mut foreign_owner = previous.clone();
    foreign_owner.metadata.owner_references.as_mut().unwrap()[0].uid = "other".to_owned();
    assert_eq!(
        check(&foreign_owner),
        Err("pod owner reference is not this environment")
    );
    let mut two_owners = previous.clone();
    let owner = two_owners.metadata.owner_references.as_ref().unwrap()[0].clone();
    two_owners
        .metadata
        .owner_references
        .as_mut()
        .unwrap()
        .push(owner);
    assert_eq!(
        check(&two_owners),
        Err("pod must have at most one owner reference")
    );
    let mut labelled_and_owned = rendered.clone();
    labelled_and_owned.metadata.owner_references = previous.metadata.owner_references.clone();
    assert_eq!(check(&labelled_and_owned), Err("pod labels differ"));

    type Edit = fn(&mut Pod);
    let current_only: [(&str, Edit); 3] = [
        ("pod enables service links", |p| {
            p.spec.as_mut().unwrap().enable_service_links = Some(true)
        }),
        ("pod termination grace differs", |p| {
            p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(3600)
        }),
        ("pod fsGroup change policy differs", |p| {
            let context = p.spec.as_mut().unwrap().security_context.as_mut().unwrap();
            context.fs_group_change_policy = Some("Always".to_owned())
        }),
    ];
    for (why, edit) in current_only {
        let mut pod = rendered.clone();
        edit(&mut pod);
        assert_eq!(check(&pod), Err(why));
    }

    // A moved Pod: current metadata, the previous release's immutable spec defaults.
    let mut moved = previous.clone();
    moved.metadata = rendered.metadata.clone();
    assert_eq!(check(&moved), Ok(PodShape::Current));
}

/// Issue 15 item 6: every security-relevant field the provider does not render is refused
/// when an admission webhook (or anyone) sets it, each with its own message.
#[test]
fn every_security_relevant_unrendered_field_is_refused() {
    use serde_json::json;
    let (_, revision) = every_revision().remove(0);
    let env = environment(&revision);
    let spec = revision.execution();
    let rendered = serde_json::to_value(executor_pod(&env, spec, "execution-executor")).unwrap();
    let cases: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            "pod shares a host namespace",
            "/spec/hostNetwork",
            json!(true),
        ),
        ("pod shares a host namespace", "/spec/hostPID", json!(true)),
        ("pod shares a host namespace", "/spec/hostIPC", json!(true)),
        (
            "pod shares its process namespace",
            "/spec/shareProcessNamespace",
            json!(true),
        ),
        (
            "pod runs in the host user namespace",
            "/spec/hostUsers",
            json!(true),
        ),
        (
            "pod sets sysctls",
            "/spec/securityContext/sysctls",
            json!([{"name": "kernel.msgmax", "value": "1"}]),
        ),
        (
            "pod adds supplemental groups",
            "/spec/securityContext/supplementalGroups",
            json!([0]),
        ),
        (
            "pod sets SELinux or Windows options",
            "/spec/securityContext/seLinuxOptions",
            json!({"type": "spc_t"}),
        ),
        (
            "pod AppArmor profile differs",
            "/spec/securityContext/appArmorProfile",
            json!({"type": "Unconfined"}),
        ),
        (
            "pod DNS or host aliases differ",
            "/spec/dnsConfig",
            json!({"nameservers": ["1.1.1.1"]}),
        ),
        (
            "pod DNS or host aliases differ",
            "/spec/dnsPolicy",
            json!("Default"),
        ),
        (
            "pod DNS or host aliases differ",
            "/spec/hostAliases",
            json!([{"ip": "10.0.0.1", "hostnames": ["api"]}]),
        ),
        (
            "pod claims devices",
            "/spec/resourceClaims",
            json!([{"name": "gpu"}]),
        ),
        (
            "pod scheduler differs",
            "/spec/schedulerName",
            json!("elsewhere"),
        ),
        (
            "executor container arguments or working directory differ",
            "/spec/containers/0/args",
            json!(["x"]),
        ),
        (
            "executor container arguments or working directory differ",
            "/spec/containers/0/workingDir",
            json!("/"),
        ),
        (
            "executor container environment differs",
            "/spec/containers/0/env",
            json!([{"name": "A", "value": "1"}]),
        ),
        (
            "executor container environment differs",
            "/spec/containers/0/envFrom",
            json!([{"secretRef": {"name": "s"}}]),
        ),
        (
            "executor container exposes ports",
            "/spec/containers/0/ports",
            json!([{"containerPort": 22}]),
        ),
        (
            "executor container has probes or lifecycle hooks",
            "/spec/containers/0/livenessProbe",
            json!({"exec": {"command": ["true"]}}),
        ),
        (
            "executor container has probes or lifecycle hooks",
            "/spec/containers/0/readinessProbe",
            json!({"exec": {"command": ["true"]}}),
        ),
        (
            "executor container has probes or lifecycle hooks",
            "/spec/containers/0/startupProbe",
            json!({"exec": {"command": ["true"]}}),
        ),
        (
            "executor container has probes or lifecycle hooks",
            "/spec/containers/0/lifecycle",
            json!({"postStart": {"exec": {"command": ["true"]}}}),
        ),
        (
            "executor container takes a terminal or stdin",
            "/spec/containers/0/stdin",
            json!(true),
        ),
        (
            "executor container takes a terminal or stdin",
            "/spec/containers/0/tty",
            json!(true),
        ),
        (
            "executor container restart policy differs",
            "/spec/containers/0/restartPolicy",
            json!("Always"),
        ),
        (
            "executor container has volume devices",
            "/spec/containers/0/volumeDevices",
            json!([{"name": "workspace", "devicePath": "/dev/x"}]),
        ),
        (
            "executor volume mounts differ",
            "/spec/containers/0/volumeMounts/0/mountPropagation",
            json!("HostToContainer"),
        ),
        (
            "executor volume mounts differ",
            "/spec/containers/0/volumeMounts/0/subPathExpr",
            json!("$(X)"),
        ),
        (
            "executor seccomp or AppArmor profile differs",
            "/spec/containers/0/securityContext/seccompProfile",
            json!({"type": "Unconfined"}),
        ),
        (
            "executor seccomp or AppArmor profile differs",
            "/spec/containers/0/securityContext/appArmorProfile",
            json!({"type": "Unconfined"}),
        ),
        (
            "executor proc mount differs",
            "/spec/containers/0/securityContext/procMount",
            json!("Unmasked"),
        ),
        (
            "executor group differs",
            "/spec/containers/0/securityContext/runAsGroup",
            json!(0),
        ),
        (
            "executor sets SELinux or Windows options",
            "/spec/containers/0/securityContext/seLinuxOptions",
            json!({"type": "spc_t"}),
        ),
        (
            "executor image pull policy differs",
            "/spec/containers/0/imagePullPolicy",
            json!("Always"),
        ),
    ];
    for (why, pointer, value) in cases {
        let mut pod = rendered.clone();
        set_pointer(&mut pod, pointer, value);
        let pod: Pod = serde_json::from_value(pod).unwrap();
        assert_eq!(
            validate_pod(&env, spec, "execution-executor", &pod),
            Err(why),
            "{pointer}"
        );
    }
}

/// What the API server, the scheduler and admission plugins set on a Pod the provider created
/// is adopted: the provider's own Pod passes its own check after the control plane defaulted it.
#[test]
fn what_the_control_plane_defaults_is_adopted() {
    use serde_json::json;
    let (_, revision) = every_revision().remove(0);
    let env = environment(&revision);
    let spec = revision.execution();
    let mut pod = serde_json::to_value(executor_pod(&env, spec, "execution-executor")).unwrap();
    for (pointer, value) in [
        ("/spec/nodeName", json!("node-1")),
        ("/spec/dnsPolicy", json!("ClusterFirst")),
        ("/spec/schedulerName", json!("default-scheduler")),
        ("/spec/priority", json!(0)),
        ("/spec/preemptionPolicy", json!("PreemptLowerPriority")),
        ("/spec/overhead", json!({"memory": "10Mi"})),
        ("/spec/hostUsers", json!(false)),
        (
            "/spec/containers/0/terminationMessagePath",
            json!("/dev/termination-log"),
        ),
        ("/spec/containers/0/terminationMessagePolicy", json!("File")),
        (
            "/spec/containers/0/securityContext/procMount",
            json!("Default"),
        ),
        (
            "/spec/securityContext/supplementalGroupsPolicy",
            json!("Merge"),
        ),
        (
            "/metadata/uid",
            json!("3f9a0000-0000-4000-8000-000000000002"),
        ),
        ("/metadata/resourceVersion", json!("12")),
        ("/metadata/creationTimestamp", json!("2026-12-01T00:00:00Z")),
    ] {
        set_pointer(&mut pod, pointer, value);
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    assert_eq!(
        validate_pod(&env, spec, "execution-executor", &pod),
        Ok(PodShape::Current)
    );
}

/// Sets the value at a JSON pointer, creating the last member if it is missing.
fn set_pointer(value: &mut serde_json::Value, pointer: &str, new: serde_json::Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = value.pointer_mut(parent).expect(pointer);
    match parent {
        serde_json::Value::Array(items) => items[key.parse::<usize>().unwrap()] = new,
        serde_json::Value::Object(map) => {
            map.insert(key.to_owned(), new);
        }
        _ => panic!("{pointer}: not a container"),
    }
}
