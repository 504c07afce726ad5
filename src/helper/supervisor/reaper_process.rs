//! `execution-helper reap-command`: the per-command sub-reaper (docs/commands.md §8).
//!
//! Started by the supervisor with one end of a socketpair as stdin and stdout. It makes itself
//! non-dumpable and a child subreaper, dies with its parent, reads one [`ToReaper::Start`],
//! runs `/bin/sh -c` in its own process group, and pumps stdin and output over the socketpair.
//! When the shell exits, on cancel, on timeout or when the supervisor goes away it kills the
//! whole tree and reaps until `ECHILD`: every orphan of the command, however it forked or
//! `setsid`ed, is reparented to this process, so `ECHILD` proves the command's end.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};

use super::reaper_wire::{FromReaper, MAX_REAPER_FRAME, ToReaper};
use crate::executor::protocol::{ErrorCode, ExecutorError, decode_strict};
use crate::executor::supervisor_protocol::{
    CommandSignal, MAX_CHUNK, OutputStream, read_frame, write_frame,
};
use crate::helper::command::{COMMAND_PATH, COMMAND_TMPDIR, PIPE_DRAIN_DELAY, SHELL};
use crate::helper::reaper::{self, SWEEP_WINDOW};
use crate::helper::workspace::Workspace;

/// Frames queued towards the supervisor.
const UP_FRAMES: usize = 64;

/// The reaper process: returns its exit code.
pub fn main(root: PathBuf, parent: i32) -> ExitCode {
    super::harden();
    let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    let subreaper = reaper::become_subreaper();
    // The supervisor may have died before the death signal was armed.
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent) {
        return ExitCode::from(3);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return ExitCode::from(1),
    };
    match runtime.block_on(run(&root, subreaper)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

type LinkResult<T> = Result<T, Box<dyn std::error::Error>>;

async fn run(root: &Path, subreaper: bool) -> LinkResult<()> {
    let link = std::os::unix::net::UnixStream::from(std::io::stdin().as_fd_owned()?);
    link.set_nonblocking(true)?;
    let (mut link_in, link_out) = tokio::net::UnixStream::from_std(link)?.into_split();
    // Bounded: a supervisor that reads slowly slows the command's output, never grows memory.
    let (up, up_rx) = mpsc::channel::<FromReaper>(UP_FRAMES);
    let writer = tokio::spawn(write_up(link_out, up_rx));

    let Some(frame) = read_frame(&mut link_in, MAX_REAPER_FRAME).await? else {
        return Ok(());
    };
    let ToReaper::Start {
        command,
        env,
        working_dir,
        timeout_ms,
        stdin,
    } = decode_strict::<ToReaper>(&frame)?
    else {
        return Err("the first frame must be a start".into());
    };
    let mut child = match spawn_shell(root, &command, &env, &working_dir, stdin) {
        Ok(child) => child,
        Err(error) => {
            let _ = up.send(FromReaper::Refused { error }).await;
            drop(up);
            let _ = writer.await;
            return Ok(());
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    let _ = up.send(FromReaper::Started).await;
    let pumps = [
        tokio::spawn(pump(child.stdout.take(), OutputStream::Stdout, up.clone())),
        tokio::spawn(pump(child.stderr.take(), OutputStream::Stderr, up.clone())),
    ];
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    tokio::spawn(feed_stdin(child.stdin.take(), stdin_rx, up.clone()));
    let (cancel_tx, cancel_rx) = watch::channel(None::<Duration>);
    tokio::spawn(read_control(link_in, group, stdin_tx, cancel_tx));

    let (exit_code, interrupted) = wait(&mut child, group, timeout_ms, cancel_rx).await;
    if let Some(group) = group {
        reaper::kill_group(group);
    }
    let proven = subreaper && reaper::sweep_children(SWEEP_WINDOW).await;
    let drained = tokio::time::timeout(PIPE_DRAIN_DELAY, async {
        for pump in pumps {
            let _ = pump.await;
        }
    })
    .await
    .is_ok();
    let _ = up
        .send(FromReaper::Ended {
            exit_code: if drained { exit_code } else { -1 },
            interrupted,
            proven: proven && drained,
        })
        .await;
    drop(up);
    let _ = writer.await;
    Ok(())
}

trait AsFdOwned {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd>;
}

impl<T: std::os::fd::AsFd> AsFdOwned for T {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.as_fd().try_clone_to_owned()
    }
}

fn spawn_shell(
    root: &Path,
    command: &str,
    env: &[(String, String)],
    working_dir: &str,
    stdin: bool,
) -> Result<Child, ExecutorError> {
    let refused = |code, message: &str| ExecutorError::new(code, message);
    let workspace = Workspace::open(root)
        .map_err(|_| refused(ErrorCode::Internal, "workspace is not available"))?;
    let relative = workspace
        .resolve(working_dir)
        .map_err(|e| ExecutorError::new(e.code(), "working directory is outside the workspace"))?;
    let directory = workspace
        .canonical(&relative)
        .map_err(|e| ExecutorError::new(e.code(), "working directory is outside the workspace"))?;
    if !directory.is_dir() {
        return Err(refused(
            ErrorCode::InvalidArgument,
            "working directory is not a directory",
        ));
    }
    let mut shell = Command::new(SHELL);
    shell
        .arg("-c")
        .arg(command)
        .current_dir(&directory)
        .env_clear()
        .env("HOME", root)
        .env("PATH", COMMAND_PATH)
        .env("TMPDIR", COMMAND_TMPDIR)
        .env("GOTMPDIR", COMMAND_TMPDIR)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    shell
        .spawn()
        .map_err(|_| refused(ErrorCode::Internal, "command could not be started"))
}

/// Waits for the shell; on cancel or timeout SIGTERMs the tree, waits the grace, then kills.
async fn wait(
    child: &mut Child,
    group: Option<Pid>,
    timeout_ms: u64,
    mut cancel: watch::Receiver<Option<Duration>>,
) -> (i32, bool) {
    let timeout = async {
        if timeout_ms == 0 {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(timeout_ms)).await;
    };
    let grace = tokio::select! {
        status = child.wait() => return (exit_code(status), false),
        () = timeout => Duration::ZERO,
        grace = cancel.wait_for(Option::is_some) => grace.map(|g| g.unwrap_or_default()).unwrap_or_default(),
    };
    if !grace.is_zero() {
        reaper::signal_tree(group, Signal::TERM);
        if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
            return (exit_code(status), true);
        }
    }
    if let Some(group) = group {
        reaper::kill_group(group);
    }
    let _ = child.start_kill();
    (exit_code(child.wait().await), true)
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    status.ok().and_then(|s| s.code()).unwrap_or(-1)
}

async fn read_control(
    mut link_in: tokio::net::unix::OwnedReadHalf,
    group: Option<Pid>,
    stdin: mpsc::UnboundedSender<Option<Vec<u8>>>,
    cancel: watch::Sender<Option<Duration>>,
) {
    loop {
        let frame = match read_frame(&mut link_in, MAX_REAPER_FRAME).await {
            Ok(Some(frame)) => frame,
            // The supervisor is gone: end the command at once.
            _ => break,
        };
        match decode_strict::<ToReaper>(&frame) {
            Ok(ToReaper::Stdin { data }) => {
                let _ = stdin.send(Some(data));
            }
            Ok(ToReaper::CloseStdin) => {
                let _ = stdin.send(None);
            }
            Ok(ToReaper::Signal { signal }) => {
                if let Some(group) = group {
                    let _ = rustix::process::kill_process_group(group, to_signal(signal));
                }
            }
            Ok(ToReaper::Cancel { grace_ms }) => {
                cancel.send_replace(Some(Duration::from_millis(grace_ms.max(1))));
            }
            Ok(ToReaper::Start { .. }) | Err(_) => break,
        }
    }
    cancel.send_replace(Some(Duration::from_millis(1)));
}

/// The OS signal of a [`CommandSignal`].
pub fn to_signal(signal: CommandSignal) -> Signal {
    match signal {
        CommandSignal::Int => Signal::INT,
        CommandSignal::Term => Signal::TERM,
        CommandSignal::Kill => Signal::KILL,
        CommandSignal::Hup => Signal::HUP,
    }
}

async fn feed_stdin(
    pipe: Option<ChildStdin>,
    mut requests: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    up: mpsc::Sender<FromReaper>,
) {
    let Some(mut pipe) = pipe else {
        return;
    };
    while let Some(Some(data)) = requests.recv().await {
        if pipe.write_all(&data).await.is_err() || pipe.flush().await.is_err() {
            break;
        }
        let _ = up
            .send(FromReaper::StdinWritten {
                bytes: data.len() as u64,
            })
            .await;
    }
    drop(pipe);
    let _ = up.send(FromReaper::StdinClosed).await;
}

async fn pump(
    pipe: Option<impl AsyncRead + Unpin>,
    stream: OutputStream,
    up: mpsc::Sender<FromReaper>,
) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buffer = vec![0u8; MAX_CHUNK];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let data = buffer[..n].to_vec();
                if up.send(FromReaper::Output { stream, data }).await.is_err() {
                    break;
                }
            }
        }
    }
}

async fn write_up(mut link_out: OwnedWriteHalf, mut frames: mpsc::Receiver<FromReaper>) {
    while let Some(frame) = frames.recv().await {
        let body = serde_json::to_vec(&frame).expect("reaper frames encode");
        if write_frame(&mut link_out, &[&body]).await.is_err() {
            break;
        }
    }
}
