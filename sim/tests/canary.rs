//! The simulator has teeth, one test per canary feature, each run by `sim/canary.sh` in a
//! build of its own:
//! * `canary` (the provider's `sim-canary`, which removes the run-claim check at dispatch
//!   admission): some seed of the stale-epoch scenario must fail within a fixed budget of
//!   seeds (`cargo test -p sim --features canary --test canary`);
//! * `supervisor-canary` (the provider's `sim-supervisor-canary`: the supervisor does not
//!   kill a claim's commands at the claim's deadline): the detached-command race
//!   (`races/commands.rs`) must fail on "no command outlives its claim" (§5.7) within a fixed
//!   budget of seeds (`cargo test -p sim --features supervisor-canary --test canary`).

#[cfg(feature = "canary")]
use sim::{Config, Scenario};

/// The simulator must catch the canary within this many seeds.
#[cfg(feature = "canary")]
const SEED_BUDGET: u64 = 50;

#[cfg(feature = "canary")]
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

#[cfg(feature = "supervisor-canary")]
#[path = "races/detached_script.rs"]
mod detached_script;

#[cfg(feature = "supervisor-canary")]
#[test]
fn the_simulator_catches_a_disabled_supervisor_deadline_kill_within_the_seed_budget() {
    use sim::{Config, Scenario};
    const SEED_BUDGET: u64 = 3;
    for seed in 1..=SEED_BUDGET {
        let config = Config {
            scenario: Scenario::Smoke,
            seed,
            replicas: 3,
            duration_secs: detached_script::WORKLOAD_SECS,
        };
        let report = sim::run_scripted(&config, &detached_script::steps(config.replicas));
        if !report.passed() {
            let caught = report
                .violations
                .iter()
                .any(|v| v.starts_with("§5.7") && v.contains("outlived its claim"));
            assert!(
                caught,
                "seed {seed} failed, but not on the disabled deadline kill: {:?} {:?} {:?}",
                report.violations, report.liveness, report.host_error
            );
            eprintln!(
                "supervisor canary caught at seed {seed}: {}",
                report.violations[0]
            );
            return;
        }
    }
    panic!("the supervisor canary survived {SEED_BUDGET} seeds: the checker has no teeth");
}
