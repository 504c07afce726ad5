//! What `execution-helper` does: one request on stdin, one envelope line on stdout
//! (k8s-executor §4.3).
//!
//! The helper is the fixed program inside an executor Pod (and the local process of `dev`). It
//! reads one JSON request (up to 8 MiB, until the first `\n` or EOF), performs it in the
//! workspace with confined file access ([`workspace`], [`files`]) or as a bounded shell command
//! ([`command`]), and writes exactly one [`ExecutorEnvelope`] line. The workspace root comes
//! from the `--workspace` flag set by the launcher, never from the request.

pub mod command;
pub mod durable;
pub mod error;
pub mod files;
pub mod glob;
pub mod output;
pub mod reaper;
pub mod relay;
pub mod search;
pub mod supervisor;
pub mod workspace;

use std::ffi::OsString;
use std::future::Future;
use std::io::{BufRead, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tokio::sync::watch;

use crate::executor::protocol::{
    ExecutorEnvelope, ExecutorRequest, ExecutorResponse, HELPER_FILE_DEADLINE, MAX_COMMAND_OUTPUT,
    MAX_FILE_BYTES, MAX_JSON_BODY, MAX_LIST_ENTRIES, MAX_PATH_BYTES, Operation, decode_strict,
};
use error::{BOUNDS_MESSAGE, HelperError};
use workspace::Workspace;

/// The workspace root when `--workspace` is not given.
pub const DEFAULT_WORKSPACE: &str = "/workspace";
/// Answer to a word only the provider handles.
pub const PROVIDER_ONLY_MESSAGE: &str = "operation is handled by provider, not workload";
/// Answer to a word the helper does not perform.
pub const UNSUPPORTED_MESSAGE: &str = "unsupported executor operation";
/// Answer to a stdin frame over [`MAX_JSON_BODY`].
pub const FRAME_TOO_LARGE_MESSAGE: &str = "executor request exceeds limit";

/// The helper's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperConfig {
    /// The workspace root (`--workspace DIR`, default `/workspace`).
    pub workspace: PathBuf,
    /// Where a relay finds the supervisor (`--supervisor-socket ADDR`, default
    /// [`crate::executor::supervisor_protocol::DEFAULT_SOCKET`]).
    pub supervisor_socket: String,
}

/// Parses `--workspace DIR` / `--workspace=DIR` and `--supervisor-socket ADDR` (the arguments
/// after the program name).
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<HelperConfig, String> {
    let mut workspace = PathBuf::from(DEFAULT_WORKSPACE);
    let mut supervisor_socket = crate::executor::supervisor_protocol::DEFAULT_SOCKET.to_owned();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--workspace" {
            let value = args.next().ok_or("--workspace needs a directory")?;
            workspace = PathBuf::from(value);
        } else if let Some(value) = arg.to_str().and_then(|a| a.strip_prefix("--workspace=")) {
            workspace = PathBuf::from(value);
        } else if arg == "--supervisor-socket" {
            let value = args.next().and_then(|v| v.into_string().ok());
            supervisor_socket = value.ok_or("--supervisor-socket needs an address")?;
        } else {
            return Err(format!("unexpected argument {}", arg.to_string_lossy()));
        }
    }
    if workspace.as_os_str().is_empty() {
        return Err("--workspace must not be empty".to_owned());
    }
    Ok(HelperConfig {
        workspace,
        supervisor_socket,
    })
}

/// The whole helper process: returns its exit code (1 only if stdout cannot be written).
pub fn main_entry() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut listener = None;
    // In `dev` the helper is launched as a sandbox and carries on as its init.
    if crate::sandbox::is_stage(&args) {
        match crate::sandbox::enter(args) {
            crate::sandbox::Entered::Exit(code) => return code,
            crate::sandbox::Entered::Init {
                args: inner,
                listener: bound,
            } => {
                args = inner;
                listener = bound;
            }
        }
    }
    let mut args = args.into_iter().peekable();
    match args.peek().and_then(|a| a.to_str()) {
        Some("supervise") => {
            args.next();
            return supervisor::main(args, listener);
        }
        Some("reap-command") => {
            args.next();
            return reap_command(args);
        }
        _ => {}
    }
    supervisor::harden();
    let config = match parse_args(args) {
        Ok(config) => config,
        Err(problem) => {
            eprintln!("execution-helper: {problem}\nusage: execution-helper [--workspace DIR]");
            return ExitCode::from(2);
        }
    };
    let subreaper = reaper::become_subreaper();
    let frame = read_frame(&mut std::io::stdin().lock());
    if let Ok(open) = &frame
        && decode_strict::<relay::RelayOpen>(open).is_ok_and(|o| o.relay == relay::RELAY_WORD)
    {
        return relay::run(&config.supervisor_socket);
    }

    // After the request, any further byte, EOF or read error on stdin cancels a command.
    let (cancel_sender, cancel_receiver) = watch::channel(false);
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        let _ = std::io::stdin().lock().read(&mut byte);
        cancel_sender.send_replace(true);
    });

    let envelope = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(handle(
            frame,
            &config.workspace,
            cancelled(cancel_receiver),
            subreaper,
        )),
        Err(e) => ExecutorEnvelope::error(HelperError::internal(e.to_string()).to_wire()),
    };
    write_envelope(&envelope)
}

/// `reap-command --workspace DIR --parent PID`: one command's sub-reaper, started by the
/// supervisor.
fn reap_command(args: impl Iterator<Item = OsString>) -> ExitCode {
    let mut workspace = None;
    let mut parent = None;
    let mut args = args;
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.into_string().ok());
        match (arg.to_str(), value) {
            (Some("--workspace"), Some(v)) => workspace = Some(PathBuf::from(v)),
            (Some("--parent"), Some(v)) => parent = v.parse::<i32>().ok(),
            _ => parent = None,
        }
    }
    match (workspace, parent) {
        (Some(workspace), Some(parent)) => supervisor::reaper_process::main(workspace, parent),
        _ => {
            eprintln!("usage: execution-helper reap-command --workspace DIR --parent PID");
            ExitCode::from(2)
        }
    }
}

/// Reads one request frame: bytes up to the first `\n` (not included) or EOF, at most
/// [`MAX_JSON_BODY`].
pub fn read_frame(input: &mut impl BufRead) -> Result<Vec<u8>, HelperError> {
    let mut frame = Vec::new();
    input
        .take(MAX_JSON_BODY as u64 + 1)
        .read_until(b'\n', &mut frame)
        .map_err(|e| HelperError::internal(e.to_string()))?;
    if frame.last() == Some(&b'\n') {
        frame.pop();
    }
    if frame.len() > MAX_JSON_BODY {
        return Err(HelperError::ResourceExhausted(FRAME_TOO_LARGE_MESSAGE));
    }
    Ok(frame)
}

/// Performs one framed request in the workspace at `root` and returns its envelope.
pub async fn handle(
    frame: Result<Vec<u8>, HelperError>,
    root: &Path,
    cancelled: impl Future<Output = ()>,
    subreaper: bool,
) -> ExecutorEnvelope {
    match perform(frame, root, cancelled, subreaper).await {
        Ok(response) => ExecutorEnvelope::response(response),
        Err(error) => ExecutorEnvelope::error(error.to_wire()),
    }
}

async fn perform(
    frame: Result<Vec<u8>, HelperError>,
    root: &Path,
    cancelled: impl Future<Output = ()>,
    subreaper: bool,
) -> Result<ExecutorResponse, HelperError> {
    let request: ExecutorRequest =
        decode_strict(&frame?).map_err(|e| HelperError::InvalidArgument(e.to_string()))?;
    if request.operation == Operation::CommandStart {
        let ws = Workspace::open(root).map_err(|e| HelperError::internal(e.to_string()))?;
        check_bounds(&request)?;
        let status = command::start(ws.root(), &request, cancelled, subreaper).await?;
        return Ok(ExecutorResponse {
            command: Some(status),
            ..ExecutorResponse::default()
        });
    }
    let mutating = mutates_workspace(&request.operation);
    let root = root.to_path_buf();
    within_deadline(HELPER_FILE_DEADLINE, mutating, move || {
        let ws = Workspace::open(&root).map_err(|e| HelperError::internal(e.to_string()))?;
        check_bounds(&request)?;
        file_operation(&ws, &request)
    })
    .await
}

/// Performs one file operation (anything but `command.start`).
fn file_operation(
    ws: &Workspace,
    request: &ExecutorRequest,
) -> Result<ExecutorResponse, HelperError> {
    let path = || ws.resolve(&request.path);
    let destination = || ws.resolve(&request.destination);
    match &request.operation {
        Operation::FileRead => files::read(ws, &path()?),
        Operation::FileStat => files::stat(ws, &path()?),
        Operation::FileCreate => files::create(ws, &path()?, &request.data),
        Operation::FileReplace => files::replace(ws, &path()?, &request.data, &request.version),
        Operation::FileList => files::list(ws, &path()?, effective_limit(request.limit)),
        Operation::FileRemove => files::remove(ws, &path()?),
        Operation::FileRename => files::rename(ws, &path()?, &destination()?),
        Operation::FileCopy => files::copy(ws, &path()?, &destination()?),
        Operation::FileResolveAuthority => files::resolve_authority(ws, &path()?),
        Operation::FileGlob => search::glob(ws, &request.pattern, effective_limit(request.limit)),
        Operation::FileGrep => search::grep(
            ws,
            &request.pattern,
            &request.path,
            effective_limit(request.limit),
        ),
        Operation::Unknown(_) => Err(HelperError::InvalidArgument(UNSUPPORTED_MESSAGE.to_owned())),
        _ => Err(HelperError::InvalidArgument(
            PROVIDER_ONLY_MESSAGE.to_owned(),
        )),
    }
}

/// Whether an operation may change the workspace (so an unfinished one has an unknown effect).
fn mutates_workspace(operation: &Operation) -> bool {
    matches!(
        operation,
        Operation::FileCreate
            | Operation::FileReplace
            | Operation::FileRemove
            | Operation::FileRename
            | Operation::FileCopy
    )
}

/// Runs a blocking file operation on its own thread and answers by `deadline` at the latest: a
/// stalled file system (a hung network volume) cannot keep the helper past the transport's
/// deadline. Past it, a mutating operation answers [`HelperError::Unfinished`] (its effect is
/// unknown, so the provider fences) and a read-only one an internal error; the helper then
/// exits, which ends the thread.
pub async fn within_deadline<T: Send + 'static>(
    deadline: Duration,
    mutating: bool,
    operation: impl FnOnce() -> Result<T, HelperError> + Send + 'static,
) -> Result<T, HelperError> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("file-operation".to_owned())
        .spawn(move || {
            let _ = answer.send(operation());
        })
        .map_err(|e| HelperError::internal(e.to_string()))?;
    match tokio::time::timeout(deadline, answered).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(HelperError::internal(
            "the file operation ended without an answer",
        )),
        Err(_) if mutating => Err(HelperError::Unfinished),
        Err(_) => Err(HelperError::internal("file operation deadline exceeded")),
    }
}

/// The generic request bounds: data, path lengths and the result limit.
pub fn check_bounds(request: &ExecutorRequest) -> Result<(), HelperError> {
    let too_long = |s: &str| s.len() > MAX_PATH_BYTES;
    // For command.start the limit is the output cap in bytes (DECISIONS 12).
    let max_limit = if request.operation == Operation::CommandStart {
        MAX_COMMAND_OUTPUT
    } else {
        MAX_LIST_ENTRIES
    };
    if request.data.len() > MAX_FILE_BYTES
        || too_long(&request.path)
        || too_long(&request.destination)
        || too_long(&request.pattern)
        || request.limit < 0
        || request.limit > max_limit as i64
    {
        return Err(HelperError::ResourceExhausted(BOUNDS_MESSAGE));
    }
    Ok(())
}

/// The result limit in effect: the request's if positive and below the maximum, else the
/// maximum.
pub fn effective_limit(limit: i64) -> usize {
    match usize::try_from(limit) {
        Ok(limit) if limit > 0 && limit < MAX_LIST_ENTRIES => limit,
        _ => MAX_LIST_ENTRIES,
    }
}

/// Completes when the stdin watcher fires or the helper receives SIGINT or SIGTERM. The
/// signal handlers are installed on first poll, so only a running command replaces the
/// default signal behaviour.
async fn cancelled(mut stdin_closed: watch::Receiver<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let terminated = async {
        match terminate.as_mut() {
            Some(s) => s.recv().await,
            None => std::future::pending().await,
        }
    };
    let interrupted = async {
        match interrupt.as_mut() {
            Some(s) => s.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = stdin_closed.wait_for(|closed| *closed) => {}
        _ = terminated => {}
        _ = interrupted => {}
    }
}

fn write_envelope(envelope: &ExecutorEnvelope) -> ExitCode {
    let mut line = serde_json::to_vec(envelope).expect("an envelope always encodes as JSON");
    line.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(&line)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        eprintln!("execution-helper: cannot write the response");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::protocol::ErrorCode;

    #[test]
    fn the_workspace_flag_is_the_only_argument() {
        let parse = |args: &[&str]| parse_args(args.iter().map(OsString::from));
        assert_eq!(parse(&[]).unwrap().workspace, PathBuf::from("/workspace"));
        assert_eq!(
            parse(&["--workspace", "/w"]).unwrap().workspace,
            PathBuf::from("/w")
        );
        assert_eq!(
            parse(&["--workspace=/v"]).unwrap().workspace,
            PathBuf::from("/v")
        );
        assert!(parse(&["--workspace"]).is_err());
        assert!(parse(&["--root", "/"]).is_err());
    }

    #[test]
    fn a_frame_ends_at_the_first_newline_or_eof_and_is_bounded() {
        let mut input = &b"{\"a\":1}\nrest"[..];
        assert_eq!(read_frame(&mut input).unwrap(), b"{\"a\":1}");
        assert_eq!(input, b"rest");
        let mut input = &b"{}"[..];
        assert_eq!(read_frame(&mut input).unwrap(), b"{}");
        let big = vec![b' '; MAX_JSON_BODY + 1];
        let err = read_frame(&mut &big[..]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted);
        let mut exact = vec![b' '; MAX_JSON_BODY];
        exact.push(b'\n');
        assert_eq!(read_frame(&mut &exact[..]).unwrap().len(), MAX_JSON_BODY);
    }

    #[test]
    fn bounds_and_limits_follow_the_spec() {
        let mut request = ExecutorRequest::new(Operation::FileList);
        assert!(check_bounds(&request).is_ok());
        request.limit = -1;
        assert!(check_bounds(&request).is_err());
        request.limit = MAX_LIST_ENTRIES as i64 + 1;
        assert!(check_bounds(&request).is_err());
        request.limit = 0;
        request.path = "a".repeat(MAX_PATH_BYTES + 1);
        assert!(check_bounds(&request).is_err());
        assert_eq!(effective_limit(0), MAX_LIST_ENTRIES);
        assert_eq!(effective_limit(5), 5);
        assert_eq!(effective_limit(MAX_LIST_ENTRIES as i64), MAX_LIST_ENTRIES);
    }

    #[tokio::test]
    async fn a_stalled_file_operation_answers_by_its_deadline() {
        let (_release, stalled) = std::sync::mpsc::channel::<()>();
        let stalled = std::sync::Arc::new(std::sync::Mutex::new(stalled));
        let stall = |stalled: std::sync::Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>| {
            move || {
                let _ = stalled.lock().unwrap().recv();
                Ok(ExecutorResponse::default())
            }
        };
        let bounded = within_deadline(Duration::from_millis(50), true, stall(stalled.clone()));
        let answer = tokio::time::timeout(Duration::from_secs(20), bounded)
            .await
            .expect("the helper answers by its own deadline");
        assert_eq!(answer.unwrap_err().code(), ErrorCode::FenceUnknown);
        let (_release, stalled) = std::sync::mpsc::channel::<()>();
        let stalled = std::sync::Arc::new(std::sync::Mutex::new(stalled));
        let bounded = within_deadline(Duration::from_millis(50), false, stall(stalled));
        let answer = tokio::time::timeout(Duration::from_secs(20), bounded)
            .await
            .expect("the helper answers by its own deadline");
        assert_eq!(answer.unwrap_err().code(), ErrorCode::Internal);
        let quick = within_deadline(Duration::from_secs(20), true, || Ok(7)).await;
        assert_eq!(quick.unwrap(), 7);
    }

    #[test]
    fn the_helper_gives_up_before_the_transport_does() {
        assert!(HELPER_FILE_DEADLINE < crate::executor::local::FILE_OPERATION_DEADLINE);
    }
}
