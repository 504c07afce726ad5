//! Starting one command reaper and following it: the supervisor's side of the reaper link
//! (docs/commands.md §8), and the sweep of orphans a killed reaper leaves behind.
//!
//! Where a reaper runs is a seam ([`ReaperHost`]): in an executor it is
//! `execution-helper reap-command`, a child process on a socketpair ([`ProcessReapers`]); the
//! simulator's executor node plugs in a model of it that speaks the same [`reaper_wire`]
//! frames, so that the supervisor's journal, claim deadlines and cancels run there unchanged.
//!
//! [`reaper_wire`]: super::reaper_wire

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use super::journal::CommandEntry;
use super::reaper_wire::{FromReaper, MAX_REAPER_FRAME, ToReaper};
use crate::executor::BoxFuture;
use crate::executor::protocol::{ErrorCode, ExecutorError, decode_strict};
use crate::executor::supervisor_protocol::{StartRequest, read_frame, write_frame};
use crate::helper::reaper::{self, SWEEP_POLL, SWEEP_WINDOW};
use crate::runtime::Clock;

/// The pids of the live reapers: every other child of the supervisor is an orphan.
pub type ReaperPids = Arc<Mutex<BTreeSet<i32>>>;
/// The supervisor's reading side of a reaper link.
pub type LinkReader = Box<dyn AsyncRead + Send + Unpin>;
/// The supervisor's writing side of a reaper link.
pub type LinkWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Starts the reaper of each command.
pub trait ReaperHost: Send + Sync + 'static {
    /// Starts a reaper for the command `start` asks for (the reaper learns the command itself
    /// from the link's first frame, [`ToReaper::Start`]).
    fn launch(&self, start: &StartRequest) -> Result<Launch, ExecutorError>;
}

/// A started reaper's end, once its link has closed.
pub trait ReaperLife: Send + 'static {
    /// The link closed; `ended` says whether the reaper sent its last frame. Kills the reaper
    /// if it did not, waits until it is gone and, when `sweep`, answers whether every process
    /// it left behind is gone too (else the answer is not used).
    fn close(self: Box<Self>, ended: bool, sweep: bool) -> BoxFuture<'static, bool>;
}

/// A started reaper: the control channel to give its entry, its link and its life.
pub struct Launch {
    /// Frames to the reaper.
    pub control: mpsc::UnboundedSender<ToReaper>,
    receiver: mpsc::UnboundedReceiver<ToReaper>,
    reader: LinkReader,
    writer: LinkWriter,
    life: Box<dyn ReaperLife>,
}

impl Launch {
    /// A reaper reached over `reader` and `writer`, ending as `life` says.
    pub fn new(reader: LinkReader, writer: LinkWriter, life: Box<dyn ReaperLife>) -> Self {
        let (control, receiver) = mpsc::unbounded_channel();
        Launch {
            control,
            receiver,
            reader,
            writer,
            life,
        }
    }
}

/// Reapers as child processes: `helper reap-command --workspace root --parent <our pid>` on a
/// socketpair, registered in `pids`.
pub struct ProcessReapers {
    /// The helper binary.
    pub helper: PathBuf,
    /// The workspace root.
    pub root: PathBuf,
    /// The live reapers.
    pub pids: ReaperPids,
}

impl ReaperHost for ProcessReapers {
    fn launch(&self, _start: &StartRequest) -> Result<Launch, ExecutorError> {
        launch(&self.helper, &self.root, &self.pids)
    }
}

/// One reaper process.
struct ReaperProcess {
    child: Child,
    pids: ReaperPids,
}

impl ReaperLife for ReaperProcess {
    fn close(self: Box<Self>, ended: bool, sweep: bool) -> BoxFuture<'static, bool> {
        let ReaperProcess { mut child, pids } = *self;
        Box::pin(async move {
            let pid = child.id().and_then(|id| i32::try_from(id).ok());
            if !ended {
                // The reaper died without its last frame (killed by the workload, or it
                // failed): its orphans are ours now.
                let _ = child.start_kill();
            }
            let _ = child.wait().await;
            if let Some(pid) = pid {
                pids.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
            }
            sweep && sweep_orphans(&pids, SWEEP_WINDOW).await
        })
    }
}

/// Starts `helper reap-command --workspace root --parent <our pid>` on a socketpair.
fn launch(helper: &Path, root: &Path, pids: &ReaperPids) -> Result<Launch, ExecutorError> {
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
    let (reader, writer) = link.into_split();
    let life = ReaperProcess {
        child,
        pids: pids.clone(),
    };
    Ok(Launch::new(
        Box::new(reader),
        Box::new(writer),
        Box::new(life),
    ))
}

/// Follows the reaper of `entry` until it ended: `started` learns whether the shell runs.
pub fn follow(
    launch: Launch,
    entry: Arc<CommandEntry>,
    started: oneshot::Sender<Result<(), ExecutorError>>,
    clock: Arc<dyn Clock>,
) {
    let Launch {
        receiver,
        reader,
        writer,
        life,
        ..
    } = launch;
    tokio::spawn(write_down(writer, receiver));
    tokio::spawn(read_up(reader, life, entry, started, clock));
}

async fn write_down(mut writer: LinkWriter, mut frames: mpsc::UnboundedReceiver<ToReaper>) {
    while let Some(frame) = frames.recv().await {
        let body = serde_json::to_vec(&frame).expect("reaper frames encode");
        if write_frame(&mut writer, &[&body]).await.is_err() {
            break;
        }
    }
}

async fn read_up(
    mut reader: LinkReader,
    life: Box<dyn ReaperLife>,
    entry: Arc<CommandEntry>,
    started: oneshot::Sender<Result<(), ExecutorError>>,
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
    // A reaper that never started its command left nothing to sweep.
    let proven = life.close(ended, !ended && started.is_none()).await;
    if let Some(started) = started.take() {
        let _ = started.send(Err(ExecutorError::new(
            ErrorCode::Internal,
            "command could not be started",
        )));
        return;
    }
    if !ended {
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
