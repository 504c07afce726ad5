//! The run's trace: one line per client call (invoke, then ok / error code / unknown), per
//! injected fault and per checker verdict, stamped with simulated milliseconds. Two runs of
//! the same seed must produce the same bytes; the digest makes that cheap to compare.

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// A shared, append-only trace.
#[derive(Clone, Default)]
pub struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trace({} lines)", self.len())
    }
}

impl Trace {
    /// Appends `event` from `actor` at the current simulated time.
    pub fn record(&self, actor: &str, event: impl AsRef<str>) {
        let ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
        self.record_at(ms, actor, event);
    }

    /// Appends `event` from `actor` at `ms` simulated milliseconds.
    pub fn record_at(&self, ms: u128, actor: &str, event: impl AsRef<str>) {
        let line = format!("{ms:>9} {actor:<10} {}", event.as_ref());
        self.lines.lock().expect("trace lock poisoned").push(line);
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("trace lock poisoned").clone()
    }

    /// The number of lines.
    pub fn len(&self) -> usize {
        self.lines.lock().expect("trace lock poisoned").len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole trace as text.
    pub fn text(&self) -> String {
        let mut text = self.lines().join("\n");
        text.push('\n');
        text
    }

    /// SHA-256 of [`Trace::text`], hex.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.text().as_bytes()))
    }
}
