//! `sim`: runs seeds of a scenario and reports. On failure the first line names the seed, the
//! scenario, the commit and the exact replay command; the exit code is 1.
#![forbid(unsafe_code)]

use std::time::Instant;

use clap::Parser;
use sim::{COMMIT, Config, Scenario, replay_command};

/// The deterministic simulator of execution-provider.
#[derive(Debug, Parser)]
struct Args {
    /// The scenario (smoke, failover, stale-epoch, revocation-race, partition-heal,
    /// crash-restart, lifecycle-race, capacity-race, swarm).
    #[arg(long, default_value = "smoke")]
    scenario: Scenario,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many consecutive seeds to run.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Provider replicas.
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// Simulated seconds of workload per seed.
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// Print the trace of every seed.
    #[arg(long)]
    trace: bool,
    /// Replay every seed in two fresh processes and fail if their traces differ.
    #[arg(long)]
    twice: bool,
}

/// Logs to standard error when `SIM_LOG` is set (an env-filter directive such as
/// `turmoil=trace,execution_provider=debug`), stamped with simulated time.
fn init_logging() {
    let Ok(filter) = std::env::var("SIM_LOG") else {
        return;
    };
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(
            &self,
            w: &mut tracing_subscriber::fmt::format::Writer<'_>,
        ) -> std::fmt::Result {
            let ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
            write!(w, "{ms:>9}ms")
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_timer(SimTime)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
}

fn main() {
    init_logging();
    let args = Args::parse();
    let mut sim_secs = 0.0;
    let mut operations = 0;
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let config = Config {
            scenario: args.scenario,
            seed,
            replicas: args.replicas,
            duration_secs: args.duration,
        };
        let report = sim::run(&config);
        if args.twice {
            check_replay(&config);
        }
        sim_secs += report.sim_secs;
        operations += report.operations_checked;
        if args.trace {
            print!("{}", report.trace.text());
        }
        if !report.passed() {
            println!(
                "FAILED seed={seed} scenario={} commit={COMMIT} replay: {}",
                args.scenario,
                replay_command(&config)
            );
            for v in &report.violations {
                println!("  violation: {v}");
            }
            if let Some(l) = &report.liveness {
                println!("  {l}");
            }
            if let Some(e) = &report.host_error {
                println!("  host error: {e}");
            }
            std::process::exit(1);
        }
    }
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "ok: {} seeds of {} ({} simulated s, {:.1} simulated s per wall s, {} operations checked)",
        args.seeds,
        args.scenario,
        sim_secs as u64,
        sim_secs / wall,
        operations
    );
}

/// Replays `config` in two fresh processes (as the replay command would) and exits with a
/// failure if their traces differ.
fn check_replay(config: &Config) {
    let trace = || -> String {
        let exe = std::env::current_exe().expect("the path of this program");
        let output = std::process::Command::new(exe)
            .args(["--scenario", config.scenario.name()])
            .args(["--seed", &config.seed.to_string()])
            .args(["--replicas", &config.replicas.to_string()])
            .args(["--duration", &config.duration_secs.to_string(), "--trace"])
            .output()
            .expect("this program runs again");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| !l.starts_with("ok: ") && !l.starts_with("FAILED") && !l.starts_with("  "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (first, second) = (trace(), trace());
    if first != second {
        println!(
            "FAILED seed={} scenario={} commit={COMMIT} replay: {} --twice",
            config.seed,
            config.scenario,
            replay_command(config)
        );
        println!("  the same seed gave two different traces:");
        print_difference(&first, &second);
        std::process::exit(1);
    }
}

fn print_difference(first: &str, second: &str) {
    let line = first
        .lines()
        .zip(second.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| first.lines().count().min(second.lines().count()));
    let context = |text: &str| -> Vec<String> {
        text.lines()
            .skip(line.saturating_sub(3))
            .take(6)
            .map(str::to_owned)
            .collect()
    };
    println!("  first run from line {}:", line.saturating_sub(3) + 1);
    for l in context(first) {
        println!("    {l}");
    }
    println!("  second run:");
    for l in context(second) {
        println!("    {l}");
    }
}
