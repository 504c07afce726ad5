//! The sandbox's file system, built by the init stage in its own mount namespace.
//!
//! ```text
//! /            a small tmpfs, read-only once built
//! /usr /etc    read-only, nosuid, nodev binds of the host's (and /bin /sbin /lib* as on the
//!              host: the same symlinks, or read-only binds where they are directories)
//! /workspace   the environment's workspace, read-write, nosuid, nodev
//! /tmp         a private tmpfs (Limits::tmp_bytes), mode 1777
//! /dev         null zero full random urandom tty (binds of the host's), a new devpts
//!              instance, /dev/shm (tmpfs) and the fd symlinks
//! /.execution-helper  the helper binary, read-only (the init starts its children with it)
//! /proc        a new procfs of the sandbox's PID namespace, with the entries that describe
//!              the host's kernel masked or read-only
//! ```
//!
//! Secrets under `/etc` ([`ETC_SECRETS`], the host's ssh host keys) and any `hidden` path of
//! the spec that lies under a bound directory are covered by an empty read-only file or
//! directory. Nothing else of the host is reachable: the old root is detached after
//! `pivot_root`.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::host::open_directory;
use super::{Handoff, SandboxSpec, SetupError, Step as _, WORKSPACE_PATH};

/// Where the sandbox sees the helper binary (read-only, executable).
pub const HELPER_PATH: &str = "/.execution-helper";

/// The host directories the sandbox sees, read-only.
pub const HOST_SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Paths under `/etc` that hold secrets and are masked (besides `ssh/ssh_host_*_key`).
pub const ETC_SECRETS: [&str; 21] = [
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "security/opasswd",
    "ssl/private",
    "pki/tls/private",
    "krb5.keytab",
    "ipsec.secrets",
    "ipsec.d/private",
    "ppp/chap-secrets",
    "ppp/pap-secrets",
    "wireguard",
    "NetworkManager/system-connections",
    "letsencrypt",
    "kubernetes",
    "rancher",
    "docker",
    "execution-provider",
];

/// `/proc` entries that describe the host's kernel: masked.
const PROC_MASKED: [&str; 7] = [
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "acpi",
    "scsi",
];
/// `/proc` entries that could change the host's kernel: read-only.
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Host device nodes bound into `/dev`.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Where the new root is assembled: a directory every host has, shadowed only in the
/// sandbox's own mount namespace (the workspace is reached through its descriptor, so it may
/// lie under it).
const STAGING: &str = "/tmp";
/// An empty file in the staging root that masks files; removed before the root is sealed.
const EMPTY_FILE: &str = ".masked";

/// Builds the root and pivots into it; the current directory is the workspace afterwards.
pub fn build(spec: &SandboxSpec, handoff: &Handoff) -> Result<(), SetupError> {
    // Opened before the staging tmpfs hides the host stage's /tmp.
    let workspace = open_directory(&handoff.workspace)?;
    let helper = std::fs::File::open(&handoff.helper).step("opening the helper's binary")?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .step("making the mounts private")?;
    let root = Path::new(STAGING);
    rustix::mount::mount(
        "tmpfs",
        root,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=4m",
    )
    .step("mounting the root tmpfs")?;
    std::fs::write(root.join(EMPTY_FILE), b"").step("creating the mask file")?;
    for host in HOST_SYSTEM_DIRS {
        place_system_dir(root, host)?;
    }
    mask_secrets(root, &spec.hidden)?;

    let inside = root.join(WORKSPACE_PATH.trim_start_matches('/'));
    make_dir(&inside)?;
    let source = format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&workspace)
    );
    rustix::mount::mount_bind(source.as_str(), &inside).step("mounting the workspace")?;
    remount_bind(&inside, &source, MountFlags::NOSUID | MountFlags::NODEV)?;
    drop(workspace);

    place_helper(root, &helper)?;
    drop(helper);
    let tmp = root.join("tmp");
    make_dir(&tmp)?;
    let tmp_options = format!("mode=1777,size={}", spec.limits.tmp_bytes);
    mount_tmpfs(&tmp, MountFlags::NOSUID | MountFlags::NODEV, &tmp_options)?;
    build_dev(&root.join("dev"))?;
    build_proc(root, &root.join("proc"))?;
    enter_root(root)
}

/// Binds this program (the helper, whose host path the sandbox does not see) read-only at
/// [`HELPER_PATH`], so that the init can start its reapers and per-call helpers with a path
/// Landlock lets it execute.
fn place_helper(root: &Path, helper: &std::fs::File) -> Result<(), SetupError> {
    let inside = root.join(HELPER_PATH.trim_start_matches('/'));
    std::fs::write(&inside, b"").step("creating the helper's mount point")?;
    let source = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(helper));
    bind_read_only(Path::new(&source), &inside)
}

/// Places host directory `host` in the new root: its symlink as is, or a read-only bind.
fn place_system_dir(root: &Path, host: &str) -> Result<(), SetupError> {
    let inside = root.join(host.trim_start_matches('/'));
    let Ok(meta) = std::fs::symlink_metadata(host) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(host).step("reading a system symlink")?;
        std::os::unix::fs::symlink(target, &inside).step("placing a system symlink")
    } else if meta.is_dir() {
        make_dir(&inside)?;
        bind_read_only(Path::new(host), &inside)
    } else {
        Ok(())
    }
}

/// Covers `/etc`'s secrets and the spec's hidden paths.
fn mask_secrets(root: &Path, hidden: &[PathBuf]) -> Result<(), SetupError> {
    let etc = root.join("etc");
    for secret in ETC_SECRETS {
        mask(root, &etc.join(secret))?;
    }
    if let Ok(entries) = std::fs::read_dir(etc.join("ssh")) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("ssh_host_") && name.ends_with("_key") {
                mask(root, &entry.path())?;
            }
        }
    }
    for path in hidden {
        let under_bound = HOST_SYSTEM_DIRS
            .iter()
            .any(|dir| path.starts_with(dir) && path != Path::new(dir));
        if under_bound && path.is_absolute() {
            mask(root, &root.join(path.strip_prefix("/").unwrap_or(path)))?;
        } else if HOST_SYSTEM_DIRS.iter().any(|dir| Path::new(dir) == path) {
            return Err(SetupError::new(
                "hiding the provider's files",
                format!("{} is a system directory", path.display()),
            ));
        }
    }
    Ok(())
}

/// Covers `path` (inside the staging root) with an empty read-only file or directory. A
/// missing path needs nothing; a symlink is left alone (what it names is masked by its own
/// entry, or lies outside what the sandbox sees).
fn mask(root: &Path, path: &Path) -> Result<(), SetupError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let read_only = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    if meta.is_dir() {
        mount_tmpfs(path, read_only | MountFlags::NOEXEC, "mode=0755,size=4k")
            .map_err(|e| SetupError::new(format!("masking {}", path.display()), e.cause))
    } else if meta.file_type().is_symlink() {
        Ok(())
    } else {
        let empty = root.join(EMPTY_FILE);
        rustix::mount::mount_bind(&empty, path).step(&format!("masking {}", path.display()))?;
        remount_bind(
            path,
            &empty,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        )
    }
}

fn build_dev(dev: &Path) -> Result<(), SetupError> {
    make_dir(dev)?;
    mount_tmpfs(
        dev,
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0755,size=64k",
    )?;
    for name in DEVICES {
        let node = dev.join(name);
        std::fs::write(&node, b"").step("creating a device mount point")?;
        rustix::mount::mount_bind(Path::new("/dev").join(name), &node)
            .step(&format!("binding /dev/{name}"))?;
    }
    let pts = dev.join("pts");
    make_dir(&pts)?;
    rustix::mount::mount(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"newinstance,ptmxmode=0666,mode=0620",
    )
    .step("mounting devpts")?;
    let shm = dev.join("shm");
    make_dir(&shm)?;
    mount_tmpfs(
        &shm,
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "mode=1777,size=64m",
    )?;
    let links = [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ];
    for (name, target) in links {
        std::os::unix::fs::symlink(target, dev.join(name)).step("creating /dev links")?;
    }
    rustix::mount::mount_remount(
        dev,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0755,size=64k",
    )
    .step("sealing /dev")
}

fn build_proc(root: &Path, proc: &Path) -> Result<(), SetupError> {
    make_dir(proc)?;
    rustix::mount::mount(
        "proc",
        proc,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .step("mounting /proc")?;
    for name in PROC_MASKED {
        mask(root, &proc.join(name))?;
    }
    for name in PROC_READ_ONLY {
        let path = proc.join(name);
        if path.exists() {
            bind_read_only(&path, &path)?;
        }
    }
    Ok(())
}

/// `pivot_root` into `root`, detaches the host's root, removes the mask file and seals the
/// root read-only.
fn enter_root(root: &Path) -> Result<(), SetupError> {
    std::env::set_current_dir(root).step("entering the new root")?;
    rustix::process::pivot_root(".", ".").step("pivot_root")?;
    rustix::mount::unmount(".", UnmountFlags::DETACH).step("detaching the host's root")?;
    std::env::set_current_dir("/").step("entering the new root")?;
    std::fs::remove_file(Path::new("/").join(EMPTY_FILE)).step("removing the mask file")?;
    // A per-mount read-only flag: the tmpfs itself still holds the unlinked mask file, which
    // a read-only remount of the whole file system would refuse.
    rustix::mount::mount_remount(
        "/",
        MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .step("sealing the root read-only")?;
    std::env::set_current_dir(WORKSPACE_PATH).step("entering the workspace")
}

fn make_dir(path: &Path) -> Result<(), SetupError> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .step(&format!("creating {}", path.display()))
}

fn mount_tmpfs(path: &Path, flags: MountFlags, options: &str) -> Result<(), SetupError> {
    let options = std::ffi::CString::new(options).step("tmpfs options")?;
    rustix::mount::mount("tmpfs", path, "tmpfs", flags, options.as_c_str())
        .step(&format!("mounting a tmpfs on {}", path.display()))
}

/// Binds `source` at `target` and makes the bind read-only, nosuid and nodev.
fn bind_read_only(source: &Path, target: &Path) -> Result<(), SetupError> {
    rustix::mount::mount_bind(source, target).step(&format!("binding {}", source.display()))?;
    remount_bind(
        target,
        source,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
    )
}

/// Remounts the bind at `target` with `flags` plus the flags of `source`'s mount, which a
/// user namespace may not clear (they are locked when they come from a more privileged one).
fn remount_bind(
    target: &Path,
    source: impl AsRef<Path>,
    flags: MountFlags,
) -> Result<(), SetupError> {
    let kept = rustix::fs::statvfs(source.as_ref())
        .map(|s| locked_flags(s.f_flag))
        .unwrap_or(MountFlags::empty());
    rustix::mount::mount_remount(target, MountFlags::BIND | flags | kept, "")
        .step(&format!("remounting {}", target.display()))
}

/// The mount flags that `statvfs` reports and a remount must keep.
pub fn locked_flags(reported: StatVfsMountFlags) -> MountFlags {
    let mut flags = MountFlags::empty();
    let pairs = [
        (StatVfsMountFlags::RDONLY, MountFlags::RDONLY),
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ];
    for (reported_flag, mount_flag) in pairs {
        if reported.contains(reported_flag) {
            flags |= mount_flag;
        }
    }
    if !reported.intersects(StatVfsMountFlags::NOATIME | StatVfsMountFlags::RELATIME) {
        flags |= MountFlags::STRICTATIME;
    }
    flags
}
