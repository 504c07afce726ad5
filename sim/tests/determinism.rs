//! Determinism is a tested property: the same seed, replayed in a fresh process (as the replay
//! command does) or run again in the same process, gives a byte-identical trace, faults
//! included.

use std::path::Path;
use std::process::Command;

use sim::replay::{ChildRun, Divergence, compare};
use sim::{Config, Scenario};

/// The trace of one seed from a fresh `sim` process.
fn trace_from_a_fresh_process(scenario: &str, seed: u64) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(["--scenario", scenario, "--seed", &seed.to_string()])
        .args(["--duration", "8", "--trace"])
        .output()
        .expect("the sim binary runs");
    assert!(output.status.success(), "seed {seed} of {scenario} failed");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    // The last line reports wall-clock speed, which is not part of the trace.
    stdout
        .lines()
        .filter(|l| !l.starts_with("ok: "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_same_seed_replayed_in_a_fresh_process_gives_a_byte_identical_trace() {
    for (scenario, seed) in [
        ("failover", 3),
        ("stale-epoch", 4),
        ("revocation-race", 4),
        ("swarm", 145),
        // A replica restarts with several environments stored: it reconciles them all at once,
        // in the controller's hash-set order (fixed by `sim::entropy`).
        ("crash-restart", 1),
        // Calls time out during partitions: the clients reset their HTTP/2 streams.
        ("partition-heal", 3),
    ] {
        let first = trace_from_a_fresh_process(scenario, seed);
        let second = trace_from_a_fresh_process(scenario, seed);
        assert!(first.lines().count() > 50, "the run did something");
        assert_eq!(first, second, "seed {seed} of {scenario} diverged");
    }
}

/// The trace of one seed run in this process.
fn trace_in_this_process(scenario: Scenario, seed: u64) -> String {
    let report = sim::run(&Config {
        scenario,
        seed,
        replicas: 3,
        duration_secs: 8,
    });
    assert!(report.passed(), "seed {seed} of {scenario} failed");
    report.trace.text()
}

#[test]
fn the_same_seed_run_twice_in_one_process_gives_a_byte_identical_trace() {
    for (scenario, seed) in [(Scenario::CrashRestart, 1), (Scenario::Failover, 3)] {
        let first = trace_in_this_process(scenario, seed);
        let second = trace_in_this_process(scenario, seed);
        assert!(first.contains("restart replica"), "{first}");
        assert_eq!(first, second, "seed {seed} of {scenario} diverged");
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[test]
fn hash_maps_get_the_same_keys_on_every_thread_of_the_process() {
    assert!(sim::entropy::fixed_hash_keys());
}

#[test]
fn the_determinism_seeds_exercise_replica_crashes() {
    let trace = trace_from_a_fresh_process("failover", 3);
    assert!(trace.contains("crash replica"), "{trace}");
    assert!(trace.contains("restart replica"), "{trace}");
}

#[test]
fn the_determinism_seeds_exercise_security_rotation_and_rollback() {
    let trace = trace_from_a_fresh_process("revocation-race", 4);
    assert!(trace.contains("security rotate"), "{trace}");
    assert!(trace.contains("security rollback"), "{trace}");
    assert!(trace.contains("security restore"), "{trace}");
}

#[test]
fn the_determinism_seeds_exercise_executor_node_crashes_and_partitions() {
    if sim::world::EXECUTOR_NODES == 0 {
        eprintln!("the executor runs in process (world::EXECUTOR_NODES is 0): no node faults");
        return;
    }
    let trace = trace_from_a_fresh_process("swarm", 145);
    assert!(trace.contains("crash node-0"), "{trace}");
    assert!(trace.contains("restart node-0"), "{trace}");
    assert!(trace.contains("hold replica-1 node-0"), "{trace}");
    assert!(
        trace.contains("partition one-way replica-1 -> node-0"),
        "{trace}"
    );
}

#[test]
fn different_seeds_give_different_traces() {
    let trace = |seed| {
        sim::run(&Config {
            scenario: Scenario::Swarm,
            seed,
            replicas: 3,
            duration_secs: 4,
        })
        .trace
        .text()
    };
    assert_ne!(trace(3), trace(4));
}

/// One fresh `sim --trace` process of `seed`, as `sim --twice` runs it.
fn replay(scenario: Scenario, seed: u64) -> ChildRun {
    let config = Config {
        scenario,
        seed,
        replicas: 3,
        duration_secs: 6,
    };
    ChildRun::of(Path::new(env!("CARGO_BIN_EXE_sim")), &config).expect("the sim binary runs")
}

#[test]
fn the_twice_comparison_fails_on_a_deliberately_different_pair_of_replays() {
    let one = replay(Scenario::Smoke, 1);
    let again = replay(Scenario::Smoke, 1);
    let lines = compare(&one, &again).expect("the same seed replays identically");
    assert!(
        lines > 50,
        "every trace line is compared, not just a few: {lines}"
    );
    // Two real replays that differ: another seed of the same scenario.
    let other = replay(Scenario::Smoke, 2);
    assert!(
        matches!(compare(&one, &other), Err(Divergence::Output { .. })),
        "seeds 1 and 2 must not compare equal"
    );
    // The same output with another exit code.
    let failed = ChildRun {
        code: Some(1),
        ..one.clone()
    };
    assert!(matches!(
        compare(&one, &failed),
        Err(Divergence::ExitCode { .. })
    ));
    // One trace line changed, nothing else.
    let mut edited: Vec<String> = one.stdout.lines().map(str::to_owned).collect();
    edited[lines / 2].push('!');
    let edited = ChildRun {
        stdout: edited.join("\n"),
        ..one.clone()
    };
    assert_eq!(
        compare(&one, &edited).map_err(|d| match d {
            Divergence::Output { line, .. } => line,
            other => panic!("{other}"),
        }),
        Err(lines / 2)
    );
}

#[test]
fn sim_twice_compares_every_line_of_two_fresh_processes() {
    let output = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args([
            "--scenario",
            "smoke",
            "--seed",
            "3",
            "--duration",
            "6",
            "--twice",
        ])
        .output()
        .expect("the sim binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let lines: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("twice: seed 3 gave "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no twice verdict in {stdout}"));
    assert!(lines > 50, "{stdout}");
}
