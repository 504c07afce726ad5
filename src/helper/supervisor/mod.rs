//! `execution-helper supervise`: the executor supervisor (docs/commands.md).
//!
//! The long-lived main process of an executor: it owns every command of the environment, each
//! under its own sub-reaper ([`reaper_process`]), keeps their output and receipts in a bounded
//! in-memory [`journal`], kills a claim's commands when the claim's deadline passes, and
//! answers authenticated requests over a local Unix socket ([`channel`]). The wire types are in
//! [`crate::executor::supervisor_protocol`].

pub mod channel;
pub mod command_link;
pub mod journal;
pub mod reaper_process;
pub mod reaper_wire;
pub mod ring;
pub mod service;
pub mod terminal;

use std::ffi::OsString;
use std::os::linux::net::SocketAddrExt as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::executor::supervisor_protocol::{DEFAULT_SOCKET, MAX_CONNECTIONS};
use crate::runtime::Runtime;
pub use service::Supervisor;

/// Grace the commands get when the supervisor is asked to stop.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// The supervisor's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperviseConfig {
    /// The workspace root.
    pub workspace: PathBuf,
    /// `@name` for an abstract socket, else a path.
    pub socket: String,
}

/// Parses `--workspace DIR` and `--socket ADDR` (the arguments after `supervise`).
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<SuperviseConfig, String> {
    let mut config = SuperviseConfig {
        workspace: PathBuf::from(crate::helper::DEFAULT_WORKSPACE),
        socket: DEFAULT_SOCKET.to_owned(),
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{} needs a value", arg.to_string_lossy()))
        };
        match arg.to_str() {
            Some("--workspace") => config.workspace = PathBuf::from(value()?),
            Some("--socket") => config.socket = value()?,
            _ => return Err(format!("unexpected argument {}", arg.to_string_lossy())),
        }
    }
    if config.socket.is_empty() || config.socket == "@" {
        return Err("--socket must not be empty".to_owned());
    }
    Ok(config)
}

/// Makes this process non-dumpable: no same-uid `ptrace`, no `/proc/<pid>/mem` or `environ`.
pub fn harden() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}

/// Binds the supervisor's socket: abstract for `@name`; a path is refused when a live
/// supervisor answers on it and replaced when it is a stale socket.
pub fn bind(address: &str) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
    if let Some(name) = address.strip_prefix('@') {
        return UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?);
    }
    let path = std::path::Path::new(address);
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "a supervisor already serves this socket",
            ));
        }
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

/// The whole `supervise` process.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let config = match parse_args(args) {
        Ok(config) => config,
        Err(problem) => {
            eprintln!(
                "execution-helper supervise: {problem}\nusage: execution-helper supervise [--workspace DIR] [--socket @NAME|PATH]"
            );
            return ExitCode::from(2);
        }
    };
    harden();
    if !crate::helper::reaper::become_subreaper() {
        eprintln!("execution-helper supervise: cannot become a child subreaper");
        return ExitCode::from(1);
    }
    let helper = match std::env::current_exe() {
        Ok(helper) => helper,
        Err(e) => {
            eprintln!("execution-helper supervise: cannot find its own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("execution-helper supervise: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        let listener = match bind(&config.socket).and_then(|l| {
            l.set_nonblocking(true)?;
            tokio::net::UnixListener::from_std(l)
        }) {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!(
                    "execution-helper supervise: cannot bind {}: {e}",
                    config.socket
                );
                return ExitCode::from(1);
            }
        };
        let supervisor = Supervisor::new(helper, config.workspace, Runtime::system());
        serve(supervisor, listener).await
    })
}

async fn serve(supervisor: Arc<Supervisor>, listener: tokio::net::UnixListener) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        return ExitCode::from(1);
    };
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    tokio::spawn(supervisor.clone().watch_deadlines());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let interrupted = async {
            match interrupt.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Over the bound, the connection is closed at once.
                let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
                let supervisor = supervisor.clone();
                tokio::spawn(async move {
                    let (reader, writer) = stream.into_split();
                    channel::serve(supervisor, reader, writer).await;
                    drop(slot);
                });
            }
            _ = terminate.recv() => break,
            _ = interrupted => break,
        }
    }
    supervisor.end_all(STOP_GRACE).await;
    ExitCode::SUCCESS
}
