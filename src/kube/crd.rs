//! The `ExecutionEnvironment` custom resource (`executionenvironments.execution.mecatl.dev`,
//! `v1alpha1`): its spec and status types, the CRD with its schema constraints and immutability
//! rules, the names, labels and finalizers of everything that belongs to an environment, and the
//! CRD rendered as YAML for the Helm chart.
//!
//! The spec is written once by the store at creation; the CRD rejects any later change to a
//! field that was present (CEL transition rules), except `schemaVersion` and `desired`.

mod command_lease;
mod names;
mod status;
mod time;

use kube::{CustomResource, CustomResourceExt as _, KubeSchema, core::Rule};
use serde::{Deserialize, Serialize};

pub use command_lease::{
    CommandEndReason, CommandEndState, CommandLease, CommandLeaseState, CommandOutcome,
    MAX_COMMAND_LEASES, MAX_RUNNING_COMMANDS,
};
pub use names::{
    ENVIRONMENT_NAME_PREFIX, MAX_OBJECT_NAME_BYTES, POD_NAME_PREFIX, PVC_NAME_PREFIX, ledger_key,
    ledger_slots_key, pod_name, pvc_name, template_label,
};
pub use status::{
    ActiveOperation, ActiveRun, ConditionStatus, EnvironmentCondition, ExecutionEnvironmentStatus,
    FenceState, LastReplacement, LifecycleOperation, LifecyclePhase, LifecycleType, ObjectIdentity,
    RecoveredOperation, ReferenceRecord, ReferenceState, RenewReceipt, RevocationReceipt,
    TerminalPodPhase, TerminationProof, condition,
};
pub use time::{RfcTime, RfcTimeError};

/// API group of the resource.
pub const GROUP: &str = "execution.mecatl.dev";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "ExecutionEnvironment";
/// Plural resource name.
pub const PLURAL: &str = "executionenvironments";
/// Short name for `kubectl`.
pub const SHORT_NAME: &str = "execenv";
/// Name of the CRD object.
pub const CRD_NAME: &str = "executionenvironments.execution.mecatl.dev";

/// The only data-model version served, in both spec and status.
pub const SCHEMA_VERSION: i64 = 2;

/// Finalizer on the resource: the workspace is kept until an exact admin delete releases it.
pub const ENVIRONMENT_FINALIZER: &str = "execution.mecatl.dev/retain-workspace";
/// Finalizer on the executor Pod: removed only once its termination is proven.
pub const EXECUTOR_FINALIZER: &str = "execution.mecatl.dev/verify-termination";

/// Label on the Pod and PVC naming the environment (the resource name).
pub const LABEL_ENVIRONMENT: &str = "execution.mecatl.dev/environment";
/// Pod label carrying [`template_label`] of the template id.
pub const LABEL_TEMPLATE_ID: &str = "execution.mecatl.dev/template-id";
/// PVC label carrying the environment's `spec.revision`.
pub const LABEL_REVISION: &str = "execution.mecatl.dev/revision";
/// PVC label carrying the environment's `metadata.uid`.
pub const LABEL_ALLOCATION_UID: &str = "execution.mecatl.dev/allocation-uid";

/// The capacity-ledger ConfigMap (fixed name, created by the chart or by `dev`); also shard 0
/// of the sharded ledger ([`ledger_shard_name`]).
pub const LEDGER_CONFIGMAP_NAME: &str = "mecatl-execution-profile-allocations";

/// How many ConfigMaps the capacity ledger spans: the root [`LEDGER_CONFIGMAP_NAME`] (shard 0)
/// and `LEDGER_CONFIGMAP_NAME-1` … `-15`, all created by the chart or by `dev`.
pub const LEDGER_SHARDS: usize = 16;

/// The name of ledger shard `index` (0 is the root ConfigMap).
#[must_use]
pub fn ledger_shard_name(index: usize) -> String {
    if index == 0 {
        LEDGER_CONFIGMAP_NAME.to_owned()
    } else {
        format!("{LEDGER_CONFIGMAP_NAME}-{index}")
    }
}

/// Helm keeps the CRD (and so every environment) when the release is uninstalled.
pub const HELM_RESOURCE_POLICY_ANNOTATION: &str = "helm.sh/resource-policy";

/// What the environment should be. The store always writes `Active`; retirement goes through
/// the exact admin operation, and the reconciler refuses `Retiring` written directly.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Desired {
    #[default]
    Active,
    Retiring,
}

/// Resources of the executor container, as Kubernetes quantities.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorResources {
    #[schemars(length(min = 1))]
    pub cpu_request: String,
    #[schemars(length(min = 1))]
    pub memory_request: String,
    #[schemars(length(min = 1))]
    pub cpu_limit: String,
    #[schemars(length(min = 1))]
    pub memory_limit: String,
}

/// A CEL transition rule: once the old spec has `field`, the new spec must keep it unchanged.
fn immutable(field: &str, message: &str) -> Rule {
    Rule::new(format!(
        "!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"
    ))
    .message(message)
}

/// An isolated, persistent sandbox for one (client, owner, binding): who it belongs to, which
/// exact template revision it runs, and audit copies of the Pod and PVC shape.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "execution.mecatl.dev",
    version = "v1alpha1",
    kind = "ExecutionEnvironment",
    plural = "executionenvironments",
    shortname = "execenv",
    namespaced,
    status = "ExecutionEnvironmentStatus",
    derive = "PartialEq",
    doc = "An isolated, persistent execution environment: an executor Pod and a retained workspace PVC.",
    annotation("helm.sh/resource-policy", "keep")
)]
// Printer columns (DECISIONS 17). Sibling columns repeat `type_ = "string"`, which clippy
// mistakes for a duplicated attribute.
#[kube(printcolumn(
    name = "Phase",
    type_ = "string",
    description = "Reason of the Ready condition",
    json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
))]
#[kube(printcolumn(
    name = "Ready",
    type_ = "string",
    description = "Status of the Ready condition",
    json_path = ".status.conditions[?(@.type==\"Ready\")].status"
))]
#[kube(printcolumn(
    name = "Epoch",
    type_ = "integer",
    description = "Execution epoch",
    json_path = ".status.epoch"
))]
#[kube(printcolumn(
    name = "Age",
    type_ = "date",
    json_path = ".metadata.creationTimestamp"
))]
#[x_kube(validation = immutable("allocationID", "allocationID is immutable"))]
#[x_kube(validation = immutable("revision", "revision is immutable"))]
#[x_kube(validation = immutable("ownerHash", "ownerHash is immutable"))]
#[x_kube(validation = immutable("ownerIssuer", "ownerIssuer is immutable"))]
#[x_kube(validation = immutable("ownerSubject", "ownerSubject is immutable"))]
#[x_kube(validation = immutable("clientHash", "clientHash is immutable"))]
#[x_kube(validation = immutable("bindingID", "bindingID is immutable"))]
#[x_kube(validation = immutable("requestFingerprint", "requestFingerprint is immutable"))]
#[x_kube(validation = immutable("templateRevision", "templateRevision is immutable"))]
#[x_kube(validation = immutable("templateDigest", "templateDigest is immutable"))]
#[x_kube(validation = immutable("templateID", "templateID is immutable"))]
#[x_kube(validation = immutable("image", "image is immutable"))]
#[x_kube(validation = immutable("storageClass", "storageClass is immutable"))]
#[x_kube(validation = immutable("storageSize", "storageSize is immutable"))]
#[x_kube(validation = immutable("resources", "resources are immutable"))]
#[x_kube(validation = immutable("createDeadline", "createDeadline is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ExecutionEnvironmentSpec {
    /// Data-model version; only 2 is served.
    #[schemars(extend("enum" = [2]))]
    pub schema_version: i64,
    /// Equals the resource name.
    #[serde(rename = "allocationID")]
    #[schemars(length(min = 1, max = 63))]
    pub allocation_id: String,
    /// Random incarnation id (`EnvironmentRef.revision`), fixed at creation.
    #[schemars(length(min = 1, max = 64))]
    pub revision: String,
    /// Hex SHA-256 of `issuer NUL subject` of the attested owner.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub owner_hash: String,
    /// Raw attested owner issuer, for client-scoped intent recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub owner_issuer: Option<String>,
    /// Raw attested owner subject, for client-scoped intent recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub owner_subject: Option<String>,
    /// Hex SHA-256 of the creating client's canonical URI.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub client_hash: String,
    /// The creating binding.
    #[serde(rename = "bindingID")]
    #[schemars(length(min = 1, max = 253))]
    pub binding_id: String,
    /// Fingerprint of the creating request; a different repeat is a conflict.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub request_fingerprint: String,
    /// Execution template id (a DNS-1123 label).
    #[serde(rename = "templateID")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub template_id: String,
    /// Exact template revision.
    #[schemars(regex(pattern = r"^v1-[0-9a-f]{64}$"))]
    pub template_revision: String,
    /// Digest of the revision's execution definition.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub template_digest: String,
    /// Digest-pinned executor image (audit copy).
    #[schemars(regex(pattern = r"@sha256:[0-9a-fA-F]{64}$"))]
    pub image: String,
    /// Storage class of the workspace PVC (audit copy).
    #[schemars(length(min = 1))]
    pub storage_class: String,
    /// Requested size of the workspace PVC (audit copy).
    #[schemars(length(min = 1))]
    pub storage_size: String,
    /// Executor container resources (audit copy).
    pub resources: ExecutorResources,
    /// What the environment should be.
    pub desired: Desired,
    /// The instant after which this create is void (docs/store.md, "The capacity ledger"):
    /// an object whose `metadata.creationTimestamp` is later than this landed late, after its
    /// capacity slot may have been reclaimed; it is never served and the reconciler removes
    /// it. Absent on environments created before the field existed (never void).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_deadline: Option<RfcTime>,
}

/// The CRD as YAML, as shipped in the Helm chart's `crds/` folder.
#[must_use]
pub fn crd_yaml() -> String {
    serde_saphyr::to_string(&ExecutionEnvironment::crd()).expect("the CRD serializes to YAML")
}

#[cfg(test)]
mod tests;
