//! Starting the user-namespace stage as a fork of the host stage, without `execve`: the two
//! processes then share the program's pages copy-on-write, the ones the dynamic loader's
//! relocations made private included (about 290 KiB that every freshly executed stage holds
//! on its own; docs/sandbox.md, docs/performance.md). The fork is the crate's one other
//! `unsafe` operation besides taking inherited descriptors; it is confined here and checked.
#![allow(unsafe_code)]

use rustix::process::{Pid, Signal, WaitOptions};

use super::SetupError;

/// Which side of a fork this process is on.
#[derive(Debug)]
pub enum Forked {
    /// The new process.
    Child,
    /// The process that forked, with the child's pid.
    Parent(Pid),
}

/// Forks this process, which must have exactly one thread (a sandbox stage before it starts
/// any: [`super::enter`] runs first thing in `main`).
pub fn fork_single_threaded(step: &str) -> Result<Forked, SetupError> {
    match thread_count() {
        Some(1) => {}
        Some(n) => {
            return Err(SetupError::new(
                step,
                format!("the process has {n} threads"),
            ));
        }
        None => {
            return Err(SetupError::new(
                step,
                "the process's thread count is unknown",
            ));
        }
    }
    // SAFETY: the process has one thread (checked above), so no other thread can hold a lock
    // (the allocator's, stdio's) that the child would inherit held. The child runs only this
    // program's own code and ends with an exit of its own, never returning into the frames it
    // was forked from.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => Ok(Forked::Child),
        Ok(nix::unistd::ForkResult::Parent { child }) => Pid::from_raw(child.as_raw())
            .map(Forked::Parent)
            .ok_or_else(|| SetupError::new(step, "the fork returned no pid")),
        Err(e) => Err(SetupError::new(step, e)),
    }
}

/// Waits for the forked child `pid` to end and returns its status.
pub fn wait(pid: Pid, step: &str) -> Result<std::process::ExitStatus, SetupError> {
    use std::os::unix::process::ExitStatusExt as _;
    loop {
        match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                return Ok(std::process::ExitStatus::from_raw(status.as_raw()));
            }
            Ok(None) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(SetupError::new(step, e)),
        }
    }
}

/// Kills the forked child `pid` (its end is then waited for by [`wait`]).
pub fn kill(pid: Pid) {
    let _ = rustix::process::kill_process(pid, Signal::KILL);
}

/// The number of threads of this process, from `/proc/self/status`.
fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_more_than_one_thread_is_not_forked() {
        // The test harness runs this test on a thread of its own besides the main one.
        let error = fork_single_threaded("forking a stage").unwrap_err();
        assert!(error.to_string().contains("threads"), "{error}");
    }
}
