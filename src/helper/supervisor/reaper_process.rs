//! `execution-helper reap-command`: the per-command sub-reaper (docs/commands.md §8).
//!
//! Started by the supervisor with one end of a socketpair as stdin and stdout. It makes itself
//! non-dumpable and a child subreaper, dies with its parent, reads one [`ToReaper::Start`],
//! runs `/bin/sh -c` in its own process group (or, on a terminal, as the leader of a new session
//! whose controlling terminal is a fresh PTY: [`terminal`]), and pumps stdin and output over the
//! socketpair.
//! When the shell exits, on cancel, on timeout or when the supervisor goes away it kills the
//! whole tree and reaps until `ECHILD`: every orphan of the command, however it forked or
//! `setsid`ed, is reparented to this process, so `ECHILD` proves the command's end.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};

use super::reaper_wire::{FromReaper, MAX_REAPER_FRAME, ToReaper};
use super::terminal::{self, Terminal};
use crate::executor::protocol::{ErrorCode, ExecutorError, decode_strict};
use crate::executor::supervisor_protocol::{
    CommandSignal, MAX_CHUNK, OutputStream, PtySize, read_frame, write_frame,
};
use crate::helper::command::{COMMAND_PATH, COMMAND_TMPDIR, PIPE_DRAIN_DELAY, SHELL};
use crate::helper::reaper::{self, SWEEP_WINDOW};
use crate::helper::workspace::Workspace;

/// Frames queued towards the supervisor.
const UP_FRAMES: usize = 64;
/// `TERM` of a command on a terminal, unless its own variables set another.
const TERMINAL_TYPE: &str = "xterm-256color";

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
        pty,
    } = decode_strict::<ToReaper>(&frame)?
    else {
        return Err("the first frame must be a start".into());
    };
    let shell = ShellSpec {
        command: &command,
        env: &env,
        working_dir: &working_dir,
        stdin,
        pty,
    };
    let (mut child, terminal) = match spawn_shell(root, &shell) {
        Ok(spawned) => spawned,
        Err(error) => {
            let _ = up.send(FromReaper::Refused { error }).await;
            drop(up);
            let _ = writer.await;
            return Ok(());
        }
    };
    let terminal = terminal.map(Arc::new);
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    let _ = up.send(FromReaper::Started).await;
    let (pumps, input) = connect_stdio(&mut child, terminal.as_ref(), &up);
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    tokio::spawn(feed_stdin(input, stdin_rx, up.clone()));
    let (cancel_tx, cancel_rx) = watch::channel(None::<Duration>);
    let target = Target { group, terminal };
    tokio::spawn(read_control(link_in, target, stdin_tx, cancel_tx));

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

/// Starts pumping the command's output up (its terminal, or its two pipes) and returns the
/// pumps and where its stdin goes.
fn connect_stdio(
    child: &mut Child,
    terminal: Option<&Arc<Terminal>>,
    up: &mpsc::Sender<FromReaper>,
) -> (Vec<tokio::task::JoinHandle<()>>, Option<Input>) {
    match terminal {
        Some(terminal) => (
            vec![tokio::spawn(pump_terminal(terminal.clone(), up.clone()))],
            Some(Input::Terminal(terminal.clone())),
        ),
        None => (
            vec![
                tokio::spawn(pump(child.stdout.take(), OutputStream::Stdout, up.clone())),
                tokio::spawn(pump(child.stderr.take(), OutputStream::Stderr, up.clone())),
            ],
            child.stdin.take().map(Input::Pipe),
        ),
    }
}

trait AsFdOwned {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd>;
}

impl<T: std::os::fd::AsFd> AsFdOwned for T {
    fn as_fd_owned(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.as_fd().try_clone_to_owned()
    }
}

/// What the start frame asks to run.
struct ShellSpec<'a> {
    command: &'a str,
    env: &'a [(String, String)],
    working_dir: &'a str,
    stdin: bool,
    pty: Option<PtySize>,
}

fn spawn_shell(
    root: &Path,
    spec: &ShellSpec<'_>,
) -> Result<(Child, Option<Terminal>), ExecutorError> {
    let refused = |code, message: &str| ExecutorError::new(code, message);
    let workspace = Workspace::open(root)
        .map_err(|_| refused(ErrorCode::Internal, "workspace is not available"))?;
    let relative = workspace
        .resolve(spec.working_dir)
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
        .arg(spec.command)
        .current_dir(&directory)
        .env_clear()
        .env("HOME", root)
        .env("PATH", COMMAND_PATH)
        .env("TMPDIR", COMMAND_TMPDIR)
        .env("GOTMPDIR", COMMAND_TMPDIR);
    let not_started = || refused(ErrorCode::Internal, "command could not be started");
    let terminal = match spec.pty {
        Some(size) => {
            let (terminal, side) = terminal::open(size).map_err(|_| not_started())?;
            let [input, output, errors] = side.stdio().map_err(|_| not_started())?;
            // A terminal type the request's own variables may override.
            shell
                .env("TERM", TERMINAL_TYPE)
                .stdin(input)
                .stdout(output)
                .stderr(errors);
            terminal::become_session_leader_on_start(&mut shell);
            Some(terminal)
        }
        None => {
            shell
                .stdin(if spec.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            None
        }
    };
    shell
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .kill_on_drop(true);
    // `shell` (and with it this process's copies of the terminal side) is dropped on return,
    // so the terminal's output ends when the command's tree has closed it.
    let child = shell.spawn().map_err(|_| not_started())?;
    Ok((child, terminal))
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

/// What control frames act on: the command's process group and its terminal, if any.
struct Target {
    group: Option<Pid>,
    terminal: Option<Arc<Terminal>>,
}

impl Target {
    /// Signals the command's group and, on a terminal, its foreground job's group too.
    fn signal(&self, signal: Signal) {
        let foreground = self.terminal.as_ref().and_then(|t| t.foreground_group());
        for group in [self.group, foreground.filter(|g| Some(*g) != self.group)]
            .into_iter()
            .flatten()
        {
            let _ = rustix::process::kill_process_group(group, signal);
        }
    }
}

async fn read_control(
    mut link_in: tokio::net::unix::OwnedReadHalf,
    target: Target,
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
            Ok(ToReaper::Signal { signal }) => target.signal(to_signal(signal)),
            Ok(ToReaper::Resize { size }) => {
                if let Some(terminal) = &target.terminal {
                    let _ = terminal.resize(size);
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

/// Where stdin bytes go: the command's pipe, or its terminal (typed input).
enum Input {
    Pipe(ChildStdin),
    Terminal(Arc<Terminal>),
}

impl Input {
    async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Input::Pipe(pipe) => {
                pipe.write_all(data).await?;
                pipe.flush().await
            }
            Input::Terminal(terminal) => terminal.write_all(data).await,
        }
    }

    /// Closes a pipe; on a terminal, types its end-of-file character (the terminal stays).
    async fn close(self) {
        match self {
            Input::Pipe(pipe) => drop(pipe),
            Input::Terminal(terminal) => {
                let _ = terminal.write_all(&[terminal.eof_character()]).await;
            }
        }
    }
}

async fn feed_stdin(
    input: Option<Input>,
    mut requests: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    up: mpsc::Sender<FromReaper>,
) {
    let Some(mut input) = input else {
        return;
    };
    let closed = loop {
        match requests.recv().await {
            Some(Some(data)) => {
                if input.write(&data).await.is_err() {
                    break false;
                }
                let _ = up
                    .send(FromReaper::StdinWritten {
                        bytes: data.len() as u64,
                    })
                    .await;
            }
            Some(None) => break true,
            // The supervisor is gone: the command is being ended.
            None => break false,
        }
    };
    if closed {
        input.close().await;
    }
    let _ = up.send(FromReaper::StdinClosed).await;
}

async fn pump_terminal(terminal: Arc<Terminal>, up: mpsc::Sender<FromReaper>) {
    let mut buffer = vec![0u8; MAX_CHUNK];
    loop {
        match terminal.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let data = buffer[..n].to_vec();
                let frame = FromReaper::Output {
                    stream: OutputStream::Pty,
                    data,
                };
                if up.send(frame).await.is_err() {
                    break;
                }
            }
        }
    }
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
