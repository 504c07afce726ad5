//! Proving that a command left nothing behind (k8s-executor §4.3).
//!
//! The helper is a child subreaper, so every process the command started ends up as the
//! helper's child when its parent dies. After the shell exits the helper kills the command's
//! process group, then repeatedly kills every remaining child and reaps with
//! `waitpid(-1, WNOHANG)`. `ECHILD` (no children left at all) is the only proof of a clean end.

use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

/// How long the sweep may try to reach `ECHILD`.
pub const SWEEP_WINDOW: Duration = Duration::from_secs(2);
/// Pause between sweep rounds.
pub const SWEEP_POLL: Duration = Duration::from_millis(5);

/// Makes this process a child subreaper; false if the kernel refused (or is not Linux).
pub fn become_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Sends SIGKILL to the process group `group` (already gone is fine).
pub fn kill_group(group: Pid) {
    let _ = rustix::process::kill_process_group(group, Signal::KILL);
}

/// Kills and reaps every child of this process until none is left; true on `ECHILD` within
/// `window`.
///
/// Call it only when no other code of this process waits for children (the shell has been
/// waited for already).
pub async fn sweep_children(window: Duration) -> bool {
    let sweep = async {
        loop {
            for child in direct_children() {
                let _ = rustix::process::kill_process(child, Signal::KILL);
            }
            loop {
                match rustix::process::wait(WaitOptions::NOHANG) {
                    Err(Errno::CHILD) => return true,
                    Ok(Some(_)) | Err(Errno::INTR) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
            tokio::time::sleep(SWEEP_POLL).await;
        }
    };
    tokio::time::timeout(window, sweep).await.unwrap_or(false)
}

/// Every live descendant of this process (children, their children, ...), read from
/// `/proc/<pid>/task/*/children`; empty where the kernel lacks those files.
pub fn descendants() -> Vec<Pid> {
    let mut found = Vec::new();
    let mut frontier = direct_children();
    while let Some(pid) = frontier.pop() {
        if found.contains(&pid) || found.len() >= 65_536 {
            continue;
        }
        found.push(pid);
        frontier.extend(children_of(pid));
    }
    found
}

/// Sends `signal` to the process group `group` and to every descendant of this process.
pub fn signal_tree(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, signal);
    }
    for pid in descendants() {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// The live children of process `pid`, from `/proc/<pid>/task/*/children` when the kernel
/// has it, otherwise from the parent field of every `/proc/<pid>/stat`.
pub fn children_of(pid: Pid) -> Vec<Pid> {
    let mut children = Vec::new();
    let mut have_children_files = false;
    let dir = format!("/proc/{}/task", pid.as_raw_nonzero());
    if let Ok(tasks) = std::fs::read_dir(dir) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                have_children_files = true;
                children.extend(text.split_whitespace().filter_map(parse_pid));
            }
        }
    }
    if have_children_files {
        return children;
    }
    let parent = pid.as_raw_nonzero().get();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return children;
    };
    for process in processes.flatten() {
        let name = process.file_name();
        let Some(pid) = name.to_str().and_then(parse_pid) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(process.path().join("stat")) else {
            continue;
        };
        if parent_of(&stat) == Some(parent) {
            children.push(pid);
        }
    }
    children
}

/// The live children of this process ([`children_of`] it).
pub fn direct_children() -> Vec<Pid> {
    children_of(rustix::process::getpid())
}

fn parse_pid(text: &str) -> Option<Pid> {
    text.parse::<i32>().ok().and_then(Pid::from_raw)
}

/// The parent pid from a `/proc/<pid>/stat` line (`pid (comm) state ppid …`; comm may hold
/// spaces and parentheses, so fields are counted after the last `)`).
fn parent_of(stat: &str) -> Option<i32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_after_the_command_name() {
        assert_eq!(parent_of("42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_of("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_of("garbage"), None);
    }
}
