//! The physical floors the figures are compared with, measured raw on the same machine and
//! disk in the same run: a `sh -c true` spawned bare and inside a running environment's
//! sandbox (its namespaces joined with `setns`, no supervisor, no helper), one durable 4 KiB
//! page write (what one SQLite commit in WAL mode with `synchronous=FULL` costs), and a durable
//! 4 MiB file write followed by its read.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;

use crate::calls::Samples;
use crate::dev::{cmdline, descendants};

/// Times `n` runs of a blocking `step`.
fn series(n: usize, mut step: impl FnMut(usize) -> Duration) -> Samples {
    Samples((0..n).map(&mut step).collect())
}

fn spawn_timed(mut command: Command) -> std::io::Result<Duration> {
    command
        .args(["-c", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let began = Instant::now();
    let status = command.status()?;
    let took = began.elapsed();
    if !status.success() {
        return Err(std::io::Error::other(format!("sh -c true: {status}")));
    }
    Ok(took)
}

/// `sh -c true` spawned by this process on the host, `n` times.
pub fn bare_spawn(n: usize) -> Samples {
    series(n, |_| spawn_timed(Command::new("sh")).expect("sh -c true"))
}

/// Whether `pid` is the first process of its PID namespace.
fn is_namespace_init(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .is_some_and(|ids| {
                let ids: Vec<&str> = ids.split_whitespace().collect();
                ids.len() > 1 && ids.last() == Some(&"1")
            })
    })
}

/// The init of `environment`'s sandbox among the processes `dev_pid` started.
pub fn sandbox_init(dev_pid: u32, environment: &str) -> Option<u32> {
    descendants(dev_pid).into_iter().find(|&pid| {
        is_namespace_init(pid) && cmdline(pid).is_some_and(|c| c.contains(environment))
    })
}

/// How many sandboxes (PID-namespace inits) `dev_pid` runs.
pub fn sandbox_count(dev_pid: u32) -> usize {
    descendants(dev_pid)
        .into_iter()
        .filter(|&pid| is_namespace_init(pid))
        .count()
}

/// The namespaces a sandbox's command lives in, user first (joining it grants the rights to
/// join the others).
const NAMESPACES: [(&str, CloneFlags); 6] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("mnt", CloneFlags::CLONE_NEWNS),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("pid", CloneFlags::CLONE_NEWPID),
];

/// `/bin/sh -c true` forked from this process into the namespaces of `init` (its root, its
/// network, its users); the PID namespace applies to the shell's own children.
fn spawn_in(init: u32) -> std::io::Result<Duration> {
    let mut joined: Vec<(OwnedFd, CloneFlags)> = Vec::new();
    for (name, flag) in NAMESPACES {
        joined.push((File::open(format!("/proc/{init}/ns/{name}"))?.into(), flag));
    }
    let mut command = Command::new("/bin/sh");
    // SAFETY: the closure runs in the forked child before exec and only calls setns(2),
    // which is async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            for (fd, flag) in &joined {
                nix::sched::setns(fd, *flag).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    spawn_timed(command)
}

/// `sh -c true` spawned inside the sandbox whose init is `init`, `n` times.
pub fn sandbox_spawn(init: u32, n: usize) -> std::io::Result<Samples> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        samples.push(spawn_in(init)?);
    }
    Ok(Samples(samples))
}

/// Pages of the file [`durable_page_write`] overwrites.
const PAGES: u64 = 256;

/// Overwrites of one 4 KiB page of a preallocated file, each followed by `fdatasync`, in
/// `dir`: `n` of them (what one commit to a SQLite write-ahead log in use costs at least).
pub fn durable_page_write(dir: &Path, n: usize) -> Samples {
    use std::os::unix::fs::FileExt as _;
    let file = File::create(dir.join("floor-pages")).expect("a page file");
    file.write_all_at(&vec![0u8; (PAGES * 4096) as usize], 0)
        .expect("preallocation");
    file.sync_all().expect("fsync");
    let page = [7u8; 4096];
    series(n, |i| {
        let began = Instant::now();
        file.write_all_at(&page, (i as u64 % PAGES) * 4096)
            .expect("write");
        file.sync_data().expect("fdatasync");
        began.elapsed()
    })
}

/// A new file of `data` written and fsynced (file and directory), then read back, in `dir`:
/// `n` of them.
pub fn durable_file_round_trip(dir: &Path, data: &[u8], n: usize) -> Samples {
    let directory = File::open(dir).expect("the directory");
    let samples = series(n, |i| {
        let path = dir.join(format!("floor-file-{i}"));
        let began = Instant::now();
        let mut file = File::create(&path).expect("create");
        file.write_all(data).expect("write");
        file.sync_all().expect("fsync");
        directory.sync_all().expect("fsync of the directory");
        let mut back = Vec::with_capacity(data.len());
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut back))
            .expect("read");
        let took = began.elapsed();
        assert_eq!(back.len(), data.len());
        took
    });
    for i in 0..n {
        let _ = std::fs::remove_file(dir.join(format!("floor-file-{i}")));
    }
    samples
}
