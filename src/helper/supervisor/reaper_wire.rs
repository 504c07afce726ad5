//! The frames between the supervisor and one command reaper, over the socketpair that is the
//! reaper's stdin and stdout: length-prefixed strict JSON ([`crate::executor::supervisor_protocol::write_frame`]).
//! The reaper is the supervisor's own child, so these frames are not tagged.

use serde::{Deserialize, Serialize};

use crate::executor::protocol::ExecutorError;
use crate::executor::supervisor_protocol::{CommandSignal, OutputStream, PtySize, base64_bytes};

/// Largest frame on the reaper link.
pub const MAX_REAPER_FRAME: usize = 1024 * 1024;

/// Supervisor to reaper.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToReaper {
    /// The command; the first frame and only once.
    Start {
        /// Shell text.
        command: String,
        /// Extra variables.
        env: Vec<(String, String)>,
        /// Working directory relative to the workspace.
        working_dir: String,
        /// Timeout in ms; 0 means none.
        timeout_ms: u64,
        /// Give the command a stdin pipe.
        stdin: bool,
        /// Run the command on a new terminal of this size (stdin, stdout and stderr merged).
        #[serde(default)]
        pty: Option<PtySize>,
    },
    /// Bytes for the command's stdin.
    Stdin {
        /// The bytes.
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// Close the command's stdin.
    CloseStdin,
    /// Send a signal to the command's process group.
    Signal {
        /// Which.
        signal: CommandSignal,
    },
    /// Set the window size of the command's terminal.
    Resize {
        /// The new size.
        size: PtySize,
    },
    /// SIGTERM to the tree, `grace_ms`, then SIGKILL and the proof.
    Cancel {
        /// The grace.
        grace_ms: u64,
    },
}

impl std::fmt::Debug for ToReaper {
    /// Never prints variable values or stdin bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToReaper::Start { env, .. } => write!(f, "Start({} variables)", env.len()),
            ToReaper::Stdin { data } => write!(f, "Stdin({} bytes)", data.len()),
            ToReaper::CloseStdin => f.write_str("CloseStdin"),
            ToReaper::Signal { signal } => write!(f, "Signal({signal:?})"),
            ToReaper::Resize { size } => write!(f, "Resize({}x{})", size.rows, size.cols),
            ToReaper::Cancel { grace_ms } => write!(f, "Cancel({grace_ms} ms)"),
        }
    }
}

/// Reaper to supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromReaper {
    /// The shell runs.
    Started,
    /// The start was refused; nothing runs.
    Refused {
        /// Why.
        error: ExecutorError,
    },
    /// Output of the command.
    Output {
        /// Its stream.
        stream: OutputStream,
        /// The bytes.
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// Stdin bytes written to the command.
    StdinWritten {
        /// How many.
        bytes: u64,
    },
    /// The command's stdin is closed (by request, or the command stopped reading).
    StdinClosed,
    /// The command ended; the last frame.
    Ended {
        /// Exit code; -1 for a signal.
        exit_code: i32,
        /// Ended by cancel or timeout.
        interrupted: bool,
        /// Nothing of its tree is left.
        proven: bool,
    },
}
