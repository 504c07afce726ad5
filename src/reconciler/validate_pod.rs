//! `validatePod` (k8s-executor §2.5): an existing executor Pod is adopted only when it has
//! exactly the hardened shape the reconciler creates. Each check fails closed with its own
//! message; quantities compare by value (DECISIONS 14).
//!
//! Two shapes are adopted: the [`PodShape::Current`] one [`render`] creates, and the
//! [`PodShape::Previous`] one of the release before it (a controller owner reference instead
//! of the allocation-uid label, and no explicit service links, fsGroup change policy or
//! termination grace). A previous-shape Pod keeps serving; the reconciler moves its metadata
//! to the current shape (see `pod::move_to_current_shape`), and the three spec fields, which
//! cannot change on a Pod, arrive with the environment's next Pod: until then they are
//! accepted either all as rendered or all as the API server defaulted them.
//!
//! The container command is the supervisor ([`render::EXECUTOR_COMMAND`]) or, for a Pod of an
//! earlier release, the idle shell ([`render::LEGACY_EXECUTOR_COMMAND`]); a command cannot
//! change on a Pod, so the reconciler replaces such a Pod once its environment is idle
//! ([`runs_supervisor`], `super::upgrade`). Anything else is refused.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

#[path = "validate_pod_unrendered.rs"]
mod unrendered;

use super::pvc::same_quantity;
use super::render;
use crate::kube::crd::{
    EXECUTOR_FINALIZER, ExecutionEnvironment, GROUP, KIND, LABEL_ALLOCATION_UID, VERSION,
};
use crate::templates::{ExecutionSpec, Quantity};

/// The longest default toleration a cluster may set on the not-ready/unreachable suffix.
const MAX_SUFFIX_SECONDS: i64 = 86_400;

/// Which release's shape an adopted executor Pod has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodShape {
    /// What this release renders.
    Current,
    /// What the release before it rendered; its metadata is moved to the current shape.
    Previous,
}

/// Whether `pod` is exactly the environment's executor (in the current or the previous
/// shape); the error names the first mismatch.
pub fn validate_pod(
    env: &ExecutionEnvironment,
    spec: &ExecutionSpec,
    service_account: &str,
    pod: &Pod,
) -> Result<PodShape, &'static str> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("pod is terminating");
    }
    let expected = render::executor_pod(env, spec, service_account);
    let shape = validate_metadata(env, &expected, pod)?;
    let (Some(actual), Some(wanted)) = (pod.spec.as_ref(), expected.spec.as_ref()) else {
        return Err("pod has no spec");
    };
    validate_identity(spec, service_account, actual)?;
    validate_scheduling(spec, actual, wanted)?;
    validate_runtime(actual, wanted)?;
    validate_since_previous(actual, wanted)?;
    validate_container(spec, &actual.containers[0], &wanted.containers[0])?;
    validate_volumes(spec, actual, wanted)?;
    unrendered::validate_pod_fields(actual)?;
    unrendered::validate_container_fields(&actual.containers[0])?;
    Ok(shape)
}

fn validate_metadata(
    env: &ExecutionEnvironment,
    expected: &Pod,
    pod: &Pod,
) -> Result<PodShape, &'static str> {
    let recorded = env.status.as_ref().and_then(|s| s.pod.as_ref());
    if recorded.is_some_and(|r| Some(&r.uid) != pod.metadata.uid.as_ref()) {
        return Err("pod UID differs from the recorded one");
    }
    if pod.metadata.finalizers.as_deref() != Some(&[EXECUTOR_FINALIZER.to_owned()][..]) {
        return Err("pod finalizers differ");
    }
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let env_uid = env.metadata.uid.as_deref().unwrap_or_default();
    if env_uid.is_empty() {
        return Err("environment has no UID");
    }
    if owners.is_empty() {
        if pod.metadata.labels != expected.metadata.labels {
            return Err("pod labels differ");
        }
        return Ok(PodShape::Current);
    }
    let mut previous_labels = expected.metadata.labels.clone().unwrap_or_default();
    previous_labels.remove(LABEL_ALLOCATION_UID);
    if pod.metadata.labels.as_ref() != Some(&previous_labels) {
        return Err("pod labels differ");
    }
    let [owner] = owners else {
        return Err("pod must have at most one owner reference");
    };
    if owner.api_version != format!("{GROUP}/{VERSION}")
        || owner.kind != KIND
        || Some(&owner.name) != env.metadata.name.as_ref()
        || owner.uid != env_uid
        || owner.controller != Some(true)
    {
        return Err("pod owner reference is not this environment");
    }
    Ok(PodShape::Previous)
}

/// The spec fields the current shape renders and the previous one left to the API server:
/// either all three as rendered, or all three as the API server defaulted them for a Pod of
/// the previous release (immutable, so a moved Pod keeps them until it is replaced).
fn validate_since_previous(pod: &PodSpec, wanted: &PodSpec) -> Result<(), &'static str> {
    let previous_defaults = matches!(pod.enable_service_links, None | Some(true))
        && matches!(pod.termination_grace_period_seconds, None | Some(30))
        && pod
            .security_context
            .as_ref()
            .is_none_or(|c| c.fs_group_change_policy.is_none());
    if previous_defaults {
        return Ok(());
    }
    if pod.enable_service_links != Some(false) {
        return Err("pod enables service links");
    }
    if pod.termination_grace_period_seconds != wanted.termination_grace_period_seconds {
        return Err("pod termination grace differs");
    }
    let policy = pod
        .security_context
        .as_ref()
        .and_then(|c| c.fs_group_change_policy.as_deref());
    if policy != Some(render::FS_GROUP_CHANGE_POLICY) {
        return Err("pod fsGroup change policy differs");
    }
    Ok(())
}

fn validate_identity(
    spec: &ExecutionSpec,
    account: &str,
    pod: &PodSpec,
) -> Result<(), &'static str> {
    if account.is_empty()
        || account == "default"
        || pod.service_account_name.as_deref() != Some(account)
    {
        return Err("pod service account differs");
    }
    let secrets: Vec<&str> = pod
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    let wanted: Vec<&str> = spec
        .image_pull_secrets()
        .iter()
        .map(String::as_str)
        .collect();
    if secrets != wanted {
        return Err("pod image pull secrets differ");
    }
    if pod.automount_service_account_token != Some(false) {
        return Err("pod may mount a service account token");
    }
    Ok(())
}

fn validate_scheduling(
    spec: &ExecutionSpec,
    pod: &PodSpec,
    wanted: &PodSpec,
) -> Result<(), &'static str> {
    let selector = pod.node_selector.clone().unwrap_or_default();
    if &selector != spec.node_selector() {
        return Err("pod node selector differs");
    }
    if pod.affinity.is_some() {
        return Err("pod has an affinity");
    }
    let actual = pod.tolerations.as_deref().unwrap_or_default();
    let expected = wanted.tolerations.as_deref().unwrap_or_default();
    let configured = &expected[..spec.tolerations().len()];
    if !tolerations_acceptable(actual, expected, configured) {
        return Err("pod tolerations differ");
    }
    Ok(())
}

/// The expected list, the configured list alone (a Pod made before the suffix existed), or
/// the configured list followed by suffix entries whose duration the cluster set.
fn tolerations_acceptable(
    actual: &[Toleration],
    expected: &[Toleration],
    configured: &[Toleration],
) -> bool {
    if actual == expected || actual == configured {
        return true;
    }
    actual.len() == expected.len()
        && actual[..configured.len()] == *configured
        && actual[configured.len()..]
            .iter()
            .zip(&expected[configured.len()..])
            .all(|(a, e)| {
                a.key == e.key
                    && a.operator.as_deref() == Some("Exists")
                    && a.value.as_deref().unwrap_or_default().is_empty()
                    && a.effect.as_deref() == Some("NoExecute")
                    && a.toleration_seconds
                        .is_some_and(|s| (0..=MAX_SUFFIX_SECONDS).contains(&s))
            })
}

fn validate_runtime(pod: &PodSpec, wanted: &PodSpec) -> Result<(), &'static str> {
    if pod.restart_policy.as_deref() != Some("Never") {
        return Err("pod restart policy is not Never");
    }
    if pod.runtime_class_name.is_none() || pod.runtime_class_name != wanted.runtime_class_name {
        return Err("pod runtime class differs");
    }
    if pod.containers.len() != 1
        || pod.init_containers.as_ref().is_some_and(|c| !c.is_empty())
        || pod
            .ephemeral_containers
            .as_ref()
            .is_some_and(|c| !c.is_empty())
    {
        return Err("pod must have exactly the executor container");
    }
    if pod.volumes.as_ref().map_or(0, Vec::len) != 2 {
        return Err("pod must have exactly two volumes");
    }
    let context = pod.security_context.clone().unwrap_or_default();
    let wanted_context = wanted.security_context.clone().unwrap_or_default();
    if context.run_as_non_root != Some(true)
        || context.run_as_user != wanted_context.run_as_user
        || context.run_as_group != wanted_context.run_as_group
        || context.fs_group != wanted_context.fs_group
        || context.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault")
    {
        return Err("pod security context differs");
    }
    Ok(())
}

fn validate_container(
    spec: &ExecutionSpec,
    actual: &Container,
    wanted: &Container,
) -> Result<(), &'static str> {
    if actual.name != wanted.name
        || actual.image != wanted.image
        || (actual.command != wanted.command && !runs_legacy_command(actual))
    {
        return Err("executor container name, image or command differs");
    }
    if actual.image_pull_policy != wanted.image_pull_policy {
        return Err("executor image pull policy differs");
    }
    let mounts = actual.volume_mounts.as_deref().unwrap_or_default();
    let wanted_mounts = wanted.volume_mounts.as_deref().unwrap_or_default();
    let same_mounts = mounts.len() == wanted_mounts.len()
        && mounts.iter().zip(wanted_mounts).all(|(a, w)| {
            a.name == w.name
                && a.mount_path == w.mount_path
                && !a.read_only.unwrap_or(false)
                && a.sub_path.as_deref().unwrap_or_default().is_empty()
        });
    if !same_mounts {
        return Err("executor volume mounts differ");
    }
    let context = actual.security_context.clone().unwrap_or_default();
    let drop = context
        .capabilities
        .as_ref()
        .and_then(|c| c.drop.as_deref());
    let adds = context
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_some_and(|a| !a.is_empty());
    if context.allow_privilege_escalation != Some(false)
        || context.read_only_root_filesystem != Some(true)
        || context.run_as_non_root != Some(true)
        || context.run_as_user != Some(render::EXECUTOR_UID)
        || context.privileged == Some(true)
        || drop != Some(&["ALL".to_owned()][..])
        || adds
    {
        return Err("executor security context differs");
    }
    let resources = actual.resources.clone().unwrap_or_default();
    let requests = [
        spec.cpu_request(),
        spec.memory_request(),
        spec.ephemeral_storage_request(),
    ];
    let limits = [
        spec.cpu_limit(),
        spec.memory_limit(),
        spec.ephemeral_storage_limit(),
    ];
    if !same_resources(resources.requests.as_ref(), requests)
        || !same_resources(resources.limits.as_ref(), limits)
    {
        return Err("executor resources differ");
    }
    Ok(())
}

fn runs_legacy_command(container: &Container) -> bool {
    container.command.as_deref().is_some_and(|c| {
        c.iter()
            .map(String::as_str)
            .eq(render::LEGACY_EXECUTOR_COMMAND)
    })
}

/// Whether an adopted executor Pod's main process is the supervisor; false for the idle shell
/// of earlier releases (which [`validate_pod`] still adopts).
pub fn runs_supervisor(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .is_some_and(|c| !runs_legacy_command(c))
}

/// Exactly {cpu, memory, ephemeral-storage}, each equal by value.
fn same_resources(actual: Option<&BTreeMap<String, K8sQuantity>>, wanted: [&Quantity; 3]) -> bool {
    let Some(actual) = actual else { return false };
    let keys = ["cpu", "memory", "ephemeral-storage"];
    actual.len() == keys.len()
        && keys
            .iter()
            .zip(wanted)
            .all(|(key, want)| actual.get(*key).is_some_and(|q| same_quantity(q, want)))
}

fn validate_volumes(
    spec: &ExecutionSpec,
    pod: &PodSpec,
    wanted: &PodSpec,
) -> Result<(), &'static str> {
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    let wanted_volumes = wanted.volumes.as_deref().unwrap_or_default();
    let workspace = &volumes[0];
    let claim = workspace.persistent_volume_claim.as_ref();
    let wanted_claim = wanted_volumes[0].persistent_volume_claim.as_ref();
    if workspace.name != "workspace"
        || claim.map(|c| &c.claim_name) != wanted_claim.map(|c| &c.claim_name)
        || claim.is_some_and(|c| c.read_only == Some(true))
    {
        return Err("workspace volume differs");
    }
    let tmp = &volumes[1];
    let size = tmp.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref());
    if tmp.name != "tmp"
        || tmp.persistent_volume_claim.is_some()
        || !size.is_some_and(|s| same_quantity(s, spec.tmp_size_limit()))
    {
        return Err("tmp volume differs");
    }
    Ok(())
}
