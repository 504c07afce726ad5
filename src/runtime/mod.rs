//! The runtime seams: the only module that touches the OS clock, OS randomness and sockets.
//!
//! Production code receives a [`Runtime`] value built in `main` (or by the simulator) and reads
//! time, randomness and the network only through it. `clippy.toml` forbids the OS calls
//! everywhere else.

pub mod clock;
pub mod ids;
pub mod net;
pub mod tls;

use std::sync::Arc;

pub use clock::{Clock, SystemClock};
pub use ids::{IdSource, OsIds, SeededIds};

/// The injected dependencies every production component is built from.
#[derive(Clone)]
pub struct Runtime {
    /// Monotonic and wall-clock readings.
    pub clock: Arc<dyn Clock>,
    /// Random identifiers and bytes.
    pub ids: Arc<dyn IdSource>,
}

impl Runtime {
    /// The production runtime: tokio time, the OS wall clock and OS randomness.
    pub fn system() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            ids: Arc::new(OsIds),
        }
    }
}
