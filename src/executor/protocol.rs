//! The JSON wire schema between the provider and `execution-helper` (k8s-executor §4.2).
//!
//! Field names are snake_case and every optional field is omitted when empty. Byte fields are
//! base64 (standard alphabet, with padding). Decoding is strict: unknown fields, duplicate keys
//! and anything after the one JSON value are refused ([`decode_strict`]).

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest helper stdin frame and stdout envelope, in bytes (8 MiB).
pub const MAX_JSON_BODY: usize = 8 * 1024 * 1024;
/// Largest file content a request or response carries, in bytes (5 MiB).
pub const MAX_FILE_BYTES: usize = 5 * 1024 * 1024;
/// Protocol ceiling for a command string, in bytes (1 MiB).
pub const MAX_COMMAND_BYTES: usize = 1024 * 1024;
/// Largest path, destination or pattern, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Largest number of entries, paths or matches one response carries.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// The helper's default and largest output cap for one command, stdout and stderr together
/// (5 MiB).
pub const MAX_COMMAND_OUTPUT: usize = 5 * 1024 * 1024;

/// The output cap of a `command.start` whose request carries `limit`: `limit` bytes if
/// positive and at most [`MAX_COMMAND_OUTPUT`], else [`MAX_COMMAND_OUTPUT`].
pub fn command_output_cap(limit: i64) -> usize {
    match usize::try_from(limit) {
        Ok(cap) if cap > 0 => cap.min(MAX_COMMAND_OUTPUT),
        _ => MAX_COMMAND_OUTPUT,
    }
}

/// The helper's ceiling for one command (30 minutes).
pub const MAX_COMMAND_DURATION: Duration = Duration::from_secs(30 * 60);

/// The helper's own deadline for one file operation: shorter than the transport's (120 s, see
/// `executor::local::FILE_OPERATION_DEADLINE`), so the helper answers and exits before the
/// transport gives up on it.
pub const HELPER_FILE_DEADLINE: Duration = Duration::from_secs(100);

/// The bound on a command: `timeout_ms` if positive and smaller than
/// [`MAX_COMMAND_DURATION`], else [`MAX_COMMAND_DURATION`].
pub fn command_timeout(timeout_ms: i64) -> Duration {
    match u64::try_from(timeout_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms).min(MAX_COMMAND_DURATION),
        _ => MAX_COMMAND_DURATION,
    }
}

/// Go `fs.FileMode` type bit for a directory.
pub const MODE_DIR: u32 = 1 << 31;
/// Go `fs.FileMode` type bit for a symbolic link.
pub const MODE_SYMLINK: u32 = 1 << 27;
/// Go `fs.FileMode` type bit for a device.
pub const MODE_DEVICE: u32 = 1 << 26;
/// Go `fs.FileMode` type bit for a named pipe.
pub const MODE_NAMED_PIPE: u32 = 1 << 25;
/// Go `fs.FileMode` type bit for a Unix socket.
pub const MODE_SOCKET: u32 = 1 << 24;
/// Go `fs.FileMode` bit for setuid.
pub const MODE_SETUID: u32 = 1 << 23;
/// Go `fs.FileMode` bit for setgid.
pub const MODE_SETGID: u32 = 1 << 22;
/// Go `fs.FileMode` type bit for a character device (set together with [`MODE_DEVICE`]).
pub const MODE_CHAR_DEVICE: u32 = 1 << 21;
/// Go `fs.FileMode` bit for sticky.
pub const MODE_STICKY: u32 = 1 << 20;
/// Go `fs.FileMode` type bit for anything else that is not a regular file.
pub const MODE_IRREGULAR: u32 = 1 << 19;
/// Go `fs.FileMode` permission bits.
pub const MODE_PERM: u32 = 0o777;

/// The closed operation vocabulary (api-security §1, k8s-executor §4.2).
///
/// The helper performs the `file.*` words and `command.start`; the others are valid words that
/// only the provider handles. A word outside the vocabulary decodes as [`Operation::Unknown`] so
/// that the helper can answer it with a structured error instead of a JSON error.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// `file.read`
    FileRead,
    /// `file.resolve_authority`
    FileResolveAuthority,
    /// `file.stat`
    FileStat,
    /// `file.create`
    FileCreate,
    /// `file.replace`
    FileReplace,
    /// `file.list`
    FileList,
    /// `file.remove`
    FileRemove,
    /// `file.rename`
    FileRename,
    /// `file.copy`
    FileCopy,
    /// `file.glob`
    FileGlob,
    /// `file.grep`
    FileGrep,
    /// `command.start`
    CommandStart,
    /// `attach` (provider only)
    Attach,
    /// `run.acquire` (provider only)
    RunAcquire,
    /// `run.renew` (provider only)
    RunRenew,
    /// `run.release` (provider only)
    RunRelease,
    /// `reference.commit` (provider only)
    ReferenceCommit,
    /// `reference.abort` (provider only)
    ReferenceAbort,
    /// `reference.reserve` (provider only)
    ReferenceReserve,
    /// `reference.delete.prepare` (provider only)
    ReferenceDeletePrepare,
    /// `reference.delete.confirm` (provider only)
    ReferenceDeleteConfirm,
    /// `reference.delete.cancel` (provider only)
    ReferenceDeleteCancel,
    /// `reference.release` (provider only)
    ReferenceRelease,
    /// `retire` (provider only)
    Retire,
    /// `command.status` (provider only)
    CommandStatus,
    /// `command.cancel` (provider only)
    CommandCancel,
    /// `command.stream` (provider only)
    CommandStream,
    /// A word outside the vocabulary, kept verbatim.
    Unknown(String),
}

impl Operation {
    /// Every word of the vocabulary, in a fixed order.
    pub const ALL: [Operation; 27] = [
        Operation::FileRead,
        Operation::FileResolveAuthority,
        Operation::FileStat,
        Operation::FileCreate,
        Operation::FileReplace,
        Operation::FileList,
        Operation::FileRemove,
        Operation::FileRename,
        Operation::FileCopy,
        Operation::FileGlob,
        Operation::FileGrep,
        Operation::CommandStart,
        Operation::Attach,
        Operation::RunAcquire,
        Operation::RunRenew,
        Operation::RunRelease,
        Operation::ReferenceCommit,
        Operation::ReferenceAbort,
        Operation::ReferenceReserve,
        Operation::ReferenceDeletePrepare,
        Operation::ReferenceDeleteConfirm,
        Operation::ReferenceDeleteCancel,
        Operation::ReferenceRelease,
        Operation::Retire,
        Operation::CommandStatus,
        Operation::CommandCancel,
        Operation::CommandStream,
    ];

    /// The wire word.
    pub fn as_str(&self) -> &str {
        match self {
            Operation::FileRead => "file.read",
            Operation::FileResolveAuthority => "file.resolve_authority",
            Operation::FileStat => "file.stat",
            Operation::FileCreate => "file.create",
            Operation::FileReplace => "file.replace",
            Operation::FileList => "file.list",
            Operation::FileRemove => "file.remove",
            Operation::FileRename => "file.rename",
            Operation::FileCopy => "file.copy",
            Operation::FileGlob => "file.glob",
            Operation::FileGrep => "file.grep",
            Operation::CommandStart => "command.start",
            Operation::Attach => "attach",
            Operation::RunAcquire => "run.acquire",
            Operation::RunRenew => "run.renew",
            Operation::RunRelease => "run.release",
            Operation::ReferenceCommit => "reference.commit",
            Operation::ReferenceAbort => "reference.abort",
            Operation::ReferenceReserve => "reference.reserve",
            Operation::ReferenceDeletePrepare => "reference.delete.prepare",
            Operation::ReferenceDeleteConfirm => "reference.delete.confirm",
            Operation::ReferenceDeleteCancel => "reference.delete.cancel",
            Operation::ReferenceRelease => "reference.release",
            Operation::Retire => "retire",
            Operation::CommandStatus => "command.status",
            Operation::CommandCancel => "command.cancel",
            Operation::CommandStream => "command.stream",
            Operation::Unknown(word) => word,
        }
    }

    /// Parses a wire word; a word outside the vocabulary becomes [`Operation::Unknown`].
    pub fn parse(word: &str) -> Operation {
        Operation::ALL
            .into_iter()
            .find(|op| op.as_str() == word)
            .unwrap_or_else(|| Operation::Unknown(word.to_owned()))
    }

    /// True for the words the helper performs in the workload.
    pub fn is_workload(&self) -> bool {
        matches!(
            self,
            Operation::FileRead
                | Operation::FileResolveAuthority
                | Operation::FileStat
                | Operation::FileCreate
                | Operation::FileReplace
                | Operation::FileList
                | Operation::FileRemove
                | Operation::FileRename
                | Operation::FileCopy
                | Operation::FileGlob
                | Operation::FileGrep
                | Operation::CommandStart
        )
    }

    /// True for valid words that only the provider handles.
    pub fn is_provider_only(&self) -> bool {
        !self.is_workload() && !matches!(self, Operation::Unknown(_))
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Operation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = String::deserialize(deserializer)?;
        Ok(Operation::parse(&word))
    }
}

/// One request to the helper. Only `operation` is required on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorRequest {
    /// What to do.
    pub operation: Operation,
    /// The file or directory operated on; empty means the workspace root.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub path: String,
    /// The destination of `file.rename` and `file.copy`.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub destination: String,
    /// The pattern of `file.glob` and `file.grep`.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub pattern: String,
    /// File content for `file.create` and `file.replace`.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub data: Vec<u8>,
    /// The expected current version (lowercase hex SHA-256) for `file.replace`.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub version: String,
    /// For `file.list`, `file.glob` and `file.grep`: the result limit (0 means
    /// [`MAX_LIST_ENTRIES`]; 0..=[`MAX_LIST_ENTRIES`] is accepted).
    ///
    /// For `command.start` (DECISIONS 12): the output cap in bytes, stdout and stderr together
    /// (0 means [`MAX_COMMAND_OUTPUT`]; 0..=[`MAX_COMMAND_OUTPUT`] is accepted). The store sets
    /// it to the template's `maxCommandBytes`; the helper cuts the output at it, sets
    /// `truncated`, and computes the terminal receipt over exactly the kept bytes, which are the
    /// bytes the client receives. See [`command_output_cap`].
    #[serde(
        default,
        skip_serializing_if = "is_zero_i64",
        deserialize_with = "nullable"
    )]
    pub limit: i64,
    /// The shell command of `command.start`.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub command: String,
    /// The caller's id for the command; it is bound into the terminal receipt.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub command_id: String,
    /// Command timeout in milliseconds; 0 or negative means the helper's maximum.
    #[serde(
        default,
        skip_serializing_if = "is_zero_i64",
        deserialize_with = "nullable"
    )]
    pub timeout_ms: i64,
}

impl ExecutorRequest {
    /// A request for `operation` with every other field empty.
    pub fn new(operation: Operation) -> Self {
        Self {
            operation,
            path: String::new(),
            destination: String::new(),
            pattern: String::new(),
            data: Vec::new(),
            version: String::new(),
            limit: 0,
            command: String::new(),
            command_id: String::new(),
            timeout_ms: 0,
        }
    }

    /// A request for `operation` on `path`.
    pub fn at(operation: Operation, path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            ..Self::new(operation)
        }
    }

    /// A `command.start` request.
    pub fn command(command_id: impl Into<String>, command: impl Into<String>) -> Self {
        Self {
            command_id: command_id.into(),
            command: command.into(),
            ..Self::new(Operation::CommandStart)
        }
    }
}

/// The helper's one answer: exactly one of `response` and `error` is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorEnvelope {
    /// The result of a successful operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ExecutorResponse>,
    /// The structured error of a refused or failed operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecutorError>,
}

impl ExecutorEnvelope {
    /// An envelope carrying a response.
    pub fn response(response: ExecutorResponse) -> Self {
        Self {
            response: Some(response),
            error: None,
        }
    }

    /// An envelope carrying an error.
    pub fn error(error: ExecutorError) -> Self {
        Self {
            response: None,
            error: Some(error),
        }
    }

    /// The outcome, or `None` unless exactly one of `response` and `error` is set.
    pub fn into_outcome(self) -> Option<Result<ExecutorResponse, ExecutorError>> {
        match (self.response, self.error) {
            (Some(response), None) => Some(Ok(response)),
            (None, Some(error)) => Some(Err(error)),
            _ => None,
        }
    }
}

/// The result of an operation: the file response fields flattened at top level, plus `command`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorResponse {
    /// File content (`file.read`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub data: Vec<u8>,
    /// Lowercase hex SHA-256 of the file content after the operation.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub version: String,
    /// Metadata (`file.stat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<FileInfo>,
    /// Directory entries sorted by name (`file.list`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub entries: Vec<FileInfo>,
    /// Matching root-relative paths (`file.glob`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub paths: Vec<String>,
    /// Matching lines (`file.grep`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub matches: Vec<GrepMatch>,
    /// Canonical absolute target path (`file.resolve_authority`).
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub authority_target: String,
    /// Canonical workspace root (`file.resolve_authority`).
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub authority_workspace: String,
    /// The outcome of `command.start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandStatus>,
}

/// Metadata of one file, directory or link.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileInfo {
    /// The base name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Size in bytes.
    #[serde(default, deserialize_with = "nullable")]
    pub size: i64,
    /// Go `fs.FileMode` bits: permission bits plus type flags ([`MODE_DIR`], [`MODE_SYMLINK`], …).
    #[serde(default, deserialize_with = "nullable")]
    pub mode: u32,
    /// Modification time, RFC 3339 with nanoseconds ([`format_rfc3339_nano`]).
    #[serde(default, deserialize_with = "nullable")]
    pub mod_time: String,
    /// True for a directory.
    #[serde(default, deserialize_with = "nullable")]
    pub is_dir: bool,
}

/// One matching line of `file.grep`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrepMatch {
    /// Root-relative slash path of the file.
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// 1-based line number.
    #[serde(default, deserialize_with = "nullable")]
    pub line: i64,
    /// The line, with invalid UTF-8 replaced by U+FFFD.
    #[serde(default, deserialize_with = "nullable")]
    pub text: String,
}

/// The state of a command.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CommandState {
    /// Still running (detached commands only).
    #[default]
    Running,
    /// Exited 0, and cleanup was proven.
    Succeeded,
    /// Exited non-zero, was killed by a signal, failed to start or failed to be waited for.
    Failed,
    /// Timed out or cancelled.
    Cancelled,
    /// Cleanup could not be proven: something the command started may still be running.
    FenceUnknown,
}

impl CommandState {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandState::Running => "running",
            CommandState::Succeeded => "succeeded",
            CommandState::Failed => "failed",
            CommandState::Cancelled => "cancelled",
            CommandState::FenceUnknown => "fence_unknown",
        }
    }
}

/// The outcome of `command.start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandStatus {
    /// The caller's id for the command.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub command_id: String,
    /// The state.
    pub state: CommandState,
    /// Exit code; -1 for a signal or another failure; omitted when 0.
    #[serde(
        default,
        skip_serializing_if = "is_zero_i32",
        deserialize_with = "nullable"
    )]
    pub exit_code: i32,
    /// Captured standard output (valid UTF-8, capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub stdout: Vec<u8>,
    /// Captured standard error (valid UTF-8, capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "base64_bytes")]
    pub stderr: Vec<u8>,
    /// Offset for streaming (detached commands only).
    #[serde(
        default,
        skip_serializing_if = "is_zero_i64",
        deserialize_with = "nullable"
    )]
    pub next_offset: i64,
    /// True when output was cut at the cap.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "nullable"
    )]
    pub truncated: bool,
    /// Hex SHA-256 of `command_id NUL stdout NUL stderr`; only when cleanup was proven.
    #[serde(
        default,
        skip_serializing_if = "str::is_empty",
        deserialize_with = "nullable"
    )]
    pub terminal_receipt: String,
}

/// The closed set of structured error codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed or names something the helper does not do.
    InvalidArgument,
    /// Authentication failed.
    Unauthenticated,
    /// The path is outside the workspace.
    PermissionDenied,
    /// The file does not exist.
    NotFound,
    /// The destination already exists.
    AlreadyExists,
    /// The state does not allow it (a non-empty directory, for example).
    Conflict,
    /// `file.replace` saw a different current version.
    VersionMismatch,
    /// Not ready.
    NotReady,
    /// Whether the effect happened is unknown.
    FenceUnknown,
    /// A bound was exceeded.
    ResourceExhausted,
    /// Anything else; the message is generic.
    Internal,
}

impl ErrorCode {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::Conflict => "conflict",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::FenceUnknown => "fence_unknown",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A structured (controlled) error from the helper.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{code}: {message}")]
pub struct ExecutorError {
    /// The stable code.
    pub code: ErrorCode,
    /// A message safe to show; never a raw OS error.
    #[serde(default, deserialize_with = "nullable")]
    pub message: String,
    /// True when retrying the same request may succeed.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "nullable"
    )]
    pub retryable: bool,
}

impl ExecutorError {
    /// A non-retryable error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retryable: false,
        }
    }
}

/// Why bytes did not decode as one strict JSON value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Malformed JSON, an unknown field, a duplicate key or a wrong type.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// Something other than whitespace follows the first value.
    #[error("request must contain exactly one JSON value")]
    NotOneValue,
}

/// Decodes exactly one JSON value into `T`, refusing unknown fields (through
/// `deny_unknown_fields` on the wire types), duplicate keys (serde's derived struct visitors
/// refuse a repeated field) and trailing values.
pub fn decode_strict<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = T::deserialize(&mut deserializer).map_err(|e| DecodeError::Json(e.to_string()))?;
    deserializer.end().map_err(|_| DecodeError::NotOneValue)?;
    Ok(value)
}

/// Lowercase hex SHA-256 of `content`: the version of a file.
pub fn content_version(content: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(content))
}

/// The terminal receipt of a command: lowercase hex SHA-256 of
/// `command_id NUL stdout NUL stderr` over the capped output bytes.
pub fn terminal_receipt(command_id: &str, stdout: &[u8], stderr: &[u8]) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(command_id.as_bytes());
    hasher.update([0u8]);
    hasher.update(stdout);
    hasher.update([0u8]);
    hasher.update(stderr);
    hex::encode(hasher.finalize())
}

/// Formats a Unix time as Go's RFC3339Nano in UTC: fraction digits without trailing zeros, no
/// fraction when it is zero, and `Z` as the zone (`2024-05-01T10:20:30.5Z`).
pub fn format_rfc3339_nano(unix_seconds: i64, nanos: u32) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let second_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

fn is_zero_i32(value: &i32) -> bool {
    *value == 0
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Accepts JSON `null` as the zero value, as Go's decoder does.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Byte fields as standard base64 with padding; `null` decodes as empty.
mod base64_bytes {
    use super::*;

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let Some(text) = Option::<String>::deserialize(deserializer)? else {
            return Ok(Vec::new());
        };
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_encodes_only_its_non_empty_fields() {
        let mut request = ExecutorRequest::at(Operation::FileCreate, "a.txt");
        request.data = b"hi".to_vec();
        let json = serde_json::to_string(&request).unwrap();
        assert_eq!(
            json,
            r#"{"operation":"file.create","path":"a.txt","data":"aGk="}"#
        );
        assert_eq!(
            decode_strict::<ExecutorRequest>(json.as_bytes()).unwrap(),
            request
        );
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let err =
            decode_strict::<ExecutorRequest>(br#"{"operation":"file.read","path":"a","path":"b"}"#)
                .unwrap_err();
        assert!(
            matches!(err, DecodeError::Json(ref m) if m.contains("duplicate field")),
            "{err}"
        );
        let err = decode_strict::<ExecutorRequest>(
            br#"{"operation":"file.read","operation":"file.stat"}"#,
        )
        .unwrap_err();
        assert!(matches!(err, DecodeError::Json(_)), "{err}");
        let err = decode_strict::<ExecutorEnvelope>(
            br#"{"response":{"command":{"state":"failed","state":"succeeded"}}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, DecodeError::Json(_)), "{err}");
    }

    #[test]
    fn unknown_fields_and_trailing_values_are_refused() {
        let err = decode_strict::<ExecutorRequest>(br#"{"operation":"file.read","argv":["x"]}"#)
            .unwrap_err();
        assert!(
            matches!(err, DecodeError::Json(ref m) if m.contains("unknown field")),
            "{err}"
        );
        let err = decode_strict::<ExecutorRequest>(
            br#"{"operation":"file.read"} {"operation":"file.read"}"#,
        )
        .unwrap_err();
        assert_eq!(err, DecodeError::NotOneValue);
        assert!(decode_strict::<ExecutorRequest>(b"{\"operation\":\"file.read\"}\n  ").is_ok());
        assert!(decode_strict::<ExecutorRequest>(b"").is_err());
    }

    #[test]
    fn null_fields_decode_as_empty() {
        let request = decode_strict::<ExecutorRequest>(
            br#"{"operation":"file.read","path":null,"data":null,"limit":null}"#,
        )
        .unwrap();
        assert_eq!(request, ExecutorRequest::new(Operation::FileRead));
    }

    #[test]
    fn every_operation_word_round_trips_and_unknown_words_are_kept() {
        for op in Operation::ALL {
            assert_eq!(Operation::parse(op.as_str()), op);
        }
        assert_eq!(
            Operation::parse("file.chmod"),
            Operation::Unknown("file.chmod".into())
        );
        assert!(Operation::FileGrep.is_workload());
        assert!(Operation::CommandStatus.is_provider_only());
        assert!(!Operation::Unknown("x".into()).is_provider_only());
    }

    #[test]
    fn a_command_status_omits_zero_exit_code_and_empty_fields() {
        let status = CommandStatus {
            command_id: "c1".into(),
            state: CommandState::Succeeded,
            exit_code: 0,
            stdout: b"ok\n".to_vec(),
            stderr: Vec::new(),
            next_offset: 0,
            truncated: false,
            terminal_receipt: "ab".into(),
        };
        let json = serde_json::to_string(&ExecutorEnvelope::response(ExecutorResponse {
            command: Some(status),
            ..ExecutorResponse::default()
        }))
        .unwrap();
        assert_eq!(
            json,
            r#"{"response":{"command":{"command_id":"c1","state":"succeeded","stdout":"b2sK","terminal_receipt":"ab"}}}"#
        );
    }

    #[test]
    fn an_error_envelope_has_the_wire_shape() {
        let json = serde_json::to_string(&ExecutorEnvelope::error(ExecutorError::new(
            ErrorCode::VersionMismatch,
            "version mismatch",
        )))
        .unwrap();
        assert_eq!(
            json,
            r#"{"error":{"code":"version_mismatch","message":"version mismatch"}}"#
        );
        assert!(
            decode_strict::<ExecutorEnvelope>(br#"{"error":{"code":"teapot","message":""}}"#)
                .is_err()
        );
    }

    #[test]
    fn an_empty_response_encodes_as_an_empty_object() {
        let json = serde_json::to_string(&ExecutorEnvelope::response(ExecutorResponse::default()))
            .unwrap();
        assert_eq!(json, r#"{"response":{}}"#);
    }

    #[test]
    fn rfc3339_nano_matches_go_formatting() {
        assert_eq!(format_rfc3339_nano(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_rfc3339_nano(1_714_558_830, 500_000_000),
            "2024-05-01T10:20:30.5Z"
        );
        assert_eq!(
            format_rfc3339_nano(951_782_400, 1),
            "2000-02-29T00:00:00.000000001Z"
        );
        assert_eq!(format_rfc3339_nano(-1, 0), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn command_timeout_is_the_smaller_of_the_request_and_30_minutes() {
        assert_eq!(command_timeout(0), MAX_COMMAND_DURATION);
        assert_eq!(command_timeout(-5), MAX_COMMAND_DURATION);
        assert_eq!(command_timeout(1500), Duration::from_millis(1500));
        assert_eq!(command_timeout(i64::MAX), MAX_COMMAND_DURATION);
    }

    #[test]
    fn receipt_binds_id_and_both_streams() {
        assert_eq!(
            terminal_receipt("id", b"out", b"err"),
            content_version(b"id\0out\0err")
        );
        assert_ne!(
            terminal_receipt("id", b"ou", b"terr"),
            terminal_receipt("id", b"out", b"err")
        );
        assert_eq!(
            content_version(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
