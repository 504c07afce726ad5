//! `status.commands`: the bounded list of command leases (docs/commands.md §5.1). A lease is
//! held by the run claim that started its command, not by a replica: it records the claim's
//! tuple, where the command stands, and how it ended, so any replica can serve the command and
//! a claim's end can be recorded for every command it owned.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::RfcTime;

/// Most command leases the status keeps (ended ones included), and most not ended
/// (docs/commands.md §5.1).
pub const MAX_COMMAND_LEASES: usize = 32;
/// Most command leases not ended at once: the concurrent commands of one environment.
pub const MAX_RUNNING_COMMANDS: usize = 16;

/// One supervised command, leased by the run claim that started it (docs/commands.md §5.1).
/// Its tuple never changes; an `Ended` lease never changes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandLease {
    /// The command id, the operation id its start was admitted under.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    pub id: String,
    /// The claim that owns the command.
    #[serde(rename = "claimID")]
    #[schemars(length(max = 1024))]
    pub claim_id: String,
    /// The claim's run.
    #[serde(rename = "runID")]
    #[schemars(length(max = 1024))]
    pub run_id: String,
    /// The claim's epoch.
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub epoch: u64,
    /// The grant generation the claim was taken under.
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub grant_generation: u64,
    /// Started with `detach` (else a foreground start, followed by its call).
    pub detached: bool,
    /// When the lease was admitted.
    pub started_at: RfcTime,
    /// Where the command stands.
    pub state: CommandLeaseState,
    /// The cancel's operation id, while `Cancelling`.
    #[serde(
        rename = "cancelOperationID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 1024))]
    pub cancel_operation_id: Option<String>,
    /// How it ended, once `Ended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<CommandOutcome>,
}

/// Where a command lease stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CommandLeaseState {
    /// Admitted; the command may be running.
    Running,
    /// A cancel is under way.
    Cancelling,
    /// Its end is recorded in the outcome; the lease never changes again.
    Ended,
}

/// The recorded end of a command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandOutcome {
    /// The final state.
    pub state: CommandEndState,
    /// -1 for a signal.
    pub exit_code: i32,
    /// Present only when the end is proven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub terminal_receipt: Option<String>,
    /// When the end was recorded.
    pub ended_at: RfcTime,
    /// Why it ended.
    pub reason: CommandEndReason,
}

/// The final state of a command.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CommandEndState {
    /// Exit code 0.
    Succeeded,
    /// Another exit code, a signal, or a refused start.
    Failed,
    /// Ended by a cancel or a claim's end, proven.
    Cancelled,
    /// The end could not be proven (no receipt).
    FenceUnknown,
}

/// Why a command lease ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CommandEndReason {
    /// The command exited by itself (or by a signal it was sent).
    Exited,
    /// `CancelCommand` ended it.
    Cancelled,
    /// Its claim was released, revoked, expired or withdrawn.
    ClaimEnded,
    /// The supervisor sealed its id without having started it.
    NeverStarted,
    /// The supervisor refused the start definitively.
    Refused,
    /// Replacement or retirement with a terminal proof of the Pod ended it.
    ExecutorReplaced,
}

impl CommandLease {
    /// Whether the lease still holds a possibly running command.
    pub fn is_open(&self) -> bool {
        self.state != CommandLeaseState::Ended
    }
}
