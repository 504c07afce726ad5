//! The relay: a per-call helper (`pods/exec` runs `/mecatl-executor` with its fixed argv) whose
//! first stdin line is [`RelayOpen`] connects to the supervisor's socket and copies bytes both
//! ways until either side ends (docs/commands.md §4). It holds no secret: requests and replies
//! are authenticated end to end between the provider and the supervisor.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

/// The word of [`RelayOpen::relay`].
pub const RELAY_WORD: &str = "supervisor/v1";

/// The first stdin line that turns the helper into a relay: `{"relay":"supervisor/v1"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayOpen {
    /// [`RELAY_WORD`].
    pub relay: String,
}

/// Whether this process is being traced (`TracerPid` of `/proc/self/status` is not 0).
pub fn traced() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("TracerPid:"))
        .is_none_or(|pid| pid.trim() != "0")
}

/// Connects to `address` (`@name` abstract, else a path).
pub fn connect(address: &str) -> std::io::Result<UnixStream> {
    match address.strip_prefix('@') {
        Some(name) => UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?),
        None => UnixStream::connect(address),
    }
}

/// Relays stdin to the supervisor and the supervisor to stdout. The caller made the process
/// non-dumpable before reading stdin; a tracer that attached before that is refused here.
pub fn run(address: &str) -> ExitCode {
    if traced() {
        eprintln!("execution-helper: traced; refusing to relay");
        return ExitCode::from(4);
    }
    let socket = match connect(address) {
        Ok(socket) => socket,
        Err(_) => {
            eprintln!("execution-helper: the supervisor is not reachable");
            return ExitCode::from(5);
        }
    };
    let Ok(mut upstream) = socket.try_clone() else {
        return ExitCode::from(1);
    };
    // stdin → supervisor, on its own thread; stdin's buffer (bytes read past the first line)
    // is drained first because the same process-wide handle is read.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if upstream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = upstream.shutdown(std::net::Shutdown::Write);
    });
    let mut downstream = socket;
    let mut stdout = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match downstream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stdout
                    .write_all(&buffer[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    ExitCode::SUCCESS
}
