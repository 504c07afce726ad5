//! The fault model, drawn per seed: each seed picks its own probabilities, so a campaign covers
//! calm seeds, noisy seeds and everything between. [`FaultPlan`] is pure data; the world
//! applies it between simulation steps and the API-server layer and executor consult it.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::scenario::Scenario;

/// The probabilities and magnitudes one seed runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    /// Chance per second that a running replica crashes (it restarts later, memory lost).
    pub crash_per_sec: f64,
    /// How long a crashed replica stays down, in milliseconds.
    pub downtime_ms: u64,
    /// Chance per second that a new partition starts.
    pub partition_per_sec: f64,
    /// How long a partition lasts, in milliseconds.
    pub partition_ms: u64,
    /// Whether partitions may be one-way.
    pub one_way: bool,
    /// Maximum extra message latency in milliseconds.
    pub max_latency_ms: u64,
    /// Per-replica wall-clock skew bound in milliseconds (each replica draws its own).
    pub skew_ms: i64,
    /// Per-replica drift bound in parts per million.
    pub drift_ppm: i64,
    /// Chance per second of a clock step on a random replica.
    pub clock_step_per_sec: f64,
    /// Chance that an API-server write is refused before it commits (409, 429 or 500).
    pub api_error_rate: f64,
    /// Chance that an API-server write commits but its answer is lost (504).
    pub api_ambiguous_rate: f64,
    /// Chance per second that the API server compacts (watches restart with 410).
    pub compact_per_sec: f64,
    /// Chance that the executor crashes mid-command (effect done, answer lost).
    pub executor_crash_rate: f64,
    /// Chance per client step that a client reuses an old claim.
    pub stale_claim_rate: f64,
    /// Chance per client step of a deliberately invalid request.
    pub invalid_rate: f64,
    /// Chance per second of a security manifest rotation or rollback attempt.
    pub security_per_sec: f64,
    /// Chance per second that an executor node host crashes (its workspaces survive, calls in
    /// flight die; it restarts after `downtime_ms`). Applies only with node hosts.
    pub node_crash_per_sec: f64,
}

impl FaultPlan {
    /// Draws the plan for `seed` within the bounds of `scenario`.
    pub fn draw(seed: u64, scenario: Scenario) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
        let weights = scenario.weights();
        let mut p = |max: f64| {
            if max <= 0.0 {
                0.0
            } else {
                rng.random_range(0.0..max)
            }
        };
        let crash_per_sec = p(weights.crash);
        let partition_per_sec = p(weights.partition);
        let clock_step_per_sec = p(weights.clock);
        let api_error_rate = p(weights.api);
        let api_ambiguous_rate = p(weights.api / 4.0);
        let compact_per_sec = p(weights.api);
        let executor_crash_rate = p(weights.executor);
        let stale_claim_rate = p(weights.stale);
        let invalid_rate = p(0.2);
        let latency = p(weights.latency);
        let skew = p(weights.clock);
        let mut plan = Self {
            crash_per_sec,
            downtime_ms: 500 + (p(1.0) * 4_000.0) as u64,
            partition_per_sec,
            partition_ms: 300 + (p(1.0) * 3_000.0) as u64,
            one_way: p(1.0) < 0.5,
            max_latency_ms: 1 + (latency * 50.0) as u64,
            skew_ms: (skew * 2_000.0) as i64,
            drift_ppm: (skew * 500.0) as i64,
            clock_step_per_sec,
            api_error_rate,
            api_ambiguous_rate,
            compact_per_sec,
            executor_crash_rate,
            stale_claim_rate,
            invalid_rate,
            security_per_sec: 0.0,
            node_crash_per_sec: 0.0,
        };
        // Drawn last, so that adding them left every other draw of a seed as it was.
        plan.security_per_sec = p(weights.security);
        plan.node_crash_per_sec = p(weights.executor);
        plan
    }

    /// The plan with every fault switched off (the liveness phase).
    pub fn calm(&self) -> Self {
        Self {
            crash_per_sec: 0.0,
            partition_per_sec: 0.0,
            clock_step_per_sec: 0.0,
            api_error_rate: 0.0,
            api_ambiguous_rate: 0.0,
            compact_per_sec: 0.0,
            executor_crash_rate: 0.0,
            security_per_sec: 0.0,
            node_crash_per_sec: 0.0,
            ..self.clone()
        }
    }
}
