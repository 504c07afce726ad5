//! `sim`: runs seeds of a scenario and reports. On failure the first line names the seed, the
//! scenario, the commit and the exact replay command; the exit code is 1.
#![forbid(unsafe_code)]

use std::time::Instant;

use clap::Parser;
use sim::replay::ChildRun;
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
    /// Replay every seed in two fresh processes and fail if their traces or exit codes differ.
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
    // The slowest recovery of the campaign: (time after the heal, seed, environment).
    let mut slowest: Option<(std::time::Duration, u64, String)> = None;
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
        for r in &report.recoveries {
            if slowest.as_ref().is_none_or(|(t, _, _)| r.after_heal > *t) {
                slowest = Some((r.after_heal, seed, r.name.clone()));
            }
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
            println!("  {}", report.recovery);
            std::process::exit(1);
        }
        println!("seed {seed}: {}", report.recovery);
    }
    let slowest = slowest.map_or_else(
        || "nothing to recover".to_owned(),
        |(t, seed, name)| {
            format!(
                "slowest recovery {:.1} s after the heal (seed {seed}, {name})",
                t.as_secs_f64()
            )
        },
    );
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "ok: {} seeds of {} ({} simulated s, {:.1} simulated s per wall s, {} operations checked, {slowest})",
        args.seeds,
        args.scenario,
        sim_secs as u64,
        sim_secs / wall,
        operations
    );
}

/// Replays `config` in two fresh processes (as the replay command would) and exits with a
/// failure if their outputs (every trace line and the closing line) or exit codes differ.
fn check_replay(config: &Config) {
    let exe = std::env::current_exe().expect("the path of this program");
    let replay = || ChildRun::of(&exe, config).expect("this program runs again");
    let (first, second) = (replay(), replay());
    match sim::replay::compare(&first, &second) {
        Ok(lines) => println!(
            "twice: seed {} gave {lines} identical lines and exit code {} in two fresh processes",
            config.seed,
            first.code.unwrap_or_default()
        ),
        Err(divergence) => {
            println!(
                "FAILED seed={} scenario={} commit={COMMIT} replay: {} --twice",
                config.seed,
                config.scenario,
                replay_command(config)
            );
            println!("  {}", divergence.to_string().trim_end());
            std::process::exit(1);
        }
    }
}
