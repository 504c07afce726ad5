//! The sandbox's seccomp filter, with the semantics of the container runtimes' default
//! profile: an allow-list (any system call not on it fails with `EPERM`, so a system call
//! newer than the list is refused), `clone` only without namespace flags, `clone3` failing
//! with `ENOSYS` so that libc falls back to the `clone` the filter can inspect, and
//! `personality` only with the harmless personas.
//!
//! Refused besides everything unlisted, as by the runtimes for a container without added
//! capabilities: mounting and namespaces (`mount`, `umount2`, `pivot_root`, `chroot`,
//! `unshare`, `setns`, the new mount API), tracing other processes (`ptrace`,
//! `process_vm_readv`/`writev`, `kcmp`, `pidfd_getfd`), the kernel's own state (`bpf`,
//! `perf_event_open`, `kexec_*`, `*_module`, `reboot`, `swapon`/`swapoff`, `acct`, the
//! clocks' setters, `iopl`/`ioperm`, `quotactl`, `syslog`), the kernel keyring, `userfaultfd`,
//! `io_uring`, file handles (`open_by_handle_at`, `name_to_handle_at`), NUMA policy and
//! `fanotify`. Stricter than the runtimes: `ptrace` is refused on every kernel, so nothing in
//! the sandbox can trace the init (the helper, later the supervisor).

use seccompiler::TargetArch;
use serde_json::{Value, json};

use super::{SetupError, Step as _};

/// `EPERM`, the answer to a refused system call.
pub const REFUSED_ERRNO: u32 = 1;
/// `ENOSYS`, the answer to `clone3`.
pub const CLONE3_ERRNO: u32 = 38;
/// The namespace flags `clone` may not carry (`CLONE_NEWNS`, `NEWCGROUP`, `NEWUTS`,
/// `NEWIPC`, `NEWUSER`, `NEWPID`, `NEWNET`).
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7e02_0000;
/// The personas `personality` may select: Linux, 32-bit Linux, `UNAME26` of both, query.
pub const PERSONAS: [u64; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// System calls allowed on every architecture.
pub const ALLOWED: &[&str] = &[
    // Files and descriptors.
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "openat",
    "openat2",
    "close",
    "close_range",
    "lseek",
    "dup",
    "dup3",
    "fcntl",
    "flock",
    "fsync",
    "fdatasync",
    "sync",
    "syncfs",
    "sync_file_range",
    "truncate",
    "ftruncate",
    "fallocate",
    "fadvise64",
    "readahead",
    "sendfile",
    "splice",
    "tee",
    "vmsplice",
    "copy_file_range",
    "pipe2",
    "ioctl",
    "memfd_create",
    // Metadata and names.
    "fstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "faccessat",
    "faccessat2",
    "readlinkat",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "mkdirat",
    "renameat",
    "renameat2",
    "linkat",
    "unlinkat",
    "symlinkat",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "umask",
    "utimensat",
    "mknodat",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    // Memory.
    "brk",
    "mmap",
    "munmap",
    "mremap",
    "mprotect",
    "madvise",
    "mincore",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "msync",
    "membarrier",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "remap_file_pages",
    // Processes, threads and credentials (clone and personality are conditional, below).
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "getpid",
    "gettid",
    "getppid",
    "getpgid",
    "setpgid",
    "getsid",
    "setsid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capget",
    "capset",
    "prctl",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "rseq",
    "futex",
    "futex_waitv",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getparam",
    "sched_setparam",
    "sched_getscheduler",
    "sched_setscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "sched_getattr",
    "sched_setattr",
    "getpriority",
    "setpriority",
    "ioprio_get",
    "ioprio_set",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "times",
    "uname",
    "sethostname",
    "setdomainname",
    "sysinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "getcpu",
    "restart_syscall",
    "seccomp",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    // Signals.
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigpending",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "sigaltstack",
    "signalfd4",
    // Time.
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "nanosleep",
    "gettimeofday",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_getoverrun",
    "timer_delete",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_gettime",
    // Waiting on events.
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "ppoll",
    "pselect6",
    "eventfd2",
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    // Sockets.
    "socket",
    "socketpair",
    "bind",
    "listen",
    "accept",
    "accept4",
    "connect",
    "getsockname",
    "getpeername",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "setsockopt",
    "getsockopt",
    "shutdown",
    // System V and POSIX IPC (the sandbox has its own IPC namespace).
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    // Randomness.
    "getrandom",
];

/// The older system calls x86-64 keeps besides the generic ones.
pub const ALLOWED_X86_64: &[&str] = &[
    "open",
    "creat",
    "stat",
    "lstat",
    "access",
    "readlink",
    "getdents",
    "mkdir",
    "rmdir",
    "rename",
    "link",
    "unlink",
    "symlink",
    "chmod",
    "chown",
    "lchown",
    "utime",
    "utimes",
    "futimesat",
    "mknod",
    "pipe",
    "dup2",
    "select",
    "poll",
    "epoll_create",
    "epoll_wait",
    "eventfd",
    "signalfd",
    "inotify_init",
    "fork",
    "vfork",
    "pause",
    "alarm",
    "time",
    "getpgrp",
    "arch_prctl",
    "set_thread_area",
    "get_thread_area",
];

/// Refused system calls the tests name (each also absent from [`ALLOWED`]).
pub const REFUSED_EXAMPLES: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "kexec_load",
    "init_module",
    "reboot",
    "swapon",
    "userfaultfd",
    "io_uring_setup",
    "open_by_handle_at",
    "fsopen",
    "move_mount",
    "kcmp",
    "acct",
    "settimeofday",
];

/// The filter as the seccompiler JSON document: `allowlist`, then `clone3`.
pub fn profile(arch: TargetArch) -> Value {
    let mut rules: Vec<Value> = ALLOWED
        .iter()
        .map(|name| json!({ "syscall": name }))
        .collect();
    if arch == TargetArch::x86_64 {
        rules.extend(ALLOWED_X86_64.iter().map(|name| json!({ "syscall": name })));
    }
    rules.push(json!({
        "syscall": "clone",
        "args": [{ "index": 0, "type": "qword", "op": { "masked_eq": CLONE_NAMESPACE_FLAGS }, "val": 0 }],
    }));
    for persona in PERSONAS {
        rules.push(json!({
            "syscall": "personality",
            "args": [{ "index": 0, "type": "dword", "op": "eq", "val": persona }],
        }));
    }
    json!({
        "allowlist": {
            "mismatch_action": { "errno": REFUSED_ERRNO },
            "filter_action": "allow",
            "filter": rules,
        },
        "clone3": {
            "mismatch_action": "allow",
            "filter_action": { "errno": CLONE3_ERRNO },
            "filter": [{ "syscall": "clone3" }],
        },
    })
}

/// Compiles [`profile`] for this machine and installs it on the calling thread (the init is
/// single-threaded here, so on the whole process and all it starts).
pub fn install() -> Result<(), SetupError> {
    let step = "installing the seccomp filter";
    let arch = TargetArch::try_from(std::env::consts::ARCH).step(step)?;
    let document = serde_json::to_vec(&profile(arch)).expect("the profile encodes");
    let mut filters = seccompiler::compile_from_json(document.as_slice(), arch).step(step)?;
    // Installed last, the clone3 filter is evaluated first; of two errno answers the kernel
    // keeps the first, ENOSYS.
    for name in ["allowlist", "clone3"] {
        let program = filters
            .remove(name)
            .ok_or_else(|| SetupError::new(step, format!("no {name} filter")))?;
        seccompiler::apply_filter(&program).step(step)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_compiles_for_every_supported_architecture() {
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            let document = serde_json::to_vec(&profile(arch)).unwrap();
            let filters = seccompiler::compile_from_json(document.as_slice(), arch)
                .unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            assert_eq!(filters.len(), 2);
        }
    }

    #[test]
    fn the_refused_examples_are_not_allowed() {
        for name in REFUSED_EXAMPLES {
            assert!(
                !ALLOWED.contains(name) && !ALLOWED_X86_64.contains(name),
                "{name}"
            );
        }
        assert!(!ALLOWED.contains(&"clone3") && !ALLOWED.contains(&"clone"));
    }
}
