//! Every scenario over a fixed set of 20 seeds must pass: no invariant violation, no failed
//! host, and convergence after healing. A failure prints the replay command. Each scenario is
//! its own test, so the test harness spreads them over the machine's cores (the budget:
//! sim/README.md). More seeds: the binary, e.g.
//! `cargo run -p sim --profile sim -- --scenario swarm --seeds 1000`.

use sim::{Config, Scenario, replay_command};

/// Seeds every scenario runs in `cargo test`.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=20;
/// Simulated seconds of workload per seed (the liveness phase comes on top).
const DURATION_SECS: u64 = 3;

fn passes(scenario: Scenario) {
    let mut failures = Vec::new();
    for seed in SEEDS {
        let config = Config {
            scenario,
            seed,
            replicas: 3,
            duration_secs: DURATION_SECS,
        };
        let report = sim::run(&config);
        assert!(
            report.operations_checked > 0,
            "seed {seed} of {scenario} checked nothing"
        );
        if !report.passed() {
            failures.push(format!(
                "seed {seed} of {scenario} failed; replay: {}\n  violations: {:#?}\n  liveness: {:?}\n  host error: {:?}",
                replay_command(&config),
                report.violations,
                report.liveness,
                report.host_error
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! scenario_tests {
    ($($name:ident => $scenario:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                passes($scenario);
            }
        )*
    };
}

scenario_tests!(
    smoke_seeds_keep_every_invariant_and_converge => Scenario::Smoke,
    failover_seeds_keep_every_invariant_and_converge => Scenario::Failover,
    stale_epoch_seeds_keep_every_invariant_and_converge => Scenario::StaleEpoch,
    revocation_race_seeds_keep_every_invariant_and_converge => Scenario::RevocationRace,
    partition_heal_seeds_keep_every_invariant_and_converge => Scenario::PartitionHeal,
    crash_restart_seeds_keep_every_invariant_and_converge => Scenario::CrashRestart,
    lifecycle_race_seeds_keep_every_invariant_and_converge => Scenario::LifecycleRace,
    capacity_race_seeds_keep_every_invariant_and_converge => Scenario::CapacityRace,
    swarm_seeds_keep_every_invariant_and_converge => Scenario::Swarm,
);
