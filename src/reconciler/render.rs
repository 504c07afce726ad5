//! The exact shapes of an environment's workspace PVC and hardened executor Pod, rendered from
//! the resource and its template revision.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, LocalObjectReference, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Toleration as K8sToleration, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::ObjectMeta;

use crate::kube::crd::{
    EXECUTOR_FINALIZER, ExecutionEnvironment, LABEL_ALLOCATION_UID, LABEL_ENVIRONMENT,
    LABEL_REVISION, LABEL_TEMPLATE_ID, pod_name, pvc_name, template_label,
};
use crate::templates::ExecutionSpec;

/// The UID, GID and fsGroup the executor runs as.
pub const EXECUTOR_UID: i64 = 65532;
/// The executor container's main process: the helper's supervisor (docs/commands.md §2), PID 1
/// of the Pod, on `/workspace` and the abstract socket `@mecatl-supervisor`. Per-call helpers
/// (`pods/exec`) reach it through the relay.
pub const EXECUTOR_COMMAND: [&str; 2] =
    [crate::executor::pod_exec::HELPER_IN_IMAGE_PATH, "supervise"];
/// The main process of executors of earlier releases: an idle shell, no supervisor. Such a Pod
/// is still adopted (one-shot helper calls work on it) and replaced by the reconciler as soon as
/// its environment is idle (`super::upgrade`).
pub const LEGACY_EXECUTOR_COMMAND: [&str; 3] =
    ["/bin/sh", "-c", "trap : TERM INT; sleep infinity & wait"];
/// The Pod's termination grace: the same 30 s the lifecycle's own deletes give it, stated so
/// that no cluster default changes it.
pub const EXECUTOR_TERMINATION_GRACE_SECONDS: i64 = 30;
/// Volume ownership is changed only when the workspace root does not already match the
/// fsGroup, so a large workspace is not walked and chowned on every start.
pub const FS_GROUP_CHANGE_POLICY: &str = "OnRootMismatch";
/// Where the workspace is mounted.
pub const WORKSPACE_MOUNT: &str = "/workspace";
/// Tolerations appended unless configured with effect NoExecute.
const DEFAULT_TOLERATION_KEYS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

fn name_of(env: &ExecutionEnvironment) -> String {
    env.metadata.name.clone().unwrap_or_default()
}

/// The workspace PVC: retained (no owner reference), RWO, filesystem, template class and size.
pub fn workspace_pvc(env: &ExecutionEnvironment, spec: &ExecutionSpec) -> PersistentVolumeClaim {
    let name = name_of(env);
    let labels = BTreeMap::from([
        (LABEL_ENVIRONMENT.to_owned(), name.clone()),
        (LABEL_REVISION.to_owned(), env.spec.revision.clone()),
        (
            LABEL_ALLOCATION_UID.to_owned(),
            env.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(pvc_name(&name)),
            namespace: env.metadata.namespace.clone(),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(spec.storage_class().to_owned()),
            volume_mode: Some("Filesystem".to_owned()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(spec.storage_size().as_str().to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// The hardened executor Pod of k8s-executor §2.5.
///
/// It names its environment by labels (environment, template id and the environment's UID as
/// allocation-uid, like the PVC) and has **no owner reference**: the garbage collector must
/// never delete it, which it would do first under
/// `kubectl delete executionenvironment X --cascade=foreground`. Only the provider's own
/// lifecycle deletes the executor, after its termination proof.
pub fn executor_pod(
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    service_account: &str,
) -> Pod {
    let name = name_of(env);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name)),
            namespace: env.metadata.namespace.clone(),
            labels: Some(executor_labels(env)),
            finalizers: Some(vec![EXECUTOR_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec(&name, spec, service_account)),
        status: None,
    }
}

/// The labels of the executor Pod: environment, template id and allocation-uid.
pub fn executor_labels(env: &ExecutionEnvironment) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_ENVIRONMENT.to_owned(), name_of(env)),
        (
            LABEL_TEMPLATE_ID.to_owned(),
            template_label(&env.spec.template_id),
        ),
        (
            LABEL_ALLOCATION_UID.to_owned(),
            env.metadata.uid.clone().unwrap_or_default(),
        ),
    ])
}

fn pod_spec(name: &str, spec: &ExecutionSpec, service_account: &str) -> PodSpec {
    let pull_secrets: Vec<_> = spec
        .image_pull_secrets()
        .iter()
        .map(|s| LocalObjectReference { name: s.clone() })
        .collect();
    let node_selector = spec.node_selector().clone();
    PodSpec {
        service_account_name: Some(service_account.to_owned()),
        automount_service_account_token: Some(false),
        image_pull_secrets: (!pull_secrets.is_empty()).then_some(pull_secrets),
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        tolerations: Some(tolerations(spec)),
        runtime_class_name: Some(spec.runtime_class_name().to_owned()),
        restart_policy: Some("Never".to_owned()),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(EXECUTOR_TERMINATION_GRACE_SECONDS),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(EXECUTOR_UID),
            run_as_group: Some(EXECUTOR_UID),
            fs_group: Some(EXECUTOR_UID),
            fs_group_change_policy: Some(FS_GROUP_CHANGE_POLICY.to_owned()),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![executor_container(spec)],
        volumes: Some(vec![
            Volume {
                name: "workspace".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc_name(name),
                    read_only: None,
                }),
                ..Volume::default()
            },
            Volume {
                name: "tmp".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: None,
                    size_limit: Some(Quantity(spec.tmp_size_limit().as_str().to_owned())),
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    }
}

fn executor_container(spec: &ExecutionSpec) -> Container {
    let quantities = |cpu: &str, memory: &str, ephemeral: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
            (
                "ephemeral-storage".to_owned(),
                Quantity(ephemeral.to_owned()),
            ),
        ])
    };
    Container {
        name: "executor".to_owned(),
        image: Some(spec.image().to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(EXECUTOR_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(EXECUTOR_UID),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(
                spec.cpu_request().as_str(),
                spec.memory_request().as_str(),
                spec.ephemeral_storage_request().as_str(),
            )),
            limits: Some(quantities(
                spec.cpu_limit().as_str(),
                spec.memory_limit().as_str(),
                spec.ephemeral_storage_limit().as_str(),
            )),
            ..ResourceRequirements::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "workspace".to_owned(),
                mount_path: WORKSPACE_MOUNT.to_owned(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "tmp".to_owned(),
                mount_path: "/tmp".to_owned(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    }
}

/// The template's tolerations plus the default NoExecute suffix.
fn tolerations(spec: &ExecutionSpec) -> Vec<K8sToleration> {
    let mut list: Vec<K8sToleration> = spec
        .tolerations()
        .iter()
        .map(|t| K8sToleration {
            key: (!t.key.is_empty()).then(|| t.key.clone()),
            operator: Some(t.operator.as_str().to_owned()),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.map(|e| e.as_str().to_owned()),
            toleration_seconds: t.toleration_seconds,
        })
        .collect();
    for key in DEFAULT_TOLERATION_KEYS {
        let configured = list
            .iter()
            .any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some("NoExecute"));
        if !configured {
            list.push(K8sToleration {
                key: Some(key.to_owned()),
                operator: Some("Exists".to_owned()),
                value: None,
                effect: Some("NoExecute".to_owned()),
                toleration_seconds: Some(300),
            });
        }
    }
    list
}
