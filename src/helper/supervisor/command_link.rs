//! Starting one command reaper and following it: the supervisor's side of the reaper link
//! (docs/commands.md §8), and the sweep of orphans a killed reaper leaves behind.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use super::journal::CommandEntry;
use super::reaper_wire::{FromReaper, MAX_REAPER_FRAME, ToReaper};
use crate::executor::protocol::{ErrorCode, ExecutorError, decode_strict};
use crate::executor::supervisor_protocol::{read_frame, write_frame};
use crate::helper::reaper::{self, SWEEP_POLL, SWEEP_WINDOW};
use crate::runtime::Clock;

/// The pids of the live reapers: every other child of the supervisor is an orphan.
pub type ReaperPids = Arc<Mutex<BTreeSet<i32>>>;

/// A started reaper: the control channel to give its entry, and the task that follows it.
pub struct Launch {
    /// Frames to the reaper.
    pub control: mpsc::UnboundedSender<ToReaper>,
    receiver: mpsc::UnboundedReceiver<ToReaper>,
    child: Child,
    link: tokio::net::UnixStream,
}

/// Starts `helper reap-command --workspace root --parent <our pid>` on a socketpair.
pub fn launch(helper: &Path, root: &Path, pids: &ReaperPids) -> Result<Launch, ExecutorError> {
    let failed = || ExecutorError::new(ErrorCode::Internal, "command could not be started");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|_| failed())?;
    let theirs_out = theirs.try_clone().map_err(|_| failed())?;
    // Spawned and registered under the lock, so a concurrent orphan sweep (which lists the
    // children before it takes the lock) never sees an unregistered reaper.
    let mut live = pids.lock().unwrap_or_else(|e| e.into_inner());
    let child = Command::new(helper)
        .arg("reap-command")
        .arg("--workspace")
        .arg(root)
        .arg("--parent")
        .arg(rustix::process::getpid().as_raw_nonzero().get().to_string())
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(OwnedFd::from(theirs_out)))
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|_| failed())?;
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        live.insert(pid);
    }
    drop(live);
    ours.set_nonblocking(true).map_err(|_| failed())?;
    let link = tokio::net::UnixStream::from_std(ours).map_err(|_| failed())?;
    let (control, receiver) = mpsc::unbounded_channel();
    Ok(Launch {
        control,
        receiver,
        child,
        link,
    })
}

/// Follows the reaper of `entry` until it ended: `started` learns whether the shell runs.
pub fn follow(
    launch: Launch,
    entry: Arc<CommandEntry>,
    started: oneshot::Sender<Result<(), ExecutorError>>,
    pids: ReaperPids,
    clock: Arc<dyn Clock>,
) {
    let Launch {
        receiver,
        child,
        link,
        ..
    } = launch;
    let (reader, writer) = link.into_split();
    tokio::spawn(write_down(writer, receiver));
    tokio::spawn(read_up(reader, child, entry, started, pids, clock));
}

async fn write_down(mut writer: OwnedWriteHalf, mut frames: mpsc::UnboundedReceiver<ToReaper>) {
    while let Some(frame) = frames.recv().await {
        let body = serde_json::to_vec(&frame).expect("reaper frames encode");
        if write_frame(&mut writer, &[&body]).await.is_err() {
            break;
        }
    }
}

async fn read_up(
    mut reader: OwnedReadHalf,
    mut child: Child,
    entry: Arc<CommandEntry>,
    started: oneshot::Sender<Result<(), ExecutorError>>,
    pids: ReaperPids,
    clock: Arc<dyn Clock>,
) {
    let mut started = Some(started);
    let mut ended = false;
    while let Ok(Some(frame)) = read_frame(&mut reader, MAX_REAPER_FRAME).await {
        let Ok(frame) = decode_strict::<FromReaper>(&frame) else {
            break;
        };
        match frame {
            FromReaper::Started => {
                if let Some(started) = started.take() {
                    let _ = started.send(Ok(()));
                }
            }
            FromReaper::Refused { error } => {
                // Nothing ran: there is nothing to sweep.
                ended = true;
                if let Some(started) = started.take() {
                    let _ = started.send(Err(error));
                }
            }
            FromReaper::Output { stream, data } => entry.push_output(stream, &data),
            FromReaper::StdinWritten { bytes } => entry.stdin_written(bytes as usize),
            FromReaper::StdinClosed => entry.close_stdin(),
            FromReaper::Ended {
                exit_code,
                interrupted,
                proven,
            } => {
                entry.finish(exit_code, interrupted, proven, now_ms(&*clock));
                ended = true;
            }
        }
    }
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    if !ended {
        // The reaper died without its last frame (killed by the workload, or it failed): its
        // orphans are ours now.
        let _ = child.start_kill();
    }
    let _ = child.wait().await;
    if let Some(pid) = pid {
        pids.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
    }
    if let Some(started) = started.take() {
        let _ = started.send(Err(ExecutorError::new(
            ErrorCode::Internal,
            "command could not be started",
        )));
        return;
    }
    if !ended {
        let proven = sweep_orphans(&pids, SWEEP_WINDOW).await;
        entry.finish(-1, true, proven, now_ms(&*clock));
    }
}

/// Kills and reaps every child of the supervisor that is not a live reaper, until none is left
/// (true) or `window` passes (false).
pub async fn sweep_orphans(pids: &ReaperPids, window: Duration) -> bool {
    let sweep = async {
        loop {
            let children = reaper::direct_children();
            let live = pids.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let orphans: Vec<Pid> = children
                .into_iter()
                .filter(|pid| !live.contains(&pid.as_raw_nonzero().get()))
                .collect();
            if orphans.is_empty() {
                return true;
            }
            for orphan in orphans {
                let _ = rustix::process::kill_process(orphan, Signal::KILL);
                let _ = rustix::process::waitpid(Some(orphan), WaitOptions::NOHANG);
            }
            tokio::time::sleep(SWEEP_POLL).await;
        }
    };
    tokio::time::timeout(window, sweep).await.unwrap_or(false)
}

/// Unix milliseconds of the clock.
pub fn now_ms(clock: &dyn Clock) -> i64 {
    i64::try_from(clock.unix().as_millis()).unwrap_or(i64::MAX)
}
