//! Stage 1 of the sandbox, on the host with the provider's credentials: the pids cgroup, the
//! workspace directory, the id maps of stage 2's user namespace, and the wait. It is the
//! holder of the sandbox's processes ([`super::reaping`]): it exits only once none is left.
//!
//! The sandbox's root maps to the provider's own uid and gid when the provider is not root
//! (the only mapping an unprivileged process may write), and to
//! [`ROOT_PROVIDER_SANDBOX_ID`] when it is root, whose workspace is then handed to that id.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::FdFlags;
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::process::{Gid, Uid};

use super::cgroup::PidsCgroup;
use super::fork::Forked;
use super::namespaces;
use super::{
    Handoff, ROOT_PROVIDER_SANDBOX_ID, SandboxSpec, SetupError, Step as _, forward_status,
};

/// Where a root provider's host stage binds the workspace for the inner stages.
pub const STAGED_WORKSPACE: &str = "/tmp/workspace";
/// Where a root provider's host stage binds this program's binary for the inner stages.
pub const STAGED_HELPER: &str = "/tmp/execution-helper";
/// Deepest directory tree handed to the sandbox's id on first use.
const MAX_ADOPT_DEPTH: usize = 256;

/// The host ids the sandbox's root maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxIds {
    /// Host uid of the sandbox's uid 0.
    pub uid: u32,
    /// Host gid of the sandbox's gid 0.
    pub gid: u32,
}

impl SandboxIds {
    /// The ids for a provider running with the current effective ids.
    pub fn for_current_provider() -> SandboxIds {
        if rustix::process::geteuid().is_root() {
            SandboxIds {
                uid: ROOT_PROVIDER_SANDBOX_ID,
                gid: ROOT_PROVIDER_SANDBOX_ID,
            }
        } else {
            SandboxIds {
                uid: rustix::process::geteuid().as_raw(),
                gid: rustix::process::getegid().as_raw(),
            }
        }
    }
}

/// Runs stage 1 and returns the sandbox's exit status.
pub fn run(spec: &SandboxSpec, inner: &[std::ffi::OsString]) -> Result<ExitCode, SetupError> {
    super::inherited::close_strays();
    // Before anything is started: every orphan of the sandbox comes back to this stage.
    super::reaping::become_holder()?;
    // Bound first, while this stage still sees the host's file system as the launcher does.
    let listener = spec.listen.as_deref().map(bind_listener).transpose()?;
    let cgroup = PidsCgroup::join(&spec.cgroup_name, Some(spec.limits.pids))?;
    if cgroup.is_none() {
        eprintln!(
            "execution-helper sandbox: warning: no writable pids cgroup; processes are bounded by RLIMIT_NPROC only"
        );
    }
    let ids = SandboxIds::for_current_provider();
    let result = {
        // However the sandbox ended, this stage exits only once it has no process left.
        let _end = super::reaping::EndOnDrop;
        run_in_cgroup(spec, inner, ids, cgroup.is_some(), listener)
    };
    if let Some(cgroup) = cgroup {
        cgroup.leave_and_remove();
    }
    result
}

fn run_in_cgroup(
    spec: &SandboxSpec,
    inner: &[std::ffi::OsString],
    ids: SandboxIds,
    pids_cgroup: bool,
    listener: Option<OwnedFd>,
) -> Result<ExitCode, SetupError> {
    let helper = std::env::current_exe().step("finding this program's binary")?;
    let (workspace, helper) = prepare_workspace(&spec.workspace, &helper, ids)?;
    // Stage 2 is a fork of this stage: it keeps its ends and the listener, and drops ours.
    let (unshared_read, unshared_write) = rustix::pipe::pipe().step("creating a pipe")?;
    let (mapped_read, mapped_write) = rustix::pipe::pipe().step("creating a pipe")?;
    for fd in [&unshared_read, &unshared_write, &mapped_read, &mapped_write] {
        rustix::io::fcntl_setfd(fd, FdFlags::CLOEXEC).step("creating a pipe")?;
    }
    let handoff = Handoff {
        workspace,
        helper,
        host_pid: std::process::id() as i32,
        pids_cgroup,
        listener_fd: listener.as_ref().map(|l| l.as_raw_fd()),
    };
    let step = "starting the user-namespace stage";
    let child = match super::fork::fork_single_threaded(step)? {
        Forked::Child => {
            drop((unshared_read, mapped_write));
            let ends = namespaces::HostEnds {
                unshared: unshared_write.into(),
                mapped: mapped_read.into(),
            };
            // Ends here, never returning into this stage's frames (its cgroup and its end).
            super::exit_stage(namespaces::run(spec, &handoff, ends, listener, inner))
        }
        Forked::Parent(child) => child,
    };
    // The sandbox holds the listener from here; this stage's copy would keep it open after
    // the init ended.
    drop((unshared_write, mapped_read, listener));
    let mut byte = [0u8; 1];
    let unshared = std::fs::File::from(unshared_read)
        .read(&mut byte)
        .unwrap_or(0)
        == 1;
    if unshared {
        let mapped = write_id_maps(child.as_raw_nonzero().get() as u32, ids);
        if let Err(error) = mapped {
            super::fork::kill(child);
            let _ = super::fork::wait(child, "waiting for the sandbox");
            return Err(error);
        }
        // If the child is gone the write fails and its wait below tells.
        let _ = std::fs::File::from(mapped_write).write_all(b"m");
    } else {
        drop(mapped_write);
    }
    let status = super::fork::wait(child, "waiting for the sandbox")?;
    Ok(forward_status(status))
}

/// Binds the Unix socket `path` for the sandbox's init (replacing a stale socket, refusing
/// one a live process serves) and leaves its descriptor inheritable.
fn bind_listener(path: &Path) -> Result<OwnedFd, SetupError> {
    let step = "binding the supervisor's socket";
    let address = path
        .to_str()
        .ok_or_else(|| SetupError::new(step, "the path is not UTF-8"))?;
    if address.starts_with('@') {
        return Err(SetupError::new(step, "an abstract name is not a path"));
    }
    let listener = OwnedFd::from(crate::helper::supervisor::bind(address).step(step)?);
    rustix::io::fcntl_setfd(&listener, FdFlags::empty()).step(step)?;
    Ok(listener)
}

/// Writes `0 <uid> 1` and `0 <gid> 1` for process `pid` (after denying setgroups, which an
/// unprivileged writer must and which the sandbox never needs).
fn write_id_maps(pid: u32, ids: SandboxIds) -> Result<(), SetupError> {
    let proc = format!("/proc/{pid}");
    std::fs::write(format!("{proc}/setgroups"), "deny").step("denying setgroups")?;
    std::fs::write(format!("{proc}/uid_map"), format!("0 {} 1\n", ids.uid))
        .step("writing the uid map")?;
    std::fs::write(format!("{proc}/gid_map"), format!("0 {} 1\n", ids.gid))
        .step("writing the gid map")?;
    Ok(())
}

/// Makes the workspace directory (0755) if missing and returns the paths at which the inner
/// stages open it and this program's binary `helper`.
///
/// An unprivileged provider's sandbox root is the provider's own uid, so the inner stages
/// can walk to the workspace themselves. A root provider's sandbox root is
/// [`ROOT_PROVIDER_SANDBOX_ID`], which may not traverse the host directories above the
/// workspace (a state directory under `/root`, a 0700 temporary directory): the host stage
/// then moves to a mount namespace of its own, hands the workspace to that id, and binds it
/// at [`STAGED_WORKSPACE`] (and the binary at [`STAGED_HELPER`]), on a tmpfs that hides the
/// host's `/tmp` in that namespace only. The inner stages' mount namespace starts as a copy
/// of this one.
fn prepare_workspace(
    path: &Path,
    helper: &Path,
    ids: SandboxIds,
) -> Result<(PathBuf, PathBuf), SetupError> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(SetupError::new("creating the workspace", e)),
    }
    if !rustix::process::geteuid().is_root() {
        open_directory(path)?;
        return Ok((path.to_owned(), helper.to_owned()));
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .step("creating the host stage's mount namespace")?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .step("making the mounts private")?;
    let workspace = open_directory(path)?;
    // Opened before the tmpfs hides the host's /tmp, where the binary itself may lie.
    let helper = std::fs::File::open(helper).step("opening the helper's binary")?;
    let owner = rustix::fs::fstat(&workspace).step("opening the workspace")?;
    if (owner.st_uid, owner.st_gid) != (ids.uid, ids.gid) {
        adopt(&workspace, ids, 0).step("handing the workspace to the sandbox's ids")?;
    }
    let staged = Path::new(STAGED_WORKSPACE);
    let parent = staged.parent().expect("the staged path has a parent");
    rustix::mount::mount(
        "tmpfs",
        parent,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=64k",
    )
    .step("staging the workspace")?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(staged)
        .step("staging the workspace")?;
    let source = format!("/proc/self/fd/{}", workspace.as_raw_fd());
    rustix::mount::mount_bind(source.as_str(), staged).step("staging the workspace")?;
    let staged_helper = Path::new(STAGED_HELPER);
    std::fs::write(staged_helper, b"").step("staging the helper")?;
    let source = format!("/proc/self/fd/{}", helper.as_raw_fd());
    rustix::mount::mount_bind(source.as_str(), staged_helper).step("staging the helper")?;
    Ok((staged.to_owned(), staged_helper.to_owned()))
}

/// Opens directory `path`, refusing a symlink.
pub fn open_directory(path: &Path) -> Result<OwnedFd, SetupError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .step("opening the workspace")
}

/// Gives `dir` and everything under it (never following a symlink) to `ids`.
fn adopt(dir: &OwnedFd, ids: SandboxIds, depth: usize) -> std::io::Result<()> {
    if depth > MAX_ADOPT_DEPTH {
        return Err(std::io::Error::other("directory tree too deep"));
    }
    let (uid, gid) = (Uid::from_raw(ids.uid), Gid::from_raw(ids.gid));
    rustix::fs::fchown(dir, Some(uid), Some(gid))?;
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        rustix::fs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?;
        if entry.file_type() == rustix::fs::FileType::Directory {
            let child = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            adopt(&child, ids, depth + 1)?;
        }
    }
    Ok(())
}
