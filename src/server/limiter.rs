//! The RPC limiter (api-security §7): global and per-client bounds on active unary RPCs.
//!
//! A slot is taken only after authentication, keyed by the admitted client's canonical URI,
//! so the client map is bounded by the allowlist. When either bound is reached the call is
//! refused at once with RESOURCE_EXHAUSTED; nothing queues. The slot is released when the
//! [`Slot`] is dropped, at the end of the handler; a client's entry is removed when its count
//! drops to zero.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Default bound on active RPCs.
pub const DEFAULT_GLOBAL: usize = 128;
/// Default bound on active RPCs of one client.
pub const DEFAULT_PER_CLIENT: usize = 32;
/// The largest global bound accepted.
pub const MAX_GLOBAL: usize = 4096;

/// Why the bounds were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "limiter bounds must satisfy 1 <= per-client <= global <= 4096 (got {global}, {per_client})"
)]
pub struct LimiterError {
    /// The global bound asked for.
    pub global: usize,
    /// The per-client bound asked for.
    pub per_client: usize,
}

#[derive(Debug, Default)]
struct Counts {
    global: usize,
    per_client: BTreeMap<String, usize>,
    peak: usize,
}

#[derive(Debug)]
struct Inner {
    global: usize,
    per_client: usize,
    counts: Mutex<Counts>,
}

/// Bounds on active RPCs.
#[derive(Debug, Clone)]
pub struct RpcLimiter {
    inner: Arc<Inner>,
}

impl Default for RpcLimiter {
    fn default() -> Self {
        Self::new(DEFAULT_GLOBAL, DEFAULT_PER_CLIENT).expect("the defaults are valid")
    }
}

impl RpcLimiter {
    /// A limiter with `global` and `per_client` bounds.
    pub fn new(global: usize, per_client: usize) -> Result<Self, LimiterError> {
        if per_client == 0 || per_client > global || global > MAX_GLOBAL {
            return Err(LimiterError { global, per_client });
        }
        Ok(Self {
            inner: Arc::new(Inner {
                global,
                per_client,
                counts: Mutex::default(),
            }),
        })
    }

    /// A slot for `client`, or `None` when a bound is reached.
    pub fn try_acquire(&self, client: &str) -> Option<Slot> {
        let mut counts = self.inner.counts.lock().expect("limiter lock");
        let mine = counts.per_client.get(client).copied().unwrap_or(0);
        if counts.global >= self.inner.global || mine >= self.inner.per_client {
            return None;
        }
        counts.global += 1;
        counts.peak = counts.peak.max(counts.global);
        counts.per_client.insert(client.to_owned(), mine + 1);
        Some(Slot {
            inner: self.inner.clone(),
            client: client.to_owned(),
        })
    }

    /// Active RPCs now, and how many clients have any.
    pub fn active(&self) -> (usize, usize) {
        let counts = self.inner.counts.lock().expect("limiter lock");
        (counts.global, counts.per_client.len())
    }

    /// The most RPCs ever active at once.
    pub fn peak(&self) -> usize {
        self.inner.counts.lock().expect("limiter lock").peak
    }
}

/// One active RPC; dropping it releases the slot.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Inner>,
    client: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.inner.counts.lock().expect("limiter lock");
        counts.global = counts.global.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.per_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_client_and_global_bounds_hold_and_the_client_map_empties_after_release() {
        let limiter = RpcLimiter::new(3, 2).unwrap();
        let a1 = limiter.try_acquire("a").unwrap();
        let a2 = limiter.try_acquire("a").unwrap();
        assert!(limiter.try_acquire("a").is_none(), "per-client bound");
        let b1 = limiter.try_acquire("b").unwrap();
        assert!(limiter.try_acquire("c").is_none(), "global bound");
        assert_eq!(limiter.active(), (3, 2));
        drop(a1);
        let c1 = limiter.try_acquire("c").unwrap();
        drop((a2, b1, c1));
        assert_eq!(limiter.active(), (0, 0));
        assert_eq!(limiter.peak(), 3);
    }

    #[test]
    fn invalid_bounds_are_refused() {
        for (global, per_client) in [(0, 1), (1, 0), (1, 2), (MAX_GLOBAL + 1, 1)] {
            assert!(
                RpcLimiter::new(global, per_client).is_err(),
                "{global} {per_client}"
            );
        }
        assert!(RpcLimiter::new(1, 1).is_ok());
    }
}
