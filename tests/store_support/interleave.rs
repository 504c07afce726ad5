//! Deterministic interleavings of concurrent store callers at API-call granularity: while a
//! [`Gate`] is open for `n` callers, every Kubernetes API request a tagged caller sends waits
//! until every caller is parked (waiting at the gate, or finished); then a choice drawn from
//! the seed releases exactly one of the waiting requests. The same seed gives the same order
//! of requests, so a failing interleaving replays from its seed alone. A gate that is not open
//! lets every request through at once.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The interleaving state of one run of concurrent callers.
#[derive(Debug, Default)]
struct Round {
    /// Callers neither parked at the gate nor finished.
    running: usize,
    /// Finished callers (their later requests, if any, pass at once).
    done: Vec<bool>,
    /// Parked requests: the caller and its release.
    waiting: Vec<(usize, oneshot::Sender<()>)>,
    /// splitmix64 state.
    rng: u64,
    /// The callers in the order their requests were released.
    order: Vec<usize>,
}

impl Round {
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Releases one parked request, chosen by the seed, once every caller is parked.
    fn release_when_parked(&mut self) {
        if self.running > 0 || self.waiting.is_empty() {
            return;
        }
        let index = (self.next() % self.waiting.len() as u64) as usize;
        let (caller, release) = self.waiting.remove(index);
        self.order.push(caller);
        self.running += 1;
        // A caller that went away no longer waits: nothing to release.
        let _ = release.send(());
    }
}

/// The gate every tagged caller's requests pass.
#[derive(Debug, Default)]
pub struct Gate {
    round: Mutex<Option<Round>>,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::default()
    }

    /// Opens a round of `callers` concurrent callers (tags `0..callers`) under `seed`.
    pub fn open(&self, callers: usize, seed: u64) {
        *self.round.lock().expect("gate") = Some(Round {
            running: callers,
            done: vec![false; callers],
            rng: seed,
            ..Round::default()
        });
    }

    /// Closes the round; answers the callers in the order their requests were released.
    pub fn close(&self) -> Vec<usize> {
        self.round
            .lock()
            .expect("gate")
            .take()
            .map(|r| r.order)
            .unwrap_or_default()
    }

    /// A request of `caller` arrives: `None` to go on at once, or the release to wait for.
    pub fn arrive(&self, caller: usize) -> Option<oneshot::Receiver<()>> {
        let mut round = self.round.lock().expect("gate");
        let round = round.as_mut()?;
        if round.done.get(caller).is_none_or(|done| *done) {
            return None;
        }
        let (release, wait) = oneshot::channel();
        round.running -= 1;
        round.waiting.push((caller, release));
        round.release_when_parked();
        Some(wait)
    }

    /// `caller` has finished its operation.
    pub fn finished(&self, caller: usize) {
        let mut round = self.round.lock().expect("gate");
        let Some(round) = round.as_mut() else {
            return;
        };
        if round.done.get(caller).is_none_or(|done| *done) {
            return;
        }
        round.done[caller] = true;
        round.running -= 1;
        round.release_when_parked();
    }
}
