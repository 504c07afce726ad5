//! `execution-helper supervise`: the executor supervisor (docs/commands.md).
//!
//! The long-lived main process of an executor: it owns every command of the environment, each
//! under its own sub-reaper ([`reaper_process`]), keeps their output and receipts in a bounded
//! in-memory [`journal`], kills a claim's commands when the claim's deadline passes, and
//! answers authenticated requests over a local Unix socket ([`channel`]). The wire types are in
//! [`crate::executor::supervisor_protocol`].

pub mod channel;
pub mod command_link;
pub mod helper_call;
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
/// The exit status of a stop that could not prove every process it started gone.
pub const STOP_UNPROVEN_EXIT: u8 = 3;

/// The supervisor's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperviseConfig {
    /// The workspace root.
    pub workspace: PathBuf,
    /// `@name` for an abstract socket, else a path.
    pub socket: String,
    /// Exit once this long has passed with no running command and no open connection (the
    /// on-demand supervisors of `dev`); `None`: run until stopped.
    pub idle_exit: Option<Duration>,
}

/// Parses `--workspace DIR`, `--socket ADDR` and `--idle-exit-ms MS` (the arguments after
/// `supervise`).
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<SuperviseConfig, String> {
    let mut config = SuperviseConfig {
        workspace: PathBuf::from(crate::helper::DEFAULT_WORKSPACE),
        socket: DEFAULT_SOCKET.to_owned(),
        idle_exit: None,
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
            Some("--idle-exit-ms") => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|_| "--idle-exit-ms needs a number of milliseconds".to_owned())?;
                config.idle_exit = Some(Duration::from_millis(ms.max(1)));
            }
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

/// The whole `supervise` process. `inherited` is the listener the `dev` sandbox's host stage
/// bound for it (the supervisor is then the sandbox's init, and `--socket` is not used).
pub fn main(
    args: impl IntoIterator<Item = OsString>,
    inherited: Option<std::os::fd::OwnedFd>,
) -> ExitCode {
    let config = match parse_args(args) {
        Ok(config) => config,
        Err(problem) => {
            eprintln!(
                "execution-helper supervise: {problem}\nusage: execution-helper supervise [--workspace DIR] [--socket @NAME|PATH] [--idle-exit-ms MS]"
            );
            return ExitCode::from(2);
        }
    };
    let sandboxed = inherited.is_some();
    harden();
    if !crate::helper::reaper::become_subreaper() {
        eprintln!("execution-helper supervise: cannot become a child subreaper");
        return ExitCode::from(1);
    }
    let own_binary = if sandboxed {
        // The host path of the binary is outside the sandbox's view; the sandbox binds it here.
        Ok(PathBuf::from(crate::sandbox::rootfs::HELPER_PATH))
    } else {
        std::env::current_exe()
    };
    let helper = match own_binary {
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
        let bound = match inherited {
            Some(fd) => Ok(std::os::unix::net::UnixListener::from(fd)),
            None => bind(&config.socket),
        };
        let listener = match bound.and_then(|l| {
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
        let stop = Stop {
            signals: !sandboxed,
            idle_exit: config.idle_exit,
        };
        serve(supervisor, listener, stop).await
    })
}

/// What ends the supervisor besides its own death.
struct Stop {
    /// SIGTERM and SIGINT. Not for a sandbox's init: its members could send them (the kernel
    /// drops only signals a namespace's init has no handler for); that supervisor ends when
    /// its host stage is killed (the whole namespace dies with it) or when idle.
    signals: bool,
    /// The idle timeout.
    idle_exit: Option<Duration>,
}

async fn serve(
    supervisor: Arc<Supervisor>,
    listener: tokio::net::UnixListener,
    stop: Stop,
) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut terminate, mut interrupt) = if stop.signals {
        let Ok(terminate) = signal(SignalKind::terminate()) else {
            return ExitCode::from(1);
        };
        (Some(terminate), signal(SignalKind::interrupt()).ok())
    } else {
        (None, None)
    };
    let Ok(mut child_exits) = signal(SignalKind::child()) else {
        return ExitCode::from(1);
    };
    tokio::spawn(supervisor.clone().watch_deadlines());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut idle = stop
        .idle_exit
        .map(|after| IdleWatch::new(after, &supervisor));
    loop {
        let interrupted = async {
            match interrupt.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        let terminated = async {
            match terminate.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        let idle_over = async {
            match idle.as_mut() {
                Some(watch) => watch.expired(&supervisor, &slots).await,
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
            _ = child_exits.recv() => {
                let supervisor = supervisor.clone();
                tokio::spawn(async move { supervisor.reap_orphans().await });
            }
            _ = terminated => break,
            _ = interrupted => break,
            () = idle_over => break,
        }
    }
    supervisor.end_all(STOP_GRACE).await;
    stop_status(crate::helper::reaper::sweep_children(crate::helper::reaper::SWEEP_WINDOW).await)
}

/// The exit status of a stop: 0 only when the final sweep reached `ECHILD`, which proves that
/// no process the supervisor ever started (every command's whole tree, however it forked, ends
/// up as the supervisor's child once its own parent is gone) is left; else
/// [`STOP_UNPROVEN_EXIT`], so whoever waits for the supervisor (a container runtime, the e2e
/// suite's exec shim) never takes its exit for the end of every process.
fn stop_status(no_process_left: bool) -> ExitCode {
    if no_process_left {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "execution-helper supervise: stopped, but processes it started may still be running"
        );
        ExitCode::from(STOP_UNPROVEN_EXIT)
    }
}

/// The idle timeout: expires once `after` has passed, measured on the supervisor's clock, with
/// no running command and no open connection at every check in between.
struct IdleWatch {
    after: Duration,
    since: tokio::time::Instant,
}

impl IdleWatch {
    fn new(after: Duration, supervisor: &Supervisor) -> Self {
        IdleWatch {
            after,
            since: supervisor.runtime.clock.monotonic(),
        }
    }

    /// Resolves when the supervisor has been idle for `after`.
    async fn expired(&mut self, supervisor: &Supervisor, slots: &Semaphore) {
        let check = (self.after / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
        loop {
            let now = supervisor.runtime.clock.monotonic();
            let busy =
                slots.available_permits() < MAX_CONNECTIONS || supervisor.running_commands() > 0;
            if busy {
                self.since = now;
            } else if now.duration_since(self.since) >= self.after {
                return;
            }
            tokio::time::sleep(check).await;
        }
    }
}
