//! Stage 2 of the sandbox, a fork of stage 1 ([`super::fork`]): a new user namespace first (so
//! an unprivileged provider can create the others), root of it once stage 1 has mapped the ids,
//! then the mount, PID, IPC, UTS, cgroup and network namespaces, and stage 3 as PID 1 of the
//! new PID namespace.

use std::io::{Read as _, Write as _};

use nix::sched::CloneFlags;
use rustix::process::{Gid, Signal, Uid};

use super::{
    Handoff, Network, SandboxSpec, SetupError, Stage, Step as _, forwarded_code, stage_args,
};

/// Stage 2's ends of the pipes it shares with stage 1.
pub struct HostEnds {
    /// Stage 2 writes one byte here once it is in its user namespace.
    pub unshared: std::fs::File,
    /// Stage 1 writes one byte here once the id maps are written.
    pub mapped: std::fs::File,
}

/// Runs stage 2 and returns the sandbox's exit code. `listener` (inheritable) is the init's;
/// this stage's copy is closed once the init runs.
pub fn run(
    spec: &SandboxSpec,
    handoff: &Handoff,
    ends: HostEnds,
    listener: Option<std::os::fd::OwnedFd>,
    inner: &[std::ffi::OsString],
) -> Result<u8, SetupError> {
    let HostEnds { unshared, mapped } = ends;
    if rustix::process::geteuid().is_root() {
        // The host root's supplementary groups would otherwise follow into the sandbox.
        rustix::thread::set_thread_groups(&[]).step("dropping supplementary groups")?;
    }
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| {
        SetupError::new(
            "creating a user namespace",
            format!(
                "{e} (the kernel must allow user namespaces: user.max_user_namespaces > 0, and no LSM policy forbidding them)"
            ),
        )
    })?;
    await_id_maps(unshared, mapped)?;
    become_namespace_root()?;
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .step("tying the sandbox to its host stage")?;
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(handoff.host_pid) {
        return Err(SetupError::new(
            "tying the sandbox to its host stage",
            "the host stage is gone",
        ));
    }
    nix::sched::unshare(namespace_flags(&spec.network)).map_err(|e| {
        SetupError::new(
            "creating the mount, PID, IPC, UTS, cgroup and network namespaces",
            e,
        )
    })?;
    let mut init = std::process::Command::new("/proc/self/exe")
        .args(stage_args(Stage::Init, spec, Some(handoff), inner))
        .spawn()
        .step("starting the sandbox init")?;
    drop(listener);
    let status = init.wait().step("waiting for the sandbox init")?;
    Ok(forwarded_code(status))
}

/// The namespaces besides the user namespace: all of them, and the network's unless the
/// sandbox shares the host's.
pub fn namespace_flags(network: &Network) -> CloneFlags {
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    if *network == Network::None {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    flags
}

/// Tells stage 1 the user namespace exists and waits until it has written the id maps.
fn await_id_maps(mut unshared: std::fs::File, mut mapped: std::fs::File) -> Result<(), SetupError> {
    unshared.write_all(b"u").step("signalling the host stage")?;
    drop(unshared);
    let mut byte = [0u8; 1];
    match mapped.read(&mut byte) {
        Ok(1) => Ok(()),
        _ => Err(SetupError::new(
            "waiting for the id maps",
            "the host stage did not write them",
        )),
    }
}

/// Switches to uid and gid 0 of the new namespace, so that the init stage's `execve` keeps
/// the namespace's capabilities it needs to build the root.
fn become_namespace_root() -> Result<(), SetupError> {
    rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT)
        .step("becoming root of the user namespace")?;
    rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT)
        .step("becoming root of the user namespace")?;
    Ok(())
}
