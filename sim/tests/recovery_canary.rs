//! The liveness phase has teeth: built with the `recovery-canary` feature (the provider's
//! `sim-recovery-canary`, which treats every template revision as `recovery: manual`, so no
//! fenced environment is ever recovered automatically), some seed of the crash-restart
//! scenario must fail the liveness phase on an environment left fenced, within a fixed budget
//! of seeds. Run by `sim/canary.sh`: `cargo test -p sim --features recovery-canary --test
//! recovery_canary`.
#![cfg(feature = "recovery-canary")]

use sim::{Config, Scenario};

/// The simulator must catch the canary within this many seeds.
const SEED_BUDGET: u64 = 30;

#[test]
fn the_simulator_catches_a_disabled_automatic_recovery_within_the_seed_budget() {
    for seed in 1..=SEED_BUDGET {
        let config = Config {
            scenario: Scenario::CrashRestart,
            seed,
            replicas: 3,
            duration_secs: 5,
        };
        let report = sim::run(&config);
        if !report.passed() {
            let caught = report
                .liveness
                .as_deref()
                .is_some_and(|l| l.starts_with("LIVENESS:") && l.contains(" is fenced ("));
            assert!(
                caught && report.violations.is_empty() && report.host_error.is_none(),
                "seed {seed} failed, but not on a fenced environment left unrecovered: {:?} {:?} {:?}",
                report.violations,
                report.liveness,
                report.host_error
            );
            eprintln!(
                "recovery canary caught at seed {seed}: {}",
                report.liveness.unwrap_or_default()
            );
            return;
        }
    }
    panic!("the recovery canary survived {SEED_BUDGET} seeds: the liveness phase has no teeth");
}
