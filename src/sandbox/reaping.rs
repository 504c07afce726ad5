//! The holder of an environment's processes on the host, and the proof that they ended.
//!
//! Every process of a `dev` environment descends from one host process the provider started:
//! the sandbox's host stage ([`super::host`]), or with no isolation the plain holder
//! ([`run_plain`]) that starts the unisolated supervisor. That holder is a child subreaper, so
//! every orphan of the environment (a detached command whose reaper died, a process that
//! double-forked or `setsid`ed) is reparented to it; a sandbox's init is its descendant too
//! (and when an init exits, the kernel kills and reaps every process of its PID namespace
//! before the init's own exit completes). When its child ends, however it ended, the holder
//! kills every child it has left and reaps until `ECHILD`, and only then exits: an exit of
//! the holder with a status (not by a signal) proves that every process of the environment
//! is gone. The provider ends an environment by killing the holder's children and waiting for
//! that exit (`executor::environment_end`).

use std::ffi::OsString;
use std::process::ExitCode;

use rustix::io::Errno;
use rustix::process::{Signal, WaitOptions};

use super::cgroup::PidsCgroup;
use super::{SandboxSpec, SetupError, Step as _, forward_status};

/// Makes this process a child subreaper (fatal when the kernel refuses: the end could not be
/// proven).
pub fn become_holder() -> Result<(), SetupError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .step("becoming a child subreaper")
}

/// Kills every child of this process and reaps until none is left (`ECHILD`). It does not
/// give up: a process that cannot be killed keeps the holder, and so the environment's end
/// unproven.
pub fn end_every_descendant() {
    loop {
        for child in crate::helper::reaper::direct_children() {
            let _ = rustix::process::kill_process(child, Signal::KILL);
        }
        match rustix::process::wait(WaitOptions::NOHANG) {
            Err(Errno::CHILD) => return,
            Ok(Some(_)) | Err(Errno::INTR) => {}
            // Killed children not reaped yet (or a new orphan): look again shortly.
            Ok(None) | Err(_) => std::thread::sleep(crate::helper::reaper::SWEEP_POLL),
        }
    }
}

/// Runs [`end_every_descendant`] when dropped, so that no return (nor an unwinding panic) of
/// the holder skips it.
pub struct EndOnDrop;

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        end_every_descendant();
    }
}

/// The plain holder (`dev --unsafe-no-isolation`): a child subreaper in a pids cgroup of its
/// own when the machine has one (unbounded: only to find the processes again), which runs
/// this program with `inner` as its arguments, with no isolation, and returns its status once
/// every process it started has ended.
pub fn run_plain(spec: &SandboxSpec, inner: &[OsString]) -> Result<ExitCode, SetupError> {
    super::inherited::close_strays();
    become_holder()?;
    let cgroup = PidsCgroup::join(&spec.cgroup_name, None)?;
    let status = {
        let _end = EndOnDrop;
        std::process::Command::new("/proc/self/exe")
            .args(inner)
            .spawn()
            .step("starting the holder's program")?
            .wait()
            .step("waiting for the holder's program")
    };
    if let Some(cgroup) = cgroup {
        cgroup.leave_and_remove();
    }
    Ok(forward_status(status?))
}
