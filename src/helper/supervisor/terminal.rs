//! A command's pseudo-terminal (docs/commands.md §8): the reaper opens a PTY pair, runs the
//! shell on the terminal side as the leader of a new session with that terminal as its
//! controlling terminal, and keeps the master side to read output from, write stdin to and
//! resize.
//!
//! Opening, granting, the peer, the window size and the controlling terminal all go through
//! rustix's `pty`, `termios` and `process` modules. Making the shell a session leader with a
//! controlling terminal has to happen in the child between `fork` and `execve`: that hook, and
//! registering the owned master with the runtime's reactor, are the two `unsafe` blocks of this
//! module.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::process::Stdio;

use rustix::fs::{Mode, OFlags};
use rustix::process::Pid;
use rustix::pty::OpenptFlags;
use rustix::termios::{SpecialCodeIndex, Winsize};
use tokio::io::unix::AsyncFd;

use crate::executor::supervisor_protocol::PtySize;

/// The end-of-file character a terminal uses when its settings cannot be read (`^D`).
const DEFAULT_EOF: u8 = 0x04;

/// The master side of a command's terminal.
pub struct Terminal {
    master: AsyncFd<OwnedFd>,
}

/// The terminal side, to become the shell's stdin, stdout and stderr.
pub struct TerminalSide(OwnedFd);

impl TerminalSide {
    /// Three handles on the terminal side: stdin, stdout, stderr.
    pub fn stdio(self) -> io::Result<[Stdio; 3]> {
        let out = self.0.try_clone()?;
        let err = self.0.try_clone()?;
        Ok([Stdio::from(self.0), Stdio::from(out), Stdio::from(err)])
    }
}

fn winsize(size: PtySize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a PTY pair of `size`; the master is non-blocking and registered with the runtime.
pub fn open(size: PtySize) -> io::Result<(Terminal, TerminalSide)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // The peer by descriptor (no path to race on); by name where the kernel lacks it.
    let side = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(side) => side,
        Err(_) => {
            let name = rustix::pty::ptsname(&master, Vec::new())?;
            rustix::fs::open(
                name.as_c_str(),
                OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
                Mode::empty(),
            )?
        }
    };
    rustix::termios::tcsetwinsize(&master, winsize(size))?;
    rustix::io::ioctl_fionbio(&master, true)?;
    // SAFETY: `master` is an `OwnedFd`: open, owned by the `AsyncFd` from here on, and its
    // `as_raw_fd` is the same number for its whole life.
    let master = unsafe { AsyncFd::register(master) }.map_err(io::Error::from)?;
    Ok((Terminal { master }, TerminalSide(side)))
}

/// Makes the command a session leader whose controlling terminal is its stdin, when it starts.
pub fn become_session_leader_on_start(command: &mut tokio::process::Command) {
    // SAFETY: the hook runs in the forked child before `execve`. It allocates nothing, takes no
    // lock and touches no Rust state: it makes two system calls through rustix (`setsid`, and
    // `ioctl(0, TIOCSCTTY)` on the stdin the spawn has just placed at descriptor 0) and turns
    // their error numbers into `io::Error` values, which do not allocate.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            let stdin = BorrowedFd::borrow_raw(0);
            rustix::process::ioctl_tiocsctty(stdin)?;
            Ok(())
        });
    }
}

impl Terminal {
    /// Reads output; `Ok(0)` once no process holds the terminal side any more.
    pub async fn read(&self, buffer: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready.try_io(|master| Ok(rustix::io::read(master.get_ref(), &mut *buffer)?)) {
                Ok(Ok(n)) => return Ok(n),
                // The last holder of the terminal side closed it: the end of the output.
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(0);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` as typed input.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut ready = self.master.writable().await?;
            match ready.try_io(|master| Ok(rustix::io::write(master.get_ref(), data)?)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the window size; the kernel sends `SIGWINCH` to the terminal's foreground group.
    pub fn resize(&self, size: PtySize) -> io::Result<()> {
        Ok(rustix::termios::tcsetwinsize(
            self.master.get_ref(),
            winsize(size),
        )?)
    }

    /// The terminal's end-of-file character as its settings say now (the command may have
    /// changed it), `^D` when they cannot be read.
    pub fn eof_character(&self) -> u8 {
        rustix::termios::tcgetattr(self.master.get_ref())
            .map(|t| t.special_codes[SpecialCodeIndex::VEOF])
            .unwrap_or(DEFAULT_EOF)
    }

    /// The terminal's foreground process group (a job an interactive shell runs), if any.
    pub fn foreground_group(&self) -> Option<Pid> {
        rustix::termios::tcgetpgrp(self.master.as_fd()).ok()
    }
}
