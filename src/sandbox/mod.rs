//! The `dev` sandbox: how an environment's executor isolates itself on a machine with no
//! container runtime.
//!
//! On a cluster the container runtime isolates the executor Pod. In `dev` the helper does it
//! itself, with the same kernel mechanisms a runtime uses, in three stages of one program
//! (`execution-helper`), each its own process (stage 1 and stage 3 fresh `execve`s, stage 2 a
//! fork of stage 1, so that the two share their pages):
//!
//! 1. **host** ([`host`]): still on the host with the provider's credentials. Joins a pids
//!    cgroup of its own, opens the workspace, forks stage 2, writes its uid and gid maps,
//!    waits for it and forwards its exit status.
//! 2. **userns** ([`namespaces`]): enters a new user namespace first (so that an unprivileged
//!    provider can do everything that follows), becomes root of it, then unshares the mount,
//!    PID, IPC, UTS, cgroup and (unless the spec allows outbound network) network namespaces
//!    and starts stage 3, which is PID 1 of the new PID namespace.
//! 3. **init** ([`rootfs`], [`confine`], [`landlock_rules`], [`seccomp`]): builds the
//!    read-only root, pivots into it, sets rlimits, applies Landlock, drops every capability,
//!    installs the seccomp filter, and then carries on as whatever program the launcher named
//!    after `--` (the helper today; the executor supervisor once it exists).
//!
//! [`command`] builds the launch of stage 1 (the provider side) and [`enter`] is the one entry
//! a program calls first thing in `main` to run a stage. Every failure is fatal with a message
//! on stderr naming the step (exit [`SETUP_FAILED`]): a sandbox is never half set up. See
//! `docs/sandbox.md` for the threat model.

pub mod cgroup;
pub mod confine;
mod fork;
pub mod host;
mod inherited;
pub mod landlock_rules;
pub mod namespaces;
pub mod reaping;
pub mod rootfs;
pub mod seccomp;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

/// The argument that selects a sandbox stage.
pub const STAGE_FLAG: &str = "--sandbox-stage";
/// Exit status of a stage whose setup failed (the message is on stderr).
pub const SETUP_FAILED: u8 = 125;
/// Where the workspace appears inside the sandbox.
pub const WORKSPACE_PATH: &str = "/workspace";
/// The host uid and gid the sandbox's root maps to when the provider runs as root. No other
/// process of the host runs with it, so the sandbox's files are its own and nothing of the
/// host's root (its files, `/proc/sys`, `/proc/sysrq-trigger`) is granted by ownership.
pub const ROOT_PROVIDER_SANDBOX_ID: u32 = 0x7fff_0000;

/// Whether the sandbox has a network.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// An empty network namespace: no interface is up, not even loopback.
    #[default]
    None,
    /// The host's network, with TCP connect and bind refused on the listed ports (the
    /// provider's) and every TCP bind refused, by Landlock (ABI 4 or newer is required).
    HostExceptPorts(Vec<u16>),
}

/// Resource bounds of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Most tasks (processes and threads) in the sandbox's pids cgroup.
    pub pids: u32,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// `RLIMIT_FSIZE` in bytes.
    pub file_size: u64,
    /// Size of the private `/tmp` in bytes.
    pub tmp_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pids: 512,
            open_files: 1024,
            file_size: 1 << 30,
            tmp_bytes: 256 << 20,
        }
    }
}

/// What one sandbox is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The host directory that appears read-write at [`WORKSPACE_PATH`].
    pub workspace: PathBuf,
    /// Host paths to hide should they lie under a directory the sandbox sees (the provider's
    /// state directory, for one).
    pub hidden: Vec<PathBuf>,
    /// The network.
    pub network: Network,
    /// The bounds.
    pub limits: Limits,
    /// The sandbox's host name (its own UTS namespace).
    pub hostname: String,
    /// A name for the pids cgroup (one plain component; the host stage adds its pid).
    pub cgroup_name: String,
    /// A Unix socket path the host stage binds (in a directory the sandbox does not see) and
    /// whose listening descriptor the init receives ([`Entered::Init`]'s `listener`): the
    /// channel of a supervisor that is the sandbox's init. `None`: no listener.
    #[serde(default)]
    pub listen: Option<PathBuf>,
}

impl SandboxSpec {
    /// A sandbox over `workspace` with no network and the default limits.
    pub fn new(workspace: impl Into<PathBuf>, name: &str) -> Self {
        SandboxSpec {
            workspace: workspace.into(),
            hidden: Vec::new(),
            network: Network::None,
            limits: Limits::default(),
            hostname: name.to_owned(),
            cgroup_name: name.to_owned(),
            listen: None,
        }
    }
}

/// What the host stage hands down to the inner stages (file descriptors it left open for
/// them, and the ids it mapped).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// Where the inner stages find the workspace directory (in their mount namespace, which
    /// starts as a copy of the host stage's).
    pub workspace: PathBuf,
    /// The pid of the host stage (stage 2's parent).
    pub host_pid: i32,
    /// Whether a pids cgroup bounds the sandbox (otherwise `RLIMIT_NPROC` does).
    pub pids_cgroup: bool,
    /// Where the inner stages find this program's binary (bound into the sandbox at
    /// [`rootfs::HELPER_PATH`]).
    #[serde(default)]
    pub helper: PathBuf,
    /// The listening socket the host stage bound for [`SandboxSpec::listen`].
    #[serde(default)]
    pub listener_fd: Option<i32>,
}

/// A sandbox stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Stage 1, on the host (stage 2 is its fork, never started by name).
    Host,
    /// Stage 3, PID 1 of the sandbox.
    Init,
    /// No sandbox: the plain holder of an unisolated environment ([`reaping::run_plain`]).
    Plain,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Host => "host",
            Stage::Init => "init",
            Stage::Plain => "plain",
        }
    }

    fn parse(name: &OsStr) -> Option<Stage> {
        [Stage::Host, Stage::Init, Stage::Plain]
            .into_iter()
            .find(|stage| name == stage.name())
    }
}

/// What [`enter`] leaves to the caller.
#[derive(Debug)]
pub enum Entered {
    /// A launching stage finished: exit with this status.
    Exit(ExitCode),
    /// This process is the confined init of the sandbox: carry on as the program, with
    /// `args` (the ones the launcher put after `--`) and, when the spec asked for one, the
    /// listening socket the host stage bound (close-on-exec, so nothing the init starts
    /// inherits it).
    Init {
        /// The program's arguments.
        args: Vec<OsString>,
        /// The listener of [`SandboxSpec::listen`].
        listener: Option<std::os::fd::OwnedFd>,
    },
}

/// A failed setup step.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {cause}")]
pub struct SetupError {
    /// What was being done.
    pub step: String,
    /// Why it failed.
    pub cause: String,
}

impl SetupError {
    /// A failure of `step` caused by `cause`.
    pub fn new(step: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        SetupError {
            step: step.into(),
            cause: cause.to_string(),
        }
    }
}

/// Shorthand to attach a step to an error.
pub(crate) trait Step<T> {
    fn step(self, step: &str) -> Result<T, SetupError>;
}

impl<T, E: std::fmt::Display> Step<T> for Result<T, E> {
    fn step(self, step: &str) -> Result<T, SetupError> {
        self.map_err(|e| SetupError::new(step, e))
    }
}

/// The launch of a sandbox on the host: `program` (an executable that calls [`enter`] first)
/// runs stage 1 with `spec`, and its init carries on with `inner` as its arguments.
pub fn command(program: &Path, spec: &SandboxSpec, inner: &[OsString]) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command.args(stage_args(Stage::Host, spec, None, inner));
    command
}

/// The launch of an unisolated environment's plain holder ([`reaping::run_plain`]): `program`
/// (an executable that calls [`enter`] first) runs itself with `inner` as its arguments, with
/// no isolation, in a holder that proves the end of everything it started; only the spec's
/// cgroup name is used.
pub fn plain_command(
    program: &Path,
    spec: &SandboxSpec,
    inner: &[OsString],
) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command.args(stage_args(Stage::Plain, spec, None, inner));
    command
}

fn stage_args(
    stage: Stage,
    spec: &SandboxSpec,
    handoff: Option<&Handoff>,
    inner: &[OsString],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        STAGE_FLAG.into(),
        stage.name().into(),
        serde_json::to_string(spec)
            .expect("a spec always encodes")
            .into(),
    ];
    if let Some(handoff) = handoff {
        args.push(
            serde_json::to_string(handoff)
                .expect("a handoff always encodes")
                .into(),
        );
    }
    args.push("--".into());
    args.extend(inner.iter().cloned());
    args
}

/// True when `args` (without the program name) start a sandbox stage.
pub fn is_stage(args: &[OsString]) -> bool {
    args.first().is_some_and(|a| a == STAGE_FLAG)
}

/// Runs the sandbox stage `args` (without the program name) select. Call it first thing in
/// `main`, before any thread exists: the stages need a single-threaded process.
pub fn enter(args: Vec<OsString>) -> Entered {
    match run_stage(args) {
        Ok(entered) => entered,
        Err(error) => {
            eprintln!("execution-helper sandbox: {error}");
            Entered::Exit(ExitCode::from(SETUP_FAILED))
        }
    }
}

/// Ends a forked stage with `result`: its status, or [`SETUP_FAILED`] with the failure on
/// stderr (as [`enter`] reports it).
pub(crate) fn exit_stage(result: Result<u8, SetupError>) -> ! {
    match result {
        Ok(code) => std::process::exit(code.into()),
        Err(error) => {
            eprintln!("execution-helper sandbox: {error}");
            std::process::exit(SETUP_FAILED.into())
        }
    }
}

fn run_stage(args: Vec<OsString>) -> Result<Entered, SetupError> {
    let mut args = args.into_iter();
    let usage = || SetupError::new("arguments", "not a sandbox stage invocation");
    if args.next().as_deref() != Some(OsStr::new(STAGE_FLAG)) {
        return Err(usage());
    }
    let stage = args
        .next()
        .and_then(|s| Stage::parse(&s))
        .ok_or_else(usage)?;
    let spec: SandboxSpec = decode(args.next(), "spec")?;
    let handoff = match stage {
        Stage::Host | Stage::Plain => None,
        _ => Some(decode::<Handoff>(args.next(), "handoff")?),
    };
    if args.next().as_deref() != Some(OsStr::new("--")) {
        return Err(usage());
    }
    let inner: Vec<OsString> = args.collect();
    match (stage, handoff) {
        (Stage::Host, _) => host::run(&spec, &inner).map(Entered::Exit),
        (Stage::Plain, _) => reaping::run_plain(&spec, &inner).map(Entered::Exit),
        (Stage::Init, Some(handoff)) => {
            let listener = handoff
                .listener_fd
                .map(|fd| inherited::take_close_on_exec(fd, "the listening socket"))
                .transpose()?;
            init(&spec, &handoff)?;
            Ok(Entered::Init {
                args: inner,
                listener,
            })
        }
        _ => Err(usage()),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    arg: Option<OsString>,
    what: &str,
) -> Result<T, SetupError> {
    let text = arg
        .and_then(|a| a.into_string().ok())
        .ok_or_else(|| SetupError::new(what, "missing"))?;
    serde_json::from_str(&text).step(what)
}

/// Stage 3: everything that confines the init before it becomes the program.
fn init(spec: &SandboxSpec, handoff: &Handoff) -> Result<(), SetupError> {
    confine::die_with_parent()?;
    rootfs::build(spec, handoff)?;
    confine::set_hostname(&spec.hostname)?;
    confine::set_rlimits(&spec.limits, handoff.pids_cgroup)?;
    confine::set_no_new_privs()?;
    landlock_rules::restrict(&spec.network)?;
    confine::drop_capabilities()?;
    seccomp::install()?;
    Ok(())
}

/// The exit code that reports a child's `status` to our parent (128 + signal when killed).
pub(crate) fn forward_status(status: std::process::ExitStatus) -> ExitCode {
    ExitCode::from(forwarded_code(status))
}

/// [`forward_status`] as a number.
pub(crate) fn forwarded_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => SETUP_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_arguments_round_trip_and_keep_the_inner_arguments() {
        let spec = SandboxSpec::new("/srv/ws/exec-a", "exec-a");
        let handoff = Handoff {
            workspace: "/tmp/workspace".into(),
            host_pid: 42,
            pids_cgroup: true,
            helper: "/tmp/execution-helper".into(),
            listener_fd: Some(6),
        };
        let inner: Vec<OsString> = vec!["--workspace".into(), "/workspace".into()];
        let args = stage_args(Stage::Init, &spec, Some(&handoff), &inner);
        assert!(is_stage(&args));
        assert_eq!(Stage::parse(&args[1]), Some(Stage::Init));
        let decoded: SandboxSpec = decode(Some(args[2].clone()), "spec").unwrap();
        assert_eq!(decoded, spec);
        let decoded: Handoff = decode(Some(args[3].clone()), "handoff").unwrap();
        assert_eq!(decoded, handoff);
        assert_eq!(args[4], "--");
        assert_eq!(&args[5..], &inner[..]);
        assert!(!is_stage(&inner));
    }

    #[test]
    fn a_malformed_stage_invocation_is_a_setup_failure() {
        let bad = |args: &[&str]| run_stage(args.iter().map(OsString::from).collect()).is_err();
        assert!(bad(&[STAGE_FLAG]));
        assert!(bad(&[STAGE_FLAG, "nope", "{}", "--"]));
        assert!(bad(&[STAGE_FLAG, "init", "{}", "--"]));
        // Stage 2 is a fork of stage 1, never started by name.
        assert!(bad(&[STAGE_FLAG, "userns", "{}", "{}", "--"]));
    }
}
