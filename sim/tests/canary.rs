//! The simulator has teeth: built with the `canary` feature (the provider's `sim-canary`,
//! which removes the run-claim check at dispatch admission), some seed of the stale-epoch
//! scenario must fail within a fixed budget of seeds. Run by `sim/canary.sh`:
//! `cargo test -p sim --features canary --test canary`.
#![cfg(feature = "canary")]

use sim::{Config, Scenario};

/// The simulator must catch the canary within this many seeds.
const SEED_BUDGET: u64 = 50;

#[test]
fn the_simulator_catches_a_disabled_fencing_check_within_the_seed_budget() {
    for seed in 1..=SEED_BUDGET {
        let config = Config {
            scenario: Scenario::StaleEpoch,
            seed,
            replicas: 3,
            duration_secs: 10,
        };
        let report = sim::run(&config);
        if !report.passed() {
            let caught = report.violations.iter().any(|v| v.starts_with("§10.13"));
            assert!(
                caught,
                "seed {seed} failed, but not on the disabled check: {:?} {:?} {:?}",
                report.violations, report.liveness, report.host_error
            );
            eprintln!("canary caught at seed {seed}: {}", report.violations[0]);
            return;
        }
    }
    panic!("the canary survived {SEED_BUDGET} seeds: the simulator has no teeth");
}
