//! The executor supervisor's channel protocol (docs/commands.md §4): the request and reply types,
//! the frame format, the authentication tags, the per-Pod secret and the command receipt.
//!
//! This is the one module the provider side calls to speak to a supervisor; the supervisor
//! (`crate::helper::supervisor`) and the client ([`super::supervisor_client`]) are built on it.
//!
//! A connection starts with one untagged [`Hello`] from the supervisor. Every later frame is a
//! 32-byte HMAC-SHA256 tag followed by strict JSON: client frames carry a
//! [`SupervisorRequest`], supervisor frames a [`SupervisorReply`]. Tags bind the boot id, the
//! connection's nonce, the direction and the frame's index, so a frame can be neither forged
//! without the secret nor replayed on another connection or at another position.

use std::fmt;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::protocol::{CommandState, ExecutorError};

/// Version of the channel protocol the [`Hello`] announces.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame either side sends, in bytes (4 MiB).
pub const MAX_FRAME: usize = 4 * 1024 * 1024;
/// Length of an authentication tag.
pub const TAG_LEN: usize = 32;
/// The supervisor's socket in an executor Pod: an abstract Unix socket name.
pub const DEFAULT_SOCKET: &str = "@mecatl-supervisor";

/// Commands running at once per environment.
pub const MAX_RUNNING_COMMANDS: usize = 16;
/// Finished commands whose output the journal keeps.
pub const MAX_FINISHED_COMMANDS: usize = 64;
/// How long a finished command keeps its output.
pub const FINISHED_RETENTION: Duration = Duration::from_secs(3600);
/// Tombstones (id, outcome and receipt without output) the journal keeps.
pub const MAX_TOMBSTONES: usize = 1024;
/// Sum of every retained output window, in bytes (64 MiB).
pub const MAX_JOURNAL_BYTES: usize = 64 * 1024 * 1024;
/// Retained output window of a command whose start asks for 0 bytes (1 MiB).
pub const DEFAULT_WINDOW: usize = 1024 * 1024;
/// Largest retained output window of one command (5 MiB).
pub const MAX_WINDOW: usize = 5 * 1024 * 1024;
/// Largest output chunk.
pub const MAX_CHUNK: usize = 64 * 1024;
/// Most output bytes one status answer or output frame carries (1 MiB).
pub const MAX_STATUS_BYTES: usize = 1024 * 1024;
/// Largest stdin chunk of one request (64 KiB).
pub const MAX_STDIN_CHUNK: usize = 64 * 1024;
/// Stdin bytes queued for a command that has not read them yet (256 KiB).
pub const MAX_STDIN_QUEUE: usize = 256 * 1024;
/// Environment variables per command.
pub const MAX_ENV_VARS: usize = 64;
/// Largest environment variable name.
pub const MAX_ENV_NAME: usize = 128;
/// Largest environment variable value (32 KiB).
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Largest sum of names and values (64 KiB).
pub const MAX_ENV_TOTAL: usize = 64 * 1024;
/// Largest command id.
pub const MAX_COMMAND_ID: usize = 128;
/// Cancel grace when the request asks for 0.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);
/// Largest cancel grace.
pub const MAX_CANCEL_GRACE: Duration = Duration::from_secs(60);
/// Grace between SIGTERM and SIGKILL when a claim's deadline passes.
pub const CLAIM_KILL_GRACE: Duration = Duration::from_secs(2);
/// Largest claim lease the provider passes (a run claim's longest TTL).
pub const MAX_LEASE: Duration = Duration::from_secs(300);
/// Connections the supervisor serves at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Followers of one command at once.
pub const MAX_FOLLOWERS_PER_COMMAND: usize = 8;
/// Most commands one list answer carries.
pub const MAX_LIST: usize = 64;
/// Most rows, and most columns, of a command's terminal.
pub const MAX_PTY_SIDE: u16 = 1000;

/// The supervisor's first, untagged frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// This supervisor boot, 16 bytes as hex.
    pub boot_id: String,
    /// This connection's nonce, 32 bytes as hex.
    pub nonce: String,
    /// [`secret_id`] of the enrolled secret; empty before enrollment.
    pub secret_id: String,
}

/// The run claim a command belongs to; compared exactly by the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimTuple {
    /// The claim id.
    pub claim_id: String,
    /// The run id.
    pub run_id: String,
    /// The execution epoch.
    pub epoch: u64,
    /// The grant generation.
    pub grant_generation: u64,
}

/// A PTY size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Rows, 1..=1000.
    pub rows: u16,
    /// Columns, 1..=1000.
    pub cols: u16,
}

/// A signal a caller may send to a running command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandSignal {
    /// SIGINT
    #[serde(rename = "INT")]
    Int,
    /// SIGTERM
    #[serde(rename = "TERM")]
    Term,
    /// SIGKILL
    #[serde(rename = "KILL")]
    Kill,
    /// SIGHUP
    #[serde(rename = "HUP")]
    Hup,
}

/// The `start` request.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The command id: the operation id the store admitted the start under.
    pub command_id: String,
    /// The claim the command belongs to.
    pub claim: ClaimTuple,
    /// The claim's remaining lifetime as the provider read it, in ms (1..=300 000).
    pub lease_ms: u64,
    /// Shell text for `/bin/sh -c`.
    pub command: String,
    /// Extra environment variables, `[name, value]` pairs (they reach the workload only).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory relative to the workspace root; empty is the root.
    #[serde(default)]
    pub working_dir: String,
    /// Timeout in ms; 0 means none (the claim bounds the command).
    #[serde(default)]
    pub timeout_ms: u64,
    /// Give the command a stdin pipe (else `/dev/null`).
    #[serde(default)]
    pub stdin: bool,
    /// Run under a PTY of this size.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Retained output window; 0 means [`DEFAULT_WINDOW`].
    #[serde(default)]
    pub window_bytes: u64,
    /// A digest of what the client asked for (a start under a client operation id): a start
    /// of a known id with another digest is refused `conflict`. Kept in memory only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_digest: String,
    /// A replay of a start the store already admitted: answer the known command, never start
    /// one (an unknown id answers `not_found`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_only: bool,
}

impl fmt::Debug for StartRequest {
    /// Prints the variables' names only: their values never reach logs or traces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("StartRequest")
            .field("command_id", &self.command_id)
            .field("claim", &self.claim)
            .field("lease_ms", &self.lease_ms)
            .field("command_bytes", &self.command.len())
            .field("env_names", &names)
            .field("working_dir", &self.working_dir)
            .field("timeout_ms", &self.timeout_ms)
            .field("stdin", &self.stdin)
            .field("pty", &self.pty)
            .field("window_bytes", &self.window_bytes)
            .field("replay_only", &self.replay_only)
            .finish()
    }
}

/// A request from the provider to the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SupervisorRequest {
    /// Pins the boot's secret (hex); the only request before enrollment.
    Enroll {
        /// The secret as 64 hex digits.
        secret: String,
    },
    /// Starts a command (a known id answers its entry instead).
    Start(StartRequest),
    /// A command's state and output from `offset`.
    Status {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// First output offset wanted.
        offset: u64,
        /// Most output bytes (0 means [`MAX_STATUS_BYTES`]).
        #[serde(default)]
        max_bytes: u64,
    },
    /// Streams output from `offset` until the command ends, then its status.
    Follow {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// First output offset wanted.
        offset: u64,
    },
    /// Writes to (and optionally closes) a command's stdin.
    Stdin {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// The bytes (at most [`MAX_STDIN_CHUNK`]).
        #[serde(default, with = "base64_bytes")]
        data: Vec<u8>,
        /// Close stdin after the bytes.
        #[serde(default)]
        close: bool,
    },
    /// Sends a signal to the command's process group.
    Signal {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// The signal.
        signal: CommandSignal,
    },
    /// Resizes a command's PTY.
    Resize {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// The new size.
        size: PtySize,
    },
    /// SIGTERM, `grace_ms`, SIGKILL, proof; answers once the end is proven or the sweep gave up.
    Cancel {
        /// The command.
        command_id: String,
        /// The caller's claim.
        claim: ClaimTuple,
        /// Grace in ms (0 means [`DEFAULT_CANCEL_GRACE`]).
        #[serde(default)]
        grace_ms: u64,
    },
    /// Extends the deadline of every command of `claim`.
    Renew {
        /// The claim.
        claim: ClaimTuple,
        /// Its remaining lifetime in ms.
        lease_ms: u64,
    },
    /// Ends every command of the claim and erases their output.
    EndClaim {
        /// The claim id.
        claim_id: String,
        /// Grace in ms (0 means [`CLAIM_KILL_GRACE`]).
        #[serde(default)]
        grace_ms: u64,
    },
    /// The claim's commands, without output.
    List {
        /// The caller's claim.
        claim: ClaimTuple,
        /// Most entries (0 or more than [`MAX_LIST`] means [`MAX_LIST`]).
        #[serde(default)]
        limit: u64,
    },
    /// The outcome of an operation id, for recovery; `seal` makes an unknown id unstartable.
    Journal {
        /// The command.
        command_id: String,
        /// Record an unknown id as never started.
        #[serde(default)]
        seal: bool,
    },
    /// Runs one request of the one-shot helper in the supervisor's environment (a `dev`
    /// sandbox's file operations and foreground commands, docs/sandbox.md). Its
    /// `request_bytes` follow as `call_input` frames; the connection then carries only the
    /// call: `call_output`* and one `call_ended`. Any later frame from the client, or its end,
    /// closes the helper's stdin, which cancels a foreground command.
    Call {
        /// Length of the helper request (at most [`super::protocol::MAX_JSON_BODY`]).
        request_bytes: u64,
        /// Keep the helper's stdin open after the request (a foreground command).
        #[serde(default)]
        hold_stdin: bool,
        /// The store's operation id the call runs under: the supervisor then journals the
        /// call under it (running, then its outcome and [`operation_receipt`]), so that a
        /// reconciler can ask after the call's holder is gone (the recovery issue, item 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operation_id: Option<String>,
    },
    /// Cancels the journaled call of `operation_id` (its helper's stdin is closed, which
    /// cancels a foreground command) and answers its journal entry once it ended, or as it
    /// stands when `grace_ms` (0 means [`DEFAULT_CANCEL_GRACE`]) and the sweep passed.
    CancelCall {
        /// The operation id the call was journaled under.
        operation_id: String,
        /// How long to wait for the call's end.
        #[serde(default)]
        grace_ms: u64,
    },
    /// Part of a `call`'s helper request (at most [`MAX_CALL_CHUNK`] bytes).
    CallInput {
        /// The bytes.
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
}

/// Most bytes of one `call_input` or `call_output` frame.
pub const MAX_CALL_CHUNK: usize = 1024 * 1024;

/// Which stream a chunk of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// A PTY (both merged).
    Pty,
}

/// Bytes of one stream at one offset of the command's output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chunk {
    /// Its stream.
    pub stream: OutputStream,
    /// Offset of its first byte in the command's one output offset space.
    pub offset: u64,
    /// The bytes.
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Chunk({:?}@{}+{}: {:?})",
            self.stream,
            self.offset,
            self.data.len(),
            String::from_utf8_lossy(&self.data)
        )
    }
}

/// A command as the supervisor sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandView {
    /// The command id.
    pub command_id: String,
    /// Its state.
    pub state: CommandState,
    /// Exit code; -1 for a signal or a failure to run.
    #[serde(default)]
    pub exit_code: i32,
    /// Output from `start_offset`, in offset order.
    #[serde(default)]
    pub chunks: Vec<Chunk>,
    /// Offset of the first returned byte.
    #[serde(default)]
    pub start_offset: u64,
    /// Offset after the last returned byte.
    #[serde(default)]
    pub next_offset: u64,
    /// Bytes between the requested offset and `start_offset` that fell out of the window.
    #[serde(default)]
    pub dropped_bytes: u64,
    /// The command's stdin pipe is open.
    #[serde(default)]
    pub stdin_open: bool,
    /// The command's end is proven: nothing of its process tree is left.
    #[serde(default)]
    pub proven: bool,
    /// [`command_receipt`], only when proven.
    #[serde(default)]
    pub terminal_receipt: String,
    /// Start time, Unix ms (supervisor clock).
    #[serde(default)]
    pub started_at_ms: i64,
    /// End time, Unix ms; 0 while running.
    #[serde(default)]
    pub ended_at_ms: i64,
}

/// What the journal remembers of an operation id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalEntry {
    /// The command id.
    pub command_id: String,
    /// The claim it belonged to.
    pub claim_id: String,
    /// Its state.
    pub state: CommandState,
    /// Exit code.
    #[serde(default)]
    pub exit_code: i32,
    /// End proven.
    #[serde(default)]
    pub proven: bool,
    /// Its receipt, when proven.
    #[serde(default)]
    pub terminal_receipt: String,
    /// The id was sealed before any start used it.
    #[serde(default)]
    pub never_started: bool,
}

/// A reply from the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum SupervisorReply {
    /// Enrollment done (or repeated with the same secret).
    Enrolled {
        /// The boot id.
        boot_id: String,
    },
    /// One command.
    Status(CommandView),
    /// Output of a follow.
    Output {
        /// The chunks, in offset order.
        chunks: Vec<Chunk>,
        /// Bytes that fell out of the window before the follower read them.
        #[serde(default)]
        dropped_bytes: u64,
    },
    /// Stdin accepted.
    Stdin {
        /// Bytes queued.
        accepted: u64,
        /// Stdin still open.
        open: bool,
    },
    /// Done.
    Ok {},
    /// Deadline extended.
    Renewed {
        /// Running commands of the claim.
        commands: u64,
    },
    /// Several commands.
    StatusList {
        /// Their views (without output).
        commands: Vec<CommandView>,
    },
    /// A journal answer; `None` for an unknown (and unsealed) id.
    Journal {
        /// What is known.
        #[serde(default)]
        entry: Option<JournalEntry>,
    },
    /// Output of a call's helper (its stdout, in order).
    CallOutput {
        /// The bytes (at most [`MAX_CALL_CHUNK`]).
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// A call's helper exited.
    CallEnded {
        /// Its exit status (128 + the signal when killed).
        exit_code: i32,
        /// Its standard error (at most 64 KiB, lossily UTF-8).
        #[serde(default)]
        stderr: String,
    },
    /// A refusal or failure.
    Error(ExecutorError),
}

/// A frame's direction, bound into its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to supervisor.
    Request,
    /// Supervisor to client.
    Reply,
}

impl Direction {
    fn label(self) -> &'static [u8] {
        match self {
            Direction::Request => b"mecatl-supervisor/request/v1",
            Direction::Reply => b"mecatl-supervisor/reply/v1",
        }
    }
}

/// The binding of a connection: boot id and nonce (raw bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The supervisor boot.
    pub boot_id: Vec<u8>,
    /// The connection nonce.
    pub nonce: Vec<u8>,
}

impl Binding {
    /// The binding a [`Hello`] announces, or `None` when its fields are not hex of the right
    /// length.
    pub fn of(hello: &Hello) -> Option<Self> {
        let boot_id = hex::decode(&hello.boot_id).ok().filter(|b| b.len() == 16)?;
        let nonce = hex::decode(&hello.nonce).ok().filter(|n| n.len() == 32)?;
        Some(Self { boot_id, nonce })
    }

    fn mac(
        &self,
        secret: &[u8; 32],
        direction: Direction,
        index: u64,
        body: &[u8],
    ) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .expect("HMAC accepts a key of any length");
        mac.update(direction.label());
        mac.update(&[0]);
        mac.update(&self.boot_id);
        mac.update(&self.nonce);
        mac.update(&index.to_be_bytes());
        mac.update(body);
        mac
    }

    /// The tag of frame `index` in `direction` carrying `body`.
    pub fn tag(
        &self,
        secret: &[u8; 32],
        direction: Direction,
        index: u64,
        body: &[u8],
    ) -> [u8; 32] {
        self.mac(secret, direction, index, body)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `tag` is the tag of frame `index` (constant-time comparison).
    pub fn verify(
        &self,
        secret: &[u8; 32],
        direction: Direction,
        index: u64,
        body: &[u8],
        tag: &[u8],
    ) -> bool {
        self.mac(secret, direction, index, body)
            .verify_slice(tag)
            .is_ok()
    }
}

/// The secret of the supervisor of one executor Pod, derived from the provider's key `k_sup`.
pub fn derive_secret(k_sup: &[u8], namespace: &str, pod_name: &str, pod_uid: &str) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(k_sup).expect("HMAC accepts a key of any length");
    mac.update(b"mecatl-supervisor-secret/v1");
    for part in [namespace, pod_name, pod_uid] {
        mac.update(&[0]);
        mac.update(part.as_bytes());
    }
    mac.finalize().into_bytes().into()
}

/// A public name for a secret: 8 bytes of a domain-separated SHA-256, as hex.
pub fn secret_id(secret: &[u8; 32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"mecatl-supervisor-secret-id/v1");
    hasher.update([0]);
    hasher.update(secret);
    hex::encode(&hasher.finalize()[..8])
}

/// Parses a secret from 64 hex digits.
pub fn parse_secret(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text).ok()?;
    bytes.try_into().ok()
}

/// The running digests of a command's output, one per stream (a PTY counts as stdout).
#[derive(Clone, Debug, Default)]
pub struct OutputDigest {
    stdout: Sha256,
    stderr: Sha256,
}

impl OutputDigest {
    /// Adds bytes of `stream`.
    pub fn update(&mut self, stream: OutputStream, bytes: &[u8]) {
        match stream {
            OutputStream::Stdout | OutputStream::Pty => self.stdout.update(bytes),
            OutputStream::Stderr => self.stderr.update(bytes),
        }
    }

    /// The receipt of a proven end (docs/commands.md §4.5).
    pub fn receipt(
        &self,
        command_id: &str,
        state: CommandState,
        exit_code: i32,
        next_offset: u64,
    ) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"mecatl-command-receipt/v2");
        for part in [
            command_id.as_bytes(),
            state.as_str().as_bytes(),
            exit_code.to_string().as_bytes(),
            next_offset.to_string().as_bytes(),
        ] {
            hasher.update([0]);
            hasher.update(part);
        }
        hasher.update([0]);
        hasher.update(self.stdout.clone().finalize());
        hasher.update(self.stderr.clone().finalize());
        hex::encode(hasher.finalize())
    }
}

/// The receipt of a proven end over the full output of each stream.
pub fn command_receipt(
    command_id: &str,
    state: CommandState,
    exit_code: i32,
    stdout: &[u8],
    stderr: &[u8],
) -> String {
    let mut digest = OutputDigest::default();
    digest.update(OutputStream::Stdout, stdout);
    digest.update(OutputStream::Stderr, stderr);
    digest.receipt(
        command_id,
        state,
        exit_code,
        (stdout.len() + stderr.len()) as u64,
    )
}

/// The receipt of a journaled call (a file operation or a one-shot command run by the
/// supervisor under a store operation id): binds the operation id, the outcome's wire word and
/// the helper's whole answer, so a reconciler can record what ended without the answer itself.
///
/// `receipt = hex SHA-256("mecatl-operation-receipt/v1" 0x00 operation_id 0x00 state 0x00
/// SHA-256(answer))`
pub fn operation_receipt(operation_id: &str, state: CommandState, answer: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"mecatl-operation-receipt/v1\0");
    hasher.update(operation_id.as_bytes());
    hasher.update(b"\0");
    hasher.update(state.as_str().as_bytes());
    hasher.update(b"\0");
    hasher.update(Sha256::digest(answer));
    hex::encode(hasher.finalize())
}

/// Whether `id` is a valid command id: 1..=128 bytes of `[A-Za-z0-9._:-]`.
pub fn valid_command_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_COMMAND_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Whether `name` is a valid environment variable name.
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= MAX_ENV_NAME
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed.
    #[error("channel failed: {0}")]
    Io(#[from] std::io::Error),
    /// The length prefix is over the bound.
    #[error("frame of {0} bytes exceeds the bound")]
    TooLarge(usize),
}

/// Writes one length-prefixed frame.
pub async fn write_frame(
    writer: &mut (impl AsyncWrite + Unpin),
    parts: &[&[u8]],
) -> Result<(), FrameError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    for part in parts {
        frame.extend_from_slice(part);
    }
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one length-prefixed frame; `None` on a clean end of stream before its first byte.
pub async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
    max: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut prefix[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        got += n;
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Byte fields as standard base64 with padding.
pub mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes bytes as base64.
    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// Deserializes base64 into bytes.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::protocol::decode_strict;

    fn claim() -> ClaimTuple {
        ClaimTuple {
            claim_id: "c".into(),
            run_id: "r".into(),
            epoch: 1,
            grant_generation: 1,
        }
    }

    #[test]
    fn requests_round_trip_strictly() {
        let request = SupervisorRequest::Stdin {
            command_id: "op-1".into(),
            claim: claim(),
            data: b"hi\n".to_vec(),
            close: true,
        };
        let json = serde_json::to_vec(&request).unwrap();
        assert_eq!(decode_strict::<SupervisorRequest>(&json).unwrap(), request);
        let unknown = br#"{"op":"journal","command_id":"x","seal":false,"extra":1}"#;
        assert!(decode_strict::<SupervisorRequest>(unknown).is_err());
        let duplicate = br#"{"op":"journal","command_id":"x","command_id":"y"}"#;
        assert!(decode_strict::<SupervisorRequest>(duplicate).is_err());
        let word = br#"{"op":"format_disk"}"#;
        assert!(decode_strict::<SupervisorRequest>(word).is_err());
    }

    #[test]
    fn tags_bind_secret_direction_index_nonce_and_body() {
        let binding = Binding {
            boot_id: vec![1; 16],
            nonce: vec![2; 32],
        };
        let secret = [7u8; 32];
        let tag = binding.tag(&secret, Direction::Request, 0, b"body");
        assert!(binding.verify(&secret, Direction::Request, 0, b"body", &tag));
        assert!(!binding.verify(&[8u8; 32], Direction::Request, 0, b"body", &tag));
        assert!(!binding.verify(&secret, Direction::Reply, 0, b"body", &tag));
        assert!(!binding.verify(&secret, Direction::Request, 1, b"body", &tag));
        assert!(!binding.verify(&secret, Direction::Request, 0, b"bodz", &tag));
        let other = Binding {
            nonce: vec![3; 32],
            ..binding.clone()
        };
        assert!(!other.verify(&secret, Direction::Request, 0, b"body", &tag));
    }

    #[test]
    fn secrets_are_per_pod_and_their_ids_do_not_reveal_them() {
        let a = derive_secret(b"k", "ns", "executor-a", "uid-1");
        assert_eq!(a, derive_secret(b"k", "ns", "executor-a", "uid-1"));
        assert_ne!(a, derive_secret(b"k", "ns", "executor-a", "uid-2"));
        assert_ne!(a, derive_secret(b"k2", "ns", "executor-a", "uid-1"));
        // The separators keep the parts apart.
        assert_ne!(
            derive_secret(b"k", "ns", "a", "b"),
            derive_secret(b"k", "ns", "a\0b", "")
        );
        assert_eq!(secret_id(&a).len(), 16);
        assert_eq!(parse_secret(&hex::encode(a)), Some(a));
        assert_eq!(parse_secret("00"), None);
    }

    #[test]
    fn the_receipt_binds_id_state_exit_code_and_each_stream() {
        let base = command_receipt("id", CommandState::Succeeded, 0, b"out", b"err");
        assert_ne!(
            base,
            command_receipt("id2", CommandState::Succeeded, 0, b"out", b"err")
        );
        assert_ne!(
            base,
            command_receipt("id", CommandState::Failed, 0, b"out", b"err")
        );
        assert_ne!(
            base,
            command_receipt("id", CommandState::Succeeded, 1, b"out", b"err")
        );
        assert_ne!(
            base,
            command_receipt("id", CommandState::Succeeded, 0, b"ou", b"terr")
        );
        let mut digest = OutputDigest::default();
        digest.update(OutputStream::Stdout, b"o");
        digest.update(OutputStream::Stderr, b"err");
        digest.update(OutputStream::Stdout, b"ut");
        assert_eq!(digest.receipt("id", CommandState::Succeeded, 0, 6), base);
    }

    #[test]
    fn start_requests_never_print_variable_values() {
        let start = StartRequest {
            command_id: "op".into(),
            claim: claim(),
            lease_ms: 1000,
            command: "env".into(),
            env: vec![("TOKEN".into(), "s3cr3t-value".into())],
            working_dir: String::new(),
            timeout_ms: 0,
            stdin: false,
            pty: None,
            window_bytes: 0,
            request_digest: String::new(),
            replay_only: false,
        };
        let printed = format!("{start:?}");
        assert!(printed.contains("TOKEN"), "{printed}");
        assert!(!printed.contains("s3cr3t-value"), "{printed}");
    }

    #[test]
    fn ids_and_variable_names_are_checked() {
        assert!(valid_command_id("op-1.a_b:c"));
        assert!(!valid_command_id(""));
        assert!(!valid_command_id("a/b"));
        assert!(!valid_command_id(&"a".repeat(MAX_COMMAND_ID + 1)));
        assert!(valid_env_name("_A1"));
        assert!(!valid_env_name("1A"));
        assert!(!valid_env_name("A=B"));
        assert!(!valid_env_name(""));
    }
}
