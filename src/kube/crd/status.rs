//! `status` of an `ExecutionEnvironment`: every piece of durable authority (run claim, grant
//! generation, references, the in-flight operation lease, the admin lifecycle) and what the
//! reconciler observed. Every field is optional; writes are compare-and-swap on
//! `resourceVersion`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::RfcTime;

/// The observed and authoritative state of an environment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionEnvironmentStatus {
    /// Data-model version of the status; only 2 is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = [2]))]
    pub schema_version: Option<i64>,

    /// The `metadata.generation` the reconciler last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Execution epoch: 1 at creation, +1 on every new run claim, executor replacement and
    /// migration. Work issued under an older epoch is stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub epoch: Option<u64>,

    /// Revocation counter: 1 at creation, +1 only by `RevokeEnvironment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub grant_generation: Option<u64>,

    /// Whether a dispatched operation might still be running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_state: Option<FenceState>,

    /// Idempotency ledger of `RevokeEnvironment`, newest 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub revocation_receipts: Vec<RevocationReceipt>,

    /// Binding references, at most one per binding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["bindingID"])
    )]
    pub references: Vec<ReferenceRecord>,

    /// The workspace PVC the reconciler recorded as authoritative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<ObjectIdentity>,

    /// The executor Pod the reconciler recorded as authoritative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectIdentity>,

    /// The single run claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<ActiveRun>,

    /// Idempotency ledger of `RenewRun`, newest 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub renew_receipts: Vec<RenewReceipt>,

    /// The single in-flight executor operation and its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_operation: Option<ActiveOperation>,

    /// Command leases of supervised commands (docs/commands.md §5.1): at most 32, unique by
    /// id, at most 16 not ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"])
    )]
    pub commands: Vec<super::CommandLease>,

    /// The admitted administrator lifecycle operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_operation: Option<LifecycleOperation>,

    /// Durable evidence that an exact executor Pod reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_proof: Option<TerminationProof>,

    /// Completion receipt of the last `ReplaceExecutor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replacement: Option<LastReplacement>,

    /// The outcome of the last operation whose holder was gone and whose end the executor's
    /// supervisor reported (the recovery issue, item 1): recorded when the reconciler cleared
    /// it instead of fencing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_operation: Option<RecoveredOperation>,

    /// `Ready`, `Retired`, `ExecutorTerminated`, `DeletionBlocked`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<EnvironmentCondition>,
}

/// Whether anything dispatched may still be running somewhere.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FenceState {
    /// Nothing is in doubt.
    Healthy,
    /// A dispatched operation may still be running; only the admin lifecycle moves on.
    FenceUnknown,
}

/// Where a binding reference stands in its two-phase life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReferenceState {
    /// Created, awaiting commit or abort.
    PendingCreate,
    /// Committed and usable.
    Published,
    /// Being deleted, awaiting confirm or cancel.
    PendingDelete,
}

/// One binding's reference to the environment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceRecord {
    /// The binding; the key of the list.
    #[serde(rename = "bindingID")]
    #[schemars(length(min = 1, max = 253))]
    pub binding_id: String,
    pub state: ReferenceState,
    /// The operation that last moved this reference.
    #[serde(rename = "operationID")]
    #[schemars(length(min = 1, max = 1024))]
    pub operation_id: String,
    /// The binding this one was reserved to succeed.
    #[serde(
        rename = "sourceBindingID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 253))]
    pub source_binding_id: Option<String>,
    pub created_at: RfcTime,
}

/// Name and UID of a runtime object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ObjectIdentity {
    pub name: String,
    pub uid: String,
}

/// The run claim: environment-wide, exclusive, expiring execution ownership.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveRun {
    #[serde(rename = "bindingID")]
    #[schemars(length(max = 253))]
    pub binding_id: String,
    #[serde(rename = "runID")]
    #[schemars(length(max = 1024))]
    pub run_id: String,
    #[serde(rename = "claimID")]
    #[schemars(length(max = 1024))]
    pub claim_id: String,
    #[serde(rename = "operationID")]
    #[schemars(length(max = 1024))]
    pub operation_id: String,
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub owner_hash: String,
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub client_hash: String,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub epoch: u64,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub grant_generation: u64,
    pub expires_at: RfcTime,
}

/// One `RenewRun` the environment has already applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewReceipt {
    #[serde(rename = "operationID")]
    #[schemars(length(min = 1, max = 1024))]
    pub operation_id: String,
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub fingerprint: String,
    pub expires_at: RfcTime,
}

/// One `RevokeEnvironment` the environment has already applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevocationReceipt {
    #[serde(rename = "operationID")]
    #[schemars(length(min = 1, max = 1024))]
    pub operation_id: String,
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub fingerprint: String,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub expected_grant_generation: u64,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub grant_generation: u64,
}

/// The single in-flight executor operation and the lease its holder renews.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveOperation {
    #[schemars(length(min = 1, max = 1024))]
    pub id: String,
    /// Operation name from the closed vocabulary, e.g. `file.read`.
    #[schemars(length(min = 1, max = 128))]
    pub operation: String,
    pub started_at: RfcTime,
    #[serde(rename = "claimID")]
    #[schemars(length(max = 1024))]
    pub claim_id: String,
    #[serde(rename = "runID")]
    #[schemars(length(max = 1024))]
    pub run_id: String,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub epoch: u64,
    /// The provider replica holding the lease.
    #[serde(rename = "holderID")]
    #[schemars(length(min = 1, max = 1024))]
    pub holder_id: String,
    pub renewed_at: RfcTime,
    pub expires_at: RfcTime,
}

/// Which administrator lifecycle operation is admitted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LifecycleType {
    ReplaceExecutor,
    RetireEnvironment,
    DeleteRetiredEnvironment,
}

/// The reconciler-driven step a lifecycle operation is at.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LifecyclePhase {
    Quiescing,
    WaitingForTermination,
    RemovingPodFinalizer,
    WaitingForPodDeletion,
    CreatingReplacement,
    #[serde(rename = "DeletingPVC")]
    DeletingPvc,
    ReleasingSlot,
}

/// An admitted administrator lifecycle operation, with the exact identities it expects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleOperation {
    #[schemars(length(min = 1, max = 1024))]
    pub id: String,
    #[serde(rename = "type")]
    pub type_: LifecycleType,
    pub phase: LifecyclePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub expected_epoch: Option<u64>,
    #[serde(
        rename = "expectedPodUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 128))]
    pub expected_pod_uid: Option<String>,
    #[serde(
        rename = "expectedPVCUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 128))]
    pub expected_pvc_uid: Option<String>,
    pub created_at: RfcTime,
}

/// The terminal phase a Pod reached.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TerminalPodPhase {
    Succeeded,
    Failed,
}

/// Durable evidence that an exact executor Pod is terminal.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminationProof {
    #[serde(rename = "operationID")]
    #[schemars(length(max = 1024))]
    pub operation_id: String,
    #[serde(rename = "podUID")]
    #[schemars(length(min = 1, max = 128))]
    pub pod_uid: String,
    #[serde(rename = "pvcUID")]
    #[schemars(length(min = 1, max = 128))]
    pub pvc_uid: String,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub epoch: u64,
    pub pod_phase: TerminalPodPhase,
    pub observed_at: RfcTime,
}

/// What the executor's supervisor reported of an operation whose holder was gone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveredOperation {
    /// The operation's id (`activeOperation.id`).
    #[schemars(length(min = 1, max = 1024))]
    pub id: String,
    /// Its name, e.g. `file.write` or `command`.
    #[schemars(length(max = 128))]
    pub operation: String,
    /// The supervisor's wire word: `succeeded`, `failed` or `cancelled`.
    #[schemars(length(min = 1, max = 32))]
    pub state: String,
    /// The supervisor's receipt over the operation's whole answer
    /// (`supervisor_protocol::operation_receipt`).
    #[schemars(length(max = 128))]
    pub terminal_receipt: String,
    /// Whether the reconciler cancelled it (its claim had ended).
    #[serde(default)]
    pub cancelled_by_recovery: bool,
    pub recorded_at: RfcTime,
}

/// Completion receipt of `ReplaceExecutor`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastReplacement {
    #[serde(rename = "operationID")]
    pub operation_id: String,
    #[serde(rename = "previousPodUID")]
    pub previous_pod_uid: String,
    #[serde(rename = "replacementPodUID")]
    pub replacement_pod_uid: String,
    #[serde(rename = "pvcUID")]
    pub pvc_uid: String,
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub previous_epoch: u64,
    #[schemars(range(min = 2), extend("format" = "int64"))]
    pub replacement_epoch: u64,
}

/// The value of a condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition. `lastTransitionTime` has second precision and changes only when `status`
/// flips.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentCondition {
    /// `Ready`, `Retired`, `ExecutorTerminated` or `DeletionBlocked` (see `condition`).
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// Machine-readable reason, e.g. `Reconciled` or `FenceUnknown` (see `condition::reason`).
    pub reason: String,
    #[schemars(length(max = 1024))]
    pub message: String,
    pub observed_generation: i64,
    pub last_transition_time: RfcTime,
}

/// Condition types and reasons the provider writes.
pub mod condition {
    /// The executor Pod and workspace are ready and nothing is in doubt.
    pub const READY: &str = "Ready";
    /// Retirement completed; the workspace is kept.
    pub const RETIRED: &str = "Retired";
    /// The exact executor was proven terminal.
    pub const EXECUTOR_TERMINATED: &str = "ExecutorTerminated";
    /// The resource was deleted without an admitted `DeleteRetiredEnvironment`.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";

    /// Reasons of the `Ready` condition.
    pub mod reason {
        pub const RECONCILED: &str = "Reconciled";
        pub const PVC_UNAVAILABLE: &str = "PVCUnavailable";
        pub const EXECUTOR_UNAVAILABLE: &str = "ExecutorUnavailable";
        pub const INVALID_TEMPLATE: &str = "InvalidTemplate";
        pub const INCOMPATIBLE_SCHEMA: &str = "IncompatibleSchema";
        pub const FENCE_UNKNOWN: &str = "FenceUnknown";
        pub const UNSUPPORTED_RETIREMENT_REQUEST: &str = "UnsupportedRetirementRequest";
        pub const QUIESCING: &str = "Quiescing";
        pub const AWAITING_TERMINAL_EXECUTOR: &str = "AwaitingTerminalExecutor";
        pub const REPLACEMENT_STARTING: &str = "ReplacementStarting";
        pub const REPLACEMENT_READY: &str = "ReplacementReady";
        pub const RETAINED: &str = "Retained";
        /// Reason of `Retired=True`.
        pub const WORKSPACE_RETAINED: &str = "WorkspaceRetained";
        /// Reason of `ExecutorTerminated=True`.
        pub const TERMINAL_POD_PROOF: &str = "TerminalPodProof";
        /// Reason of `DeletionBlocked=True`.
        pub const EXACT_LIFECYCLE_REQUIRED: &str = "ExactLifecycleRequired";
    }
}
