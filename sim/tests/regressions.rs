//! Every seed in `sim/regressions/seeds.txt` (seeds that once failed) is replayed and must
//! pass now; the file's format is checked so a malformed entry cannot be silently skipped.

use sim::{Config, Scenario, replay_command};

fn entries() -> Vec<Config> {
    let text = include_str!("../regressions/seeds.txt");
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 4, "malformed regression entry: {line}");
            let number = |i: usize| -> u64 {
                fields[i]
                    .parse()
                    .unwrap_or_else(|_| panic!("not a number in: {line}"))
            };
            Config {
                scenario: fields[0].parse::<Scenario>().expect("a known scenario"),
                seed: number(1),
                replicas: u32::try_from(number(2)).expect("a replica count"),
                duration_secs: number(3),
            }
        })
        .collect()
}

#[test]
fn every_seed_that_once_failed_passes_now() {
    for config in entries() {
        let report = sim::run(&config);
        assert!(
            report.passed(),
            "regression seed failed again; replay: {}\n{:#?} {:?} {:?}",
            replay_command(&config),
            report.violations,
            report.liveness,
            report.host_error
        );
    }
}
