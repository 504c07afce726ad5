//! `command.start`: one foreground shell command, bounded in time and output, whose cleanup is
//! proven before a terminal receipt is given (k8s-executor §4.3).

use std::future::Future;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::Pid;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::error::HelperError;
use super::output::{CAPTURE_SLACK, Captured, cap_output, capture};
use super::reaper::{self, SWEEP_WINDOW};
use crate::executor::protocol::{
    CommandState, CommandStatus, ExecutorRequest, MAX_COMMAND_BYTES, command_output_cap,
    command_timeout, terminal_receipt,
};

/// The shell every command runs under.
pub const SHELL: &str = "/bin/sh";
/// `PATH` of every command.
pub const COMMAND_PATH: &str = "/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin";
/// `TMPDIR` and `GOTMPDIR` of every command.
pub const COMMAND_TMPDIR: &str = "/tmp";
/// How long the output pipes may stay open after the shell exited and its group was killed.
pub const PIPE_DRAIN_DELAY: Duration = Duration::from_millis(250);

/// Runs the command of `request` in `root`. `cancelled` completes when the caller cancels
/// (stdin closed, a byte after the request, SIGINT or SIGTERM). `subreaper` says whether this
/// process is a child subreaper; without it cleanup cannot be proven.
pub async fn start(
    root: &Path,
    request: &ExecutorRequest,
    cancelled: impl Future<Output = ()>,
    subreaper: bool,
) -> Result<CommandStatus, HelperError> {
    validate(request)?;
    let mut child = match shell(root, &request.command).spawn() {
        Ok(child) => child,
        // A start failure left nothing running: a proven, failed end with a receipt.
        Err(_) => return Ok(finish(request, Run::default(), true)),
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw);
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    // A few bytes past the cap, so a character cut by the capture is not mistaken for an
    // invalid one.
    let capture_cap = command_output_cap(request.limit) + CAPTURE_SLACK;
    let stdout = tokio::spawn(capture(stdout, capture_cap));
    let stderr = tokio::spawn(capture(stderr, capture_cap));

    let timeout = command_timeout(request.timeout_ms);
    let (status, interrupted) = wait_or_interrupt(&mut child, group, timeout, cancelled).await;
    // Always: the whole original group goes, then every reparented orphan.
    if let Some(group) = group {
        reaper::kill_group(group);
    }
    let proven = subreaper && reaper::sweep_children(SWEEP_WINDOW).await;
    let (stdout, stderr, drain_ok) = drain(stdout, stderr).await;
    let run = Run {
        status: Some(status.map_err(|_| ())),
        interrupted,
        drain_ok,
        stdout,
        stderr,
    };
    Ok(finish(request, run, proven))
}

fn validate(request: &ExecutorRequest) -> Result<(), HelperError> {
    if request.command_id.is_empty() {
        return Err(HelperError::InvalidArgument(
            "command_id is required".to_owned(),
        ));
    }
    if request.command.is_empty() || request.command.len() > MAX_COMMAND_BYTES {
        return Err(HelperError::InvalidArgument(format!(
            "command must be 1 to {MAX_COMMAND_BYTES} bytes"
        )));
    }
    Ok(())
}

/// `/bin/sh -c <command>` in `root`, with exactly the fixed environment, no stdin, piped
/// output, and its own process group.
fn shell(root: &Path, command: &str) -> Command {
    let mut shell = Command::new(SHELL);
    shell
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .env_clear()
        .env("HOME", root)
        .env("PATH", COMMAND_PATH)
        .env("TMPDIR", COMMAND_TMPDIR)
        .env("GOTMPDIR", COMMAND_TMPDIR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    shell
}

/// Waits for the shell; on timeout or cancel kills its group and the shell, then waits.
/// Returns the exit status and whether the run was interrupted.
async fn wait_or_interrupt(
    child: &mut Child,
    group: Option<Pid>,
    timeout: Duration,
    cancelled: impl Future<Output = ()>,
) -> (std::io::Result<ExitStatus>, bool) {
    let ended = tokio::select! {
        status = child.wait() => Some(status),
        () = tokio::time::sleep(timeout) => None,
        () = cancelled => None,
    };
    if let Some(status) = ended {
        return (status, false);
    }
    if let Some(group) = group {
        reaper::kill_group(group);
    }
    let _ = child.start_kill();
    (child.wait().await, true)
}

/// Collects both captures, giving the pipes [`PIPE_DRAIN_DELAY`] to close. Returns the
/// captures and whether both ended cleanly.
async fn drain(
    stdout: JoinHandle<Captured>,
    stderr: JoinHandle<Captured>,
) -> (Captured, Captured, bool) {
    let aborts = [stdout.abort_handle(), stderr.abort_handle()];
    match tokio::time::timeout(PIPE_DRAIN_DELAY, async { (stdout.await, stderr.await) }).await {
        Ok((Ok(out), Ok(err))) => {
            let clean = !out.failed && !err.failed;
            (out, err, clean)
        }
        _ => {
            aborts.iter().for_each(|abort| abort.abort());
            (Captured::default(), Captured::default(), false)
        }
    }
}

/// What happened to a started command (the default is "never started").
#[derive(Default)]
struct Run {
    status: Option<Result<ExitStatus, ()>>,
    interrupted: bool,
    drain_ok: bool,
    stdout: Captured,
    stderr: Captured,
}

fn finish(request: &ExecutorRequest, run: Run, proven: bool) -> CommandStatus {
    let (state, exit_code) = match run.status {
        None => (CommandState::Failed, 0),
        Some(status) => {
            let exit_code = match status {
                Ok(status) if run.drain_ok => status.code().unwrap_or(-1),
                _ => -1,
            };
            let state = if run.interrupted {
                CommandState::Cancelled
            } else if exit_code != 0 {
                CommandState::Failed
            } else {
                CommandState::Succeeded
            };
            (state, exit_code)
        }
    };
    let overflowed = run.stdout.overflowed || run.stderr.overflowed;
    let cap = command_output_cap(request.limit);
    let output = cap_output(&run.stdout.bytes, &run.stderr.bytes, cap, overflowed);
    let (state, terminal_receipt) = if proven {
        (
            state,
            terminal_receipt(&request.command_id, &output.stdout, &output.stderr),
        )
    } else {
        (CommandState::FenceUnknown, String::new())
    };
    CommandStatus {
        command_id: request.command_id.clone(),
        state,
        exit_code,
        stdout: output.stdout,
        stderr: output.stderr,
        next_offset: 0,
        truncated: output.truncated,
        terminal_receipt,
    }
}
