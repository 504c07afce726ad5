//! The simulated clock: wall time is the simulation's epoch plus turmoil's elapsed time, bent
//! per replica by a fixed skew, a drift and occasional steps drawn from the seed. Monotonic
//! readings stay tokio's (turmoil drives them).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use execution_provider::runtime::Clock;

/// The simulation's wall-clock origin (2026-01-01T00:00:00Z).
pub const SIM_EPOCH_SECS: u64 = 1_767_225_600;

/// The instant the simulation starts at.
pub fn sim_epoch() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(SIM_EPOCH_SECS)
}

/// A replica's wall clock: `epoch + elapsed * (1 + drift) + skew + steps`.
#[derive(Debug, Clone)]
pub struct SkewedClock {
    skew_ms: i64,
    drift_ppm: i64,
    steps_ms: Arc<AtomicI64>,
}

impl SkewedClock {
    /// A clock with no skew.
    pub fn exact() -> Self {
        Self::new(0, 0)
    }

    /// A clock off by `skew_ms` that drifts by `drift_ppm` parts per million.
    pub fn new(skew_ms: i64, drift_ppm: i64) -> Self {
        Self {
            skew_ms,
            drift_ppm,
            steps_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    /// A handle that steps this clock (and every clone) by a signed amount.
    pub fn stepper(&self) -> Arc<AtomicI64> {
        self.steps_ms.clone()
    }

    fn elapsed() -> Duration {
        turmoil::sim_elapsed().unwrap_or_default()
    }
}

impl Clock for SkewedClock {
    fn wall(&self) -> SystemTime {
        let elapsed = i64::try_from(Self::elapsed().as_millis()).unwrap_or(i64::MAX);
        let drift = elapsed.saturating_mul(self.drift_ppm) / 1_000_000;
        let offset = elapsed
            .saturating_add(drift)
            .saturating_add(self.skew_ms)
            .saturating_add(self.steps_ms.load(Ordering::Relaxed))
            .max(0);
        sim_epoch() + Duration::from_millis(offset.unsigned_abs())
    }
}
