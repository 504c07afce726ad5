//! Hand-driven races: a script of network and host actions applied at fixed simulated times
//! on top of a scenario's drawn faults (turmoil's hold/release and partition controls, crash
//! and restart), for the targeted cases of the store, security and reconciler catalogues.

use std::time::Duration;

use crate::driver::Driver;
use crate::world::replica_host;

/// One scripted action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hold every message between two hosts until released.
    Hold(String, String),
    /// Deliver the held messages between two hosts at once.
    Release(String, String),
    /// Drop every message between two hosts until repaired.
    Partition(String, String),
    /// Repair a partition.
    Repair(String, String),
    /// Crash replica `i` (its memory is lost).
    Crash(u32),
    /// Restart replica `i`.
    Restart(u32),
}

/// An action and when it happens (rounded up to the driver's 100 ms fault tick).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scripted {
    /// Simulated milliseconds after the start.
    pub at: Duration,
    /// What happens.
    pub action: Action,
}

impl Driver<'_> {
    /// Applies every scripted action that is due.
    pub(crate) fn scripted(&mut self, now: Duration, ms: u128) {
        while self.script.first().is_some_and(|s| s.at <= now) {
            let step = self.script.remove(0);
            self.trace
                .record_at(ms, "script", format!("{:?}", step.action));
            match step.action {
                Action::Hold(a, b) => self.sim.hold(a.as_str(), b.as_str()),
                Action::Release(a, b) => self.sim.release(a.as_str(), b.as_str()),
                Action::Partition(a, b) => self.sim.partition(a.as_str(), b.as_str()),
                Action::Repair(a, b) => self.sim.repair(a.as_str(), b.as_str()),
                Action::Crash(i) => self.sim.crash(replica_host(i)),
                Action::Restart(i) => self.sim.bounce(replica_host(i)),
            }
        }
    }
}
