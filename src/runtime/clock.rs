//! The `Clock` seam: monotonic readings for deadlines and wall readings for timestamps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time. Monotonic readings come from tokio's clock (which paused tests and the
/// simulator control); wall readings come from the implementation.
pub trait Clock: Send + Sync + 'static {
    /// The wall-clock time, used for timestamps written to resources and certificates.
    fn wall(&self) -> SystemTime;

    /// The monotonic time, used for deadlines and timeouts.
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }

    /// Seconds and nanoseconds since the Unix epoch of [`Clock::wall`].
    fn unix(&self) -> Duration {
        self.wall().duration_since(UNIX_EPOCH).unwrap_or_default()
    }
}

/// The operating-system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)]
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A wall clock that starts at a fixed instant and advances with tokio's (possibly paused)
/// clock. Used by tests with paused time and by the simulator.
#[derive(Debug, Clone)]
pub struct OffsetClock {
    origin_wall: SystemTime,
    origin_mono: tokio::time::Instant,
}

impl OffsetClock {
    /// A clock whose wall reading is `origin` now and advances with tokio time.
    pub fn starting_at(origin: SystemTime) -> Self {
        Self {
            origin_wall: origin,
            origin_mono: tokio::time::Instant::now(),
        }
    }
}

impl Clock for OffsetClock {
    fn wall(&self) -> SystemTime {
        self.origin_wall + self.origin_mono.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn offset_clock_advances_with_tokio_time() {
        let origin = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = OffsetClock::starting_at(origin);
        assert_eq!(clock.wall(), origin);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.unix(), Duration::from_secs(1_000_005));
    }
}
