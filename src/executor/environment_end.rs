//! Ending every process of a local environment, with proof: what `dev`'s node agent waits for
//! before it reports an executor Pod's containers terminated (docs/dev.md).
//!
//! Two proofs, neither trusting the environment's own processes:
//! - **the holder's exit.** Every process of an environment descends from the one holder the
//!   provider started for it (the sandbox's host stage, or the plain holder of an unisolated
//!   supervisor: [`crate::sandbox::reaping`]). The provider kills the holder's children until
//!   the holder exits; an exit with a status (not by a signal) means it reaped everything.
//! - **the empty pids cgroup.** A holder joins `<name>-<pid>` in the provider's pids
//!   hierarchy when the machine has a writable one. Every such cgroup of the environment, also
//!   one an earlier provider's holder joined, is killed until the kernel lets it be removed
//!   (which it does only once no process is left in it).
//!
//! With no isolation, one-shot helper calls run as the provider's own children, outside the
//! holder: the end waits until none of the environment's is left.
//!
//! When neither applies (the holder was killed by a signal, or an earlier provider may have
//! started one and the machine has no pids hierarchy to find it in) the processes are not
//! proven gone, and the caller must not say they are.

use std::path::Path;
use std::time::Duration;

use tokio::process::Child;

use super::transport::BoxFuture;

/// How long ending one environment may take before it counts as unproven.
pub const END_DEADLINE: Duration = Duration::from_secs(10);
/// Pause between rounds of killing.
const END_POLL: Duration = Duration::from_millis(5);

/// Why the processes of an environment are not proven gone.
#[derive(Debug, thiserror::Error)]
pub enum ProcessesRemain {
    /// The holder did not exit with a status: something killed it before it could reap.
    #[error("the environment's holder ended by a signal, so what it held is unknown")]
    HolderKilled,
    /// Killing did not end them in time.
    #[error("the environment's processes did not end within {0:?}")]
    Timeout(Duration),
    /// An earlier provider may have started a holder that nothing here can find.
    #[error(
        "an earlier provider may have started this environment's supervisor, and no pids cgroup finds its processes"
    )]
    Unknown,
    /// Helper processes started outside the environment's holder (`dev
    /// --unsafe-no-isolation`'s one-shot calls) have not exited yet.
    #[error("{0} helper call(s) of the environment still run outside its holder")]
    HelpersRunning(usize),
    /// The environment name is not one.
    #[error("{0} is not an environment name")]
    BadName(String),
    /// Waiting for the holder failed.
    #[error("waiting for the environment's holder: {0}")]
    Wait(std::io::Error),
}

/// What ends every process of an environment and proves it (the node agent's view of the
/// executor's processes).
pub trait EnvironmentProcesses: Send + Sync {
    /// Ends every process of `environment`: `Ok` only once they are proven gone (nothing
    /// running is gone too).
    fn end<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<(), ProcessesRemain>>;
}

/// Kills the children of the holder `child` until it exits, for at most `deadline`: `Ok` when
/// it exited with a status (it reaped everything first).
pub async fn end_holder(child: &mut Child, deadline: Duration) -> Result<(), ProcessesRemain> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().map_err(ProcessesRemain::Wait)? {
            return match status.code() {
                Some(_) => Ok(()),
                None => Err(ProcessesRemain::HolderKilled),
            };
        }
        if let Some(pid) = child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            for held in crate::helper::reaper::children_of(pid) {
                let _ = rustix::process::kill_process(held, rustix::process::Signal::KILL);
            }
        }
        if tokio::time::Instant::now() >= until {
            return Err(ProcessesRemain::Timeout(deadline));
        }
        tokio::time::sleep(END_POLL).await;
    }
}

/// Ends every pids cgroup the holders named `name` joined, for at most `deadline`: how many
/// there were, or `None` when the machine has no pids hierarchy to look in.
pub async fn end_cgroups(name: &str, deadline: Duration) -> Result<Option<usize>, ProcessesRemain> {
    let Some(joined) = crate::sandbox::cgroup::joined_by(name) else {
        return Ok(None);
    };
    let until = tokio::time::Instant::now() + deadline;
    for dir in &joined {
        end_cgroup(dir, until, deadline).await?;
    }
    Ok(Some(joined.len()))
}

async fn end_cgroup(
    dir: &Path,
    until: tokio::time::Instant,
    deadline: Duration,
) -> Result<(), ProcessesRemain> {
    loop {
        if crate::sandbox::cgroup::kill_and_remove(dir) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= until {
            return Err(ProcessesRemain::Timeout(deadline));
        }
        tokio::time::sleep(END_POLL).await;
    }
}
