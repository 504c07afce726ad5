//! The id/randomness seam: random identifiers from the OS in production, from a seed in tests
//! and the simulator.

use std::sync::Mutex;

use rand::{RngExt, SeedableRng, rngs::StdRng};

/// A source of random bytes and identifiers.
pub trait IdSource: Send + Sync + 'static {
    /// Fills `buf` with random bytes.
    fn fill(&self, buf: &mut [u8]);

    /// `bytes` random bytes as lowercase hex (`2 * bytes` characters).
    fn hex(&self, bytes: usize) -> String {
        let mut buf = vec![0u8; bytes];
        self.fill(&mut buf);
        hex::encode(buf)
    }
}

/// Randomness from the operating system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsIds;

impl IdSource for OsIds {
    #[allow(clippy::disallowed_methods)]
    fn fill(&self, buf: &mut [u8]) {
        rand::rng().fill(buf);
    }
}

/// Deterministic randomness from a seed.
#[derive(Debug)]
pub struct SeededIds {
    rng: Mutex<StdRng>,
}

impl SeededIds {
    /// A source that yields the same sequence for the same seed.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl IdSource for SeededIds {
    fn fill(&self, buf: &mut [u8]) {
        self.rng.lock().expect("id source lock poisoned").fill(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_ids_repeat_for_the_same_seed() {
        assert_eq!(SeededIds::new(7).hex(16), SeededIds::new(7).hex(16));
        assert_ne!(SeededIds::new(7).hex(16), SeededIds::new(8).hex(16));
    }

    #[test]
    fn os_ids_have_the_requested_length() {
        assert_eq!(OsIds.hex(16).len(), 32);
    }
}
