//! The RPC limiter (api-security §7): global and per-client bounds on active unary RPCs.
//!
//! A slot is taken only after authentication, keyed by the admitted client's canonical URI,
//! so the client map is bounded by the allowlist. When either bound is reached the call is
//! refused at once with RESOURCE_EXHAUSTED; nothing queues. The slot is released when the
//! [`Slot`] is dropped, at the end of the handler; a client's entry is removed when its count
//! drops to zero.
//!
//! The bounds are configured by [`LimiterBounds`]: the `serve`/`dev` flags
//! `--max-concurrent-rpcs` and `--max-concurrent-rpcs-per-client` win over the manifest's
//! `limits` object, which wins over the defaults (128 and 32, the per-client default capped at
//! the global bound). They must satisfy 1 <= per-client <= global <= 4096.

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

/// Configured bounds; an absent bound falls back to the next source, then the default.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::Args,
)]
#[serde(deny_unknown_fields)]
pub struct LimiterBounds {
    /// Bound on active RPCs of all clients (1..4096; default 128).
    #[serde(
        rename = "maxConcurrentRPCs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[arg(
        long = "max-concurrent-rpcs",
        env = "EXECUTION_PROVIDER_MAX_CONCURRENT_RPCS",
        value_parser = parse_bound
    )]
    pub global: Option<usize>,
    /// Bound on active RPCs of one client (1..global; default 32).
    #[serde(
        rename = "maxConcurrentRPCsPerClient",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[arg(
        long = "max-concurrent-rpcs-per-client",
        env = "EXECUTION_PROVIDER_MAX_CONCURRENT_RPCS_PER_CLIENT",
        value_parser = parse_bound
    )]
    pub per_client: Option<usize>,
}

fn parse_bound(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_GLOBAL).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{text}` must be a whole number in 1..={MAX_GLOBAL}"
        )),
    }
}

impl LimiterBounds {
    /// These bounds, each absent one taken from `fallback`.
    #[must_use]
    pub fn or(self, fallback: Self) -> Self {
        Self {
            global: self.global.or(fallback.global),
            per_client: self.per_client.or(fallback.per_client),
        }
    }

    /// The effective `(global, per_client)` bounds, defaults filled in, validated.
    pub fn resolve(self) -> Result<(usize, usize), LimiterError> {
        let global = self.global.unwrap_or(DEFAULT_GLOBAL);
        let per_client = self
            .per_client
            .unwrap_or_else(|| DEFAULT_PER_CLIENT.min(global));
        if global == 0 || per_client == 0 || per_client > global || global > MAX_GLOBAL {
            return Err(LimiterError { global, per_client });
        }
        Ok((global, per_client))
    }
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
        LimiterBounds {
            global: Some(global),
            per_client: Some(per_client),
        }
        .resolve()?;
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

    /// The `(global, per_client)` bounds.
    pub fn bounds(&self) -> (usize, usize) {
        (self.inner.global, self.inner.per_client)
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

    #[test]
    fn flags_win_over_the_manifest_which_wins_over_the_defaults() {
        let none = LimiterBounds::default();
        assert_eq!(none.resolve(), Ok((DEFAULT_GLOBAL, DEFAULT_PER_CLIENT)));
        let manifest = LimiterBounds {
            global: Some(64),
            per_client: Some(8),
        };
        let flags = LimiterBounds {
            global: None,
            per_client: Some(16),
        };
        assert_eq!(flags.or(manifest).resolve(), Ok((64, 16)));
        assert_eq!(none.or(manifest).resolve(), Ok((64, 8)));
        let small = LimiterBounds {
            global: Some(4),
            per_client: None,
        };
        assert_eq!(
            small.resolve(),
            Ok((4, 4)),
            "the per-client default is capped"
        );
        let inverted = LimiterBounds {
            global: Some(4),
            per_client: Some(5),
        };
        assert!(inverted.resolve().is_err());
        let largest = LimiterBounds {
            global: Some(MAX_GLOBAL),
            per_client: Some(MAX_GLOBAL),
        };
        assert_eq!(largest.resolve(), Ok((MAX_GLOBAL, MAX_GLOBAL)));
        let over = LimiterBounds {
            global: Some(MAX_GLOBAL + 1),
            per_client: Some(1),
        };
        assert!(over.resolve().is_err());
        assert_eq!(parse_bound("4096"), Ok(4096));
        for bad in ["0", "4097", "-1", "x"] {
            assert!(parse_bound(bad).is_err(), "{bad}");
        }
    }
}
