//! The execution part of a template revision: [`ProfileSpec`] as written in YAML, and
//! [`ExecutionSpec`], the same data once every rule of k8s-executor §3.1 holds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use super::duration::parse_go_duration_millis;
use super::names::{is_dns1123_subdomain, is_label_value, is_qualified_name};
use super::quantity::Quantity;
use super::toleration::{Toleration, TolerationSpec, validate_tolerations};

/// Most image pull secrets per revision.
pub const MAX_IMAGE_PULL_SECRETS: usize = 8;
/// Most nodeSelector entries per revision.
pub const MAX_NODE_SELECTOR_ENTRIES: usize = 32;
/// Largest `maxFileBytes` (5 MiB).
pub const MAX_FILE_BYTES: i64 = 5 * 1024 * 1024;
/// Largest `maxCommandBytes` (1 MiB).
pub const MAX_COMMAND_BYTES: i64 = 1024 * 1024;
/// Largest `maxCommandDuration`, in milliseconds (30 minutes).
pub const MAX_COMMAND_DURATION_MILLIS: i64 = 30 * 60 * 1000;
/// Largest `maxEnvironments`.
pub const MAX_ENVIRONMENTS: i64 = 10_000;

/// One execution definition exactly as written under `execution:` (strict: unknown keys are
/// refused). Not yet validated; see [`ProfileSpec::validate`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileSpec {
    /// Digest-pinned image reference.
    pub image: String,
    /// StorageClass of the workspace PVC.
    pub storage_class: String,
    /// Size of the workspace PVC (a quantity).
    pub storage_size: String,
    /// CPU request (a quantity).
    pub cpu_request: String,
    /// Memory request (a quantity).
    pub memory_request: String,
    /// CPU limit (a quantity).
    pub cpu_limit: String,
    /// Memory limit (a quantity).
    pub memory_limit: String,
    /// Ephemeral-storage request (a quantity).
    pub ephemeral_storage_request: String,
    /// Ephemeral-storage limit (a quantity).
    pub ephemeral_storage_limit: String,
    /// Size limit of the `/tmp` emptyDir (a quantity).
    pub tmp_size_limit: String,
    /// RuntimeClass of the executor Pod.
    pub runtime_class_name: String,
    /// Image pull secrets, in order.
    #[serde(default)]
    pub image_pull_secrets: Option<Vec<String>>,
    /// Node selector.
    #[serde(default)]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations, in order.
    #[serde(default)]
    pub tolerations: Option<Vec<TolerationSpec>>,
    /// Largest file payload per operation.
    pub max_file_bytes: i64,
    /// Largest command text and combined output.
    pub max_command_bytes: i64,
    /// Longest command, as a Go duration string.
    pub max_command_duration: String,
    /// Most environments of this template (pooled across its revisions).
    pub max_environments: i64,
    /// Whether a fenced environment whose executor cannot answer is recovered by the provider
    /// itself (`automatic`, the default) or only by an administrator (`manual`).
    #[serde(default)]
    pub recovery: Option<RecoveryMode>,
    /// What the executor may reach on the network: nothing (`none`, the default) or outbound
    /// connections (`outbound`: in `dev` the host's network without the provider's ports; on a
    /// cluster what the chart's egress policy of the template renders).
    #[serde(default)]
    pub network: Option<NetworkMode>,
}

/// The network an executor of a revision gets (docs/sandbox.md, "Network").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NetworkMode {
    /// No network at all (the default).
    #[default]
    None,
    /// Outbound connections; never the provider's own ports.
    Outbound,
}

impl NetworkMode {
    /// The word written in templates files and in the canonical JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Outbound => "outbound",
        }
    }
}

/// How a fenced environment of a revision moves on (docs/operating.md, "Recovery").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecoveryMode {
    /// The reconciler deletes the exact executor Pod, waits for its kubelet-confirmed end,
    /// records that proof and starts a new executor on the same workspace (the default).
    #[default]
    Automatic,
    /// Only the administrator lifecycle moves a fenced environment on.
    Manual,
}

impl RecoveryMode {
    /// The word written in templates files and in the canonical JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Automatic => "automatic",
            Self::Manual => "manual",
        }
    }
}

/// A rule of §3.1 that a [`ProfileSpec`] breaks: the YAML field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SpecError {
    /// The YAML field, e.g. `cpuRequest` or `tolerations[1].operator`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(super) fn refuse<T>(
    field: impl Into<String>,
    reason: impl Into<String>,
) -> Result<T, SpecError> {
    Err(SpecError {
        field: field.into(),
        reason: reason.into(),
    })
}

/// An execution definition that satisfies every rule of k8s-executor §3.1. Built only by
/// [`ProfileSpec::validate`]; quantities keep the text as written and compare by value.
///
/// Empty `imagePullSecrets`, `nodeSelector` and `tolerations` are the same as absent ones:
/// both give an empty list or map here, and the same revision id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionSpec {
    image: String,
    storage_class: String,
    storage_size: Quantity,
    cpu_request: Quantity,
    memory_request: Quantity,
    cpu_limit: Quantity,
    memory_limit: Quantity,
    ephemeral_storage_request: Quantity,
    ephemeral_storage_limit: Quantity,
    tmp_size_limit: Quantity,
    runtime_class_name: String,
    image_pull_secrets: Vec<String>,
    node_selector: BTreeMap<String, String>,
    tolerations: Vec<Toleration>,
    max_file_bytes: u64,
    max_command_bytes: u64,
    max_command_duration_millis: u64,
    max_environments: u32,
    recovery: RecoveryMode,
    network: NetworkMode,
}

impl ProfileSpec {
    /// Checks every rule of §3.1 and returns the validated spec, or the first broken rule.
    pub fn validate(&self) -> Result<ExecutionSpec, SpecError> {
        validate_image(&self.image)?;
        if self.storage_class.is_empty() {
            return refuse("storageClass", "must not be empty");
        }
        let storage_size = positive_quantity("storageSize", &self.storage_size)?;
        let cpu_request = positive_quantity("cpuRequest", &self.cpu_request)?;
        let memory_request = positive_quantity("memoryRequest", &self.memory_request)?;
        let cpu_limit = positive_quantity("cpuLimit", &self.cpu_limit)?;
        let memory_limit = positive_quantity("memoryLimit", &self.memory_limit)?;
        let ephemeral_storage_request =
            positive_quantity("ephemeralStorageRequest", &self.ephemeral_storage_request)?;
        let ephemeral_storage_limit =
            positive_quantity("ephemeralStorageLimit", &self.ephemeral_storage_limit)?;
        let tmp_size_limit = positive_quantity("tmpSizeLimit", &self.tmp_size_limit)?;
        request_within_limit("cpuRequest", &cpu_request, "cpuLimit", &cpu_limit)?;
        request_within_limit(
            "memoryRequest",
            &memory_request,
            "memoryLimit",
            &memory_limit,
        )?;
        request_within_limit(
            "ephemeralStorageRequest",
            &ephemeral_storage_request,
            "ephemeralStorageLimit",
            &ephemeral_storage_limit,
        )?;
        request_within_limit(
            "tmpSizeLimit",
            &tmp_size_limit,
            "ephemeralStorageLimit",
            &ephemeral_storage_limit,
        )?;
        if self.runtime_class_name.is_empty() {
            return refuse("runtimeClassName", "must not be empty");
        }
        let image_pull_secrets = validate_pull_secrets(self.image_pull_secrets.as_deref())?;
        let node_selector = validate_node_selector(self.node_selector.as_ref())?;
        let tolerations = validate_tolerations(self.tolerations.as_deref())?;
        let max_file_bytes = bounded("maxFileBytes", self.max_file_bytes, MAX_FILE_BYTES)?;
        let max_command_bytes =
            bounded("maxCommandBytes", self.max_command_bytes, MAX_COMMAND_BYTES)?;
        let max_command_duration_millis = validate_duration(&self.max_command_duration)?;
        let max_environments = bounded("maxEnvironments", self.max_environments, MAX_ENVIRONMENTS)?;
        Ok(ExecutionSpec {
            image: self.image.clone(),
            storage_class: self.storage_class.clone(),
            storage_size,
            cpu_request,
            memory_request,
            cpu_limit,
            memory_limit,
            ephemeral_storage_request,
            ephemeral_storage_limit,
            tmp_size_limit,
            runtime_class_name: self.runtime_class_name.clone(),
            image_pull_secrets,
            node_selector,
            tolerations,
            max_file_bytes,
            max_command_bytes,
            max_command_duration_millis,
            max_environments: u32::try_from(max_environments)
                .expect("maxEnvironments is bounded by 10000"),
            recovery: self.recovery.unwrap_or_default(),
            network: self.network.unwrap_or_default(),
        })
    }
}

/// `^[^\s@]+@sha256:[0-9a-fA-F]{64}$`
fn validate_image(image: &str) -> Result<(), SpecError> {
    let pinned = image.split_once('@').is_some_and(|(name, digest)| {
        !name.is_empty()
            && !name.chars().any(char::is_whitespace)
            && digest
                .strip_prefix("sha256:")
                .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if pinned {
        Ok(())
    } else {
        refuse(
            "image",
            format!("{image:?} must be pinned by digest as <name>@sha256:<64 hex>"),
        )
    }
}

fn positive_quantity(field: &str, text: &str) -> Result<Quantity, SpecError> {
    match Quantity::parse(text) {
        Ok(q) if q.is_positive() => Ok(q),
        Ok(_) => refuse(
            field,
            format!("quantity {text:?} must be greater than zero"),
        ),
        Err(e) => refuse(field, e.to_string()),
    }
}

fn request_within_limit(
    request_field: &str,
    request: &Quantity,
    limit_field: &str,
    limit: &Quantity,
) -> Result<(), SpecError> {
    if request <= limit {
        Ok(())
    } else {
        refuse(
            request_field,
            format!("{request} must not exceed {limit_field} {limit}"),
        )
    }
}

fn validate_pull_secrets(secrets: Option<&[String]>) -> Result<Vec<String>, SpecError> {
    let secrets = secrets.unwrap_or_default();
    if secrets.len() > MAX_IMAGE_PULL_SECRETS {
        return refuse(
            "imagePullSecrets",
            format!("at most {MAX_IMAGE_PULL_SECRETS} entries"),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, name) in secrets.iter().enumerate() {
        if !is_dns1123_subdomain(name) {
            return refuse(
                format!("imagePullSecrets[{i}]"),
                format!("{name:?} must be a DNS-1123 subdomain of DNS-1123 labels"),
            );
        }
        if !seen.insert(name.as_str()) {
            return refuse(
                format!("imagePullSecrets[{i}]"),
                format!("{name:?} is listed twice"),
            );
        }
    }
    Ok(secrets.to_vec())
}

fn validate_node_selector(
    selector: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, SpecError> {
    let Some(selector) = selector else {
        return Ok(BTreeMap::new());
    };
    if selector.len() > MAX_NODE_SELECTOR_ENTRIES {
        return refuse(
            "nodeSelector",
            format!("at most {MAX_NODE_SELECTOR_ENTRIES} entries"),
        );
    }
    for (key, value) in selector {
        if !is_qualified_name(key) {
            return refuse(
                format!("nodeSelector[{key:?}]"),
                "key must be a qualified name",
            );
        }
        if !is_label_value(value) {
            return refuse(
                format!("nodeSelector[{key:?}]"),
                format!("{value:?} is not a valid label value"),
            );
        }
    }
    Ok(selector.clone())
}

fn bounded(field: &str, value: i64, max: i64) -> Result<u64, SpecError> {
    if (1..=max).contains(&value) {
        Ok(u64::try_from(value).expect("value is positive"))
    } else {
        refuse(field, format!("{value} must be between 1 and {max}"))
    }
}

fn validate_duration(text: &str) -> Result<u64, SpecError> {
    let millis = match parse_go_duration_millis(text) {
        Ok(millis) => millis,
        Err(e) => return refuse("maxCommandDuration", e.to_string()),
    };
    if !(1..=MAX_COMMAND_DURATION_MILLIS).contains(&millis) {
        return refuse(
            "maxCommandDuration",
            format!("{text:?} must be greater than zero and at most 30m"),
        );
    }
    Ok(u64::try_from(millis).expect("millis is positive"))
}

impl ExecutionSpec {
    /// The digest-pinned image reference.
    pub fn image(&self) -> &str {
        &self.image
    }
    /// The workspace PVC's StorageClass.
    pub fn storage_class(&self) -> &str {
        &self.storage_class
    }
    /// The workspace PVC's size.
    pub fn storage_size(&self) -> &Quantity {
        &self.storage_size
    }
    /// The CPU request.
    pub fn cpu_request(&self) -> &Quantity {
        &self.cpu_request
    }
    /// The memory request.
    pub fn memory_request(&self) -> &Quantity {
        &self.memory_request
    }
    /// The CPU limit.
    pub fn cpu_limit(&self) -> &Quantity {
        &self.cpu_limit
    }
    /// The memory limit.
    pub fn memory_limit(&self) -> &Quantity {
        &self.memory_limit
    }
    /// The ephemeral-storage request.
    pub fn ephemeral_storage_request(&self) -> &Quantity {
        &self.ephemeral_storage_request
    }
    /// The ephemeral-storage limit.
    pub fn ephemeral_storage_limit(&self) -> &Quantity {
        &self.ephemeral_storage_limit
    }
    /// The `/tmp` emptyDir size limit.
    pub fn tmp_size_limit(&self) -> &Quantity {
        &self.tmp_size_limit
    }
    /// The executor Pod's RuntimeClass.
    pub fn runtime_class_name(&self) -> &str {
        &self.runtime_class_name
    }
    /// Image pull secrets, in order (empty when absent).
    pub fn image_pull_secrets(&self) -> &[String] {
        &self.image_pull_secrets
    }
    /// The node selector (empty when absent).
    pub fn node_selector(&self) -> &BTreeMap<String, String> {
        &self.node_selector
    }
    /// Tolerations, in order (empty when absent).
    pub fn tolerations(&self) -> &[Toleration] {
        &self.tolerations
    }
    /// Largest file payload per operation, in bytes (1..=5 MiB).
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }
    /// Largest command and combined output, in bytes (1..=1 MiB).
    pub fn max_command_bytes(&self) -> u64 {
        self.max_command_bytes
    }
    /// Longest command.
    pub fn max_command_duration(&self) -> Duration {
        Duration::from_millis(self.max_command_duration_millis)
    }
    /// Longest command, in milliseconds (1..=1 800 000).
    pub fn max_command_duration_millis(&self) -> u64 {
        self.max_command_duration_millis
    }
    /// Most environments of the template (1..=10 000).
    pub fn max_environments(&self) -> u32 {
        self.max_environments
    }
    /// How a fenced environment of this revision is recovered.
    pub fn recovery(&self) -> RecoveryMode {
        self.recovery
    }
    /// What an executor of this revision may reach on the network.
    pub fn network(&self) -> NetworkMode {
        self.network
    }
}
