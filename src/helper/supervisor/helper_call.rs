//! One call of the one-shot helper, run by the supervisor inside its own environment.
//!
//! In a `dev` sandbox the supervisor is the sandbox's init, so a file operation or a
//! foreground command of the local transport need not build a sandbox of its own: the
//! supervisor starts `execution-helper --workspace <root>` as its child (already confined:
//! same namespaces, Landlock domain, seccomp filter and pids cgroup), feeds it the request
//! exactly as the local transport would (the request, then `\n` and stdin held open for a
//! foreground command, whose cancel is stdin's close), and streams its stdout back. The
//! helper's pid is registered with the reapers', so the orphan sweep leaves it alone; when it
//! dies by a signal, what its command left behind is swept like a killed reaper's.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

use super::command_link::{ReaperPids, sweep_orphans};
use crate::executor::protocol::{ErrorCode, ExecutorError, MAX_JSON_BODY};
use crate::executor::supervisor_protocol::MAX_CALL_CHUNK;
use crate::helper::reaper::SWEEP_WINDOW;

/// Most helper stderr kept (the local transport's bound).
pub const MAX_CALL_STDERR: usize = 64 * 1024;
/// How long a helper whose caller went away gets to cancel and answer before it is killed.
pub const ABANDONED_CALL_GRACE: Duration = Duration::from_secs(5);

/// What a running call reports, in order: output, then exactly one end.
#[derive(Debug)]
pub enum CallEvent {
    /// Bytes of the helper's stdout.
    Output(Vec<u8>),
    /// The helper exited with this status (128 + signal when killed) and stderr.
    Ended {
        /// The exit status.
        exit_code: i32,
        /// Its stderr, bounded.
        stderr: Vec<u8>,
    },
}

/// A started call.
pub struct CallRun {
    /// Its events; dropping the receiver abandons the call.
    pub events: mpsc::Receiver<CallEvent>,
    cancel: Arc<watch::Sender<bool>>,
}

impl CallRun {
    /// Closes the helper's stdin (a foreground command is cancelled).
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }
}

/// A fresh cancel switch for [`start`]: firing it closes the helper's stdin.
pub fn canceller() -> Arc<watch::Sender<bool>> {
    Arc::new(watch::channel(false).0)
}

/// Starts the one-shot `helper` on `root` with `request` on its stdin; `cancel` (from
/// [`canceller`]) closes its stdin when fired.
pub fn start(
    helper: &Path,
    root: &Path,
    pids: &ReaperPids,
    request: Vec<u8>,
    (hold_stdin, cancel): (bool, Arc<watch::Sender<bool>>),
) -> Result<CallRun, ExecutorError> {
    let failed = || ExecutorError::new(ErrorCode::Internal, "the helper could not be started");
    // Spawned and registered under the lock, as reapers are (an orphan sweep lists the
    // children before it takes the lock).
    let mut live = pids.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(helper)
        .arg("--workspace")
        .arg(root)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|_| failed())?;
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    if let Some(pid) = pid {
        live.insert(pid);
    }
    drop(live);
    let (events, receiver) = mpsc::channel(4);
    let cancelled = cancel.subscribe();
    let closer = cancel.clone();
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut held = cancelled.clone();
    tokio::spawn(async move {
        if stdin.write_all(&request).await.is_ok() && hold_stdin {
            let open = stdin.write_all(b"\n").await.is_ok() && stdin.flush().await.is_ok();
            if open {
                let _ = held.wait_for(|c| *c).await;
            }
        }
        drop(stdin);
    });
    let pids = pids.clone();
    tokio::spawn(async move {
        let stderr = tokio::spawn(read_bounded(stderr, MAX_CALL_STDERR));
        let abandoned = pump(stdout, &events, &closer).await;
        let status = if abandoned {
            match tokio::time::timeout(ABANDONED_CALL_GRACE, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            }
        } else {
            child.wait().await
        };
        if let Some(pid) = pid {
            pids.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
        }
        let exit_code = exit_code_of(status);
        if exit_code > 128 {
            // Killed: its command's orphans are the supervisor's children now.
            sweep_orphans(&pids, SWEEP_WINDOW).await;
        }
        let stderr = stderr.await.unwrap_or_default();
        let _ = events.send(CallEvent::Ended { exit_code, stderr }).await;
        drop(cancelled);
    });
    Ok(CallRun {
        events: receiver,
        cancel,
    })
}

/// Forwards stdout as events until EOF; returns true when the caller went away (stdin is then
/// closed so the helper cancels) or the output passed its bound (the helper is then left to
/// be killed after the grace).
async fn pump(
    mut stdout: impl AsyncRead + Unpin,
    events: &mpsc::Sender<CallEvent>,
    cancel: &watch::Sender<bool>,
) -> bool {
    let mut total = 0usize;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match stdout.read(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => read,
        };
        total += read;
        let gone = events
            .send(CallEvent::Output(buffer[..read].to_vec()))
            .await
            .is_err();
        if gone || total > MAX_JSON_BODY {
            cancel.send_replace(true);
            // Drain so the helper never blocks on a full pipe while it cancels.
            let mut sink = tokio::io::sink();
            let _ = tokio::time::timeout(
                ABANDONED_CALL_GRACE,
                tokio::io::copy(&mut stdout, &mut sink),
            )
            .await;
            return true;
        }
        debug_assert!(read <= MAX_CALL_CHUNK);
    }
}

async fn read_bounded(mut reader: impl AsyncRead + Unpin, limit: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(read) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..read.min(room)]);
            }
        }
    }
}

fn exit_code_of(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 255,
        },
        Err(_) => 255,
    }
}
