//! Descriptors one sandbox stage leaves open across `execve` for the next one.
//!
//! The init stage is a fresh `execve` of the same program (stage 2, a fork of stage 1, owns
//! its descriptors already), so the only way to hand it the listening socket is an inherited
//! descriptor whose number travels in the handoff. Taking ownership of such a number is the one `unsafe` operation of
//! the crate; it is confined here and checked.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd as _, OwnedFd};

use super::SetupError;

/// Takes ownership of descriptor `raw`, which the previous stage left open for this one.
pub fn take(raw: i32, what: &str) -> Result<OwnedFd, SetupError> {
    // Standard streams are std's; anything else must be open in this process.
    if raw <= 2 || std::fs::symlink_metadata(format!("/proc/self/fd/{raw}")).is_err() {
        return Err(SetupError::new(
            what,
            format!("descriptor {raw} was not handed down"),
        ));
    }
    // SAFETY: `raw` is open (checked above) and above the standard streams. This process was
    // just started by `execve`, which keeps no Rust owner of any inherited descriptor, and the
    // stage takes each handed-down number exactly once, so no other `OwnedFd` owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// [`take`], and marks the descriptor close-on-exec so that nothing this stage starts inherits
/// it.
pub fn take_close_on_exec(raw: i32, what: &str) -> Result<OwnedFd, SetupError> {
    let fd = take(raw, what)?;
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| SetupError::new(what, e))?;
    Ok(fd)
}

/// Closes every descriptor above the standard streams: the host stage starts with nothing
/// but what the launcher meant to give (a stray descriptor would reach the workload).
pub fn close_strays() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let numbers: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is closed by now; `take` skips numbers no longer open.
    for raw in numbers {
        if let Ok(fd) = take(raw, "a stray descriptor") {
            drop(fd);
        }
    }
}
