//! The sandbox's pids cgroup: a child of the provider's own cgroup in the pids hierarchy
//! (cgroup v1 `pids` controller, or cgroup v2 with `pids` delegated), with `pids.max` set.
//!
//! The host stage joins it before it starts anything, so every process and thread of the
//! sandbox is counted from the first, and removes it once the sandbox has ended. A per-uid
//! `RLIMIT_NPROC` is the fallback where no writable pids hierarchy exists (see
//! `docs/sandbox.md`).

use std::path::{Path, PathBuf};

use super::{SetupError, Step as _};

/// The directory under the provider's cgroup that holds one cgroup per sandbox.
pub const PARENT_DIR: &str = "execution-provider";

/// A pids cgroup this process has joined.
#[derive(Debug)]
pub struct PidsCgroup {
    dir: PathBuf,
    parent: PathBuf,
}

impl PidsCgroup {
    /// Creates `<own pids cgroup>/execution-provider/<name>-<pid>` with `pids.max = max` (when
    /// given) and moves this process into it. `Ok(None)`: the machine has no pids hierarchy
    /// this process may write.
    pub fn join(name: &str, max: Option<u32>) -> Result<Option<PidsCgroup>, SetupError> {
        let Some(own) = own_pids_cgroup() else {
            return Ok(None);
        };
        let parent = own.join(PARENT_DIR);
        match std::fs::create_dir(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Ok(None),
            Err(e) => return Err(SetupError::new("creating the pids cgroup", e)),
        }
        let dir = create_own_dir(&parent, &format!("{name}-{}", std::process::id()))?;
        let cgroup = PidsCgroup { dir, parent: own };
        if let Some(max) = max {
            std::fs::write(cgroup.dir.join("pids.max"), max.to_string())
                .step("setting pids.max")?;
        }
        std::fs::write(
            cgroup.dir.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .step("joining the pids cgroup")?;
        Ok(Some(cgroup))
    }

    /// Moves this process back to the provider's cgroup and removes the sandbox's (all its
    /// other members have ended: the host stage reaped the sandbox).
    pub fn leave_and_remove(self) {
        let _ = std::fs::write(
            self.parent.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!(
                "execution-helper sandbox: cannot remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// The cgroups that sandboxes and plain holders named `name` joined under this process's pids
/// hierarchy (`<name>-<pid>`, or `<name>-<pid>.<n>`), from this or any earlier provider of
/// the machine. `None`: there is no pids hierarchy this process may write, so nothing can be
/// found this way.
pub fn joined_by(name: &str) -> Option<Vec<PathBuf>> {
    let parent = own_pids_cgroup()?.join(PARENT_DIR);
    match std::fs::create_dir(&parent) {
        Ok(()) => return Some(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let entries = std::fs::read_dir(&parent).ok()?;
    let prefix = format!("{name}-");
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            let file_name = entry.file_name();
            let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                return false;
            };
            let (pid, suffix) = rest.split_once('.').unwrap_or((rest, "0"));
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            digits(pid) && digits(suffix)
        })
        .map(|entry| entry.path())
        .collect();
    found.sort();
    Some(found)
}

/// One round of ending the cgroup `dir`: SIGKILL to every process it lists, then an attempt to
/// remove it, which the kernel allows only once no process is left in it. True once it is
/// gone (removed now or already).
pub fn kill_and_remove(dir: &Path) -> bool {
    let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(procs) => procs,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    for pid in procs
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// How many other names `create_own_dir` tries when a stale directory under this process's
/// name cannot be removed.
const NAME_ATTEMPTS: u32 = 8;

/// Creates the sandbox's cgroup directory `parent/base`. The name carries this process's pid,
/// so a directory already there is a stale one: left by an earlier process that had the same
/// pid (pids wrap, and a host stage killed before it could clean up leaves its directory).
/// An empty stale directory is removed and the name reused; one that still holds tasks (or
/// cannot be removed) is left alone and a suffixed name is taken instead.
fn create_own_dir(parent: &Path, base: &str) -> Result<PathBuf, SetupError> {
    let stale = parent.join(base);
    match std::fs::create_dir(&stale) {
        Ok(()) => return Ok(stale),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(SetupError::new("creating the pids cgroup", e)),
    }
    if std::fs::remove_dir(&stale).is_ok() {
        std::fs::create_dir(&stale).step("creating the pids cgroup")?;
        return Ok(stale);
    }
    for attempt in 1..=NAME_ATTEMPTS {
        let dir = parent.join(format!("{base}.{attempt}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if std::fs::remove_dir(&dir).is_ok() {
                    std::fs::create_dir(&dir).step("creating the pids cgroup")?;
                    return Ok(dir);
                }
            }
            Err(e) => return Err(SetupError::new("creating the pids cgroup", e)),
        }
    }
    Err(SetupError::new(
        "creating the pids cgroup",
        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
    ))
}

/// This process's cgroup directory in a writable pids hierarchy.
fn own_pids_cgroup() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (mount, v2) = pids_mount(&mountinfo)?;
    let own = cgroup_path(&cgroups, v2)?;
    let dir = mount.join(own.trim_start_matches('/'));
    if v2 {
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
        if !controllers.split_whitespace().any(|c| c == "pids") {
            return None;
        }
        // Children count tasks only when the controller is enabled for them.
        std::fs::write(dir.join("cgroup.subtree_control"), "+pids").ok()?;
    }
    Some(dir)
}

/// The mount point of the pids hierarchy: a cgroup v1 mount with the `pids` option, else the
/// cgroup v2 mount. The bool says v2.
pub fn pids_mount(mountinfo: &str) -> Option<(PathBuf, bool)> {
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split(' ').nth(4)?;
        let mut right = right.split(' ');
        let fs_type = right.next()?;
        let super_options = right.nth(1).unwrap_or("");
        if fs_type == "cgroup" && super_options.split(',').any(|o| o == "pids") {
            return Some((PathBuf::from(mount_point), false));
        }
        if fs_type == "cgroup2" && v2.is_none() {
            v2 = Some(PathBuf::from(mount_point));
        }
    }
    v2.map(|mount| (mount, true))
}

/// This process's path in the pids hierarchy from `/proc/self/cgroup`.
pub fn cgroup_path(cgroups: &str, v2: bool) -> Option<String> {
    cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let matches = if v2 {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "pids")
        };
        matches.then(|| path.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
33 25 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
";

    #[test]
    fn a_v1_pids_mount_wins_over_the_unified_one() {
        assert_eq!(
            pids_mount(HYBRID),
            Some((PathBuf::from("/sys/fs/cgroup/pids"), false))
        );
        let only_v2 = "26 25 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            pids_mount(only_v2),
            Some((PathBuf::from("/sys/fs/cgroup"), true))
        );
        assert_eq!(pids_mount("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }

    #[test]
    fn a_stale_directory_under_this_name_is_replaced_and_a_busy_one_skipped() {
        let parent = std::env::temp_dir().join(format!("ep-cgroup-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        // An empty directory left by an earlier process with this pid: removed and reused.
        std::fs::create_dir(parent.join("env-1")).unwrap();
        assert_eq!(
            create_own_dir(&parent, "env-1").unwrap(),
            parent.join("env-1")
        );
        // One that cannot be removed (here: not empty, as a cgroup with tasks is busy): the
        // next free suffixed name.
        std::fs::write(parent.join("env-1").join("task"), "").unwrap();
        assert_eq!(
            create_own_dir(&parent, "env-1").unwrap(),
            parent.join("env-1.1")
        );
        assert_eq!(
            create_own_dir(&parent, "env-2").unwrap(),
            parent.join("env-2")
        );
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn the_own_path_is_read_from_the_matching_controller_line() {
        let cgroups = "9:name=systemd:/\n8:pids:/user.slice\n4:memory:/x\n0::/session.scope\n";
        assert_eq!(cgroup_path(cgroups, false).as_deref(), Some("/user.slice"));
        assert_eq!(
            cgroup_path(cgroups, true).as_deref(),
            Some("/session.scope")
        );
        assert_eq!(cgroup_path("4:memory:/x\n", false), None);
    }
}
