//! What every race shares: running a script over seeds (each run judged by every invariant,
//! the history and the liveness phase), and reading the trace a run left (its lines, client
//! call outcomes, `live` markers and snapshots).

use std::time::Duration;

use sim::script::{Action, Scripted};
use sim::{Config, Report, Scenario, replay_command, run_scripted};

pub const SEEDS: std::ops::RangeInclusive<u64> = 1..=3;

pub fn at(ms: u64, action: Action) -> Scripted {
    Scripted {
        at: Duration::from_millis(ms),
        action,
    }
}

pub fn hosts(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

pub fn passes(scenario: Scenario, script: &[Scripted]) -> Vec<Report> {
    passes_for(scenario, SEEDS, 8, script)
}

/// Runs `script` on each seed of `seeds` for `duration_secs` of workload; every run must pass
/// (invariants, history, liveness).
pub fn passes_for(
    scenario: Scenario,
    seeds: std::ops::RangeInclusive<u64>,
    duration_secs: u64,
    script: &[Scripted],
) -> Vec<Report> {
    seeds
        .map(|seed| {
            let config = Config {
                scenario,
                seed,
                replicas: 3,
                duration_secs,
            };
            let report = run_scripted(&config, script);
            assert!(
                report.passed(),
                "seed {seed} of {scenario} with {script:?} failed (replay the seed without the script: {})\n{:#?} {:?} {:?}",
                replay_command(&config),
                report.violations,
                report.liveness,
                report.host_error
            );
            report
        })
        .collect()
}

/// One trace line: simulated milliseconds, actor, event.
pub struct Line {
    pub ms: u64,
    pub actor: String,
    pub event: String,
}

pub fn lines(report: &Report) -> Vec<Line> {
    report
        .trace
        .lines()
        .iter()
        .filter_map(|line| {
            let (ms, rest) = line.trim_start().split_once(' ')?;
            let (actor, event) = rest.split_once(' ')?;
            Some(Line {
                ms: ms.parse().ok()?,
                actor: actor.to_owned(),
                event: event.trim_start().to_owned(),
            })
        })
        .collect()
}

/// A client call's outcome (`... -> OUTCOME`), with what was called.
pub fn call(line: &Line) -> Option<(&str, &str)> {
    if !line.actor.starts_with("client-") {
        return None;
    }
    line.event.rsplit_once(" -> ")
}

pub fn is_data_plane(what: &str) -> bool {
    what.starts_with("file ") || what.starts_with("command ") || what.starts_with("renew ")
}

/// The environment and operation id of the first `WHAT live ID on NAME` line and its time.
pub fn live(lines: &[Line], what: &str) -> (u64, String, String) {
    let prefix = format!("{what} live ");
    lines
        .iter()
        .find_map(|l| {
            let rest = l.event.strip_prefix(&prefix)?;
            let (id, name) = rest.split_once(" on ")?;
            Some((l.ms, id.to_owned(), name.to_owned()))
        })
        .unwrap_or_else(|| panic!("the script saw no live {what}"))
}

/// [`live`] for `WhenOperationLive`.
pub fn live_operation(lines: &[Line]) -> (u64, String, String) {
    live(lines, "operation")
}

/// The snapshot line of environment `name` taken at `ms`.
pub fn snapshot_of<'a>(lines: &'a [Line], ms: u64, name: &str) -> &'a str {
    let prefix = format!("snapshot {name} ");
    lines
        .iter()
        .find(|l| l.ms == ms && l.event.starts_with(&prefix))
        .map(|l| l.event.as_str())
        .unwrap_or_else(|| {
            let tail: Vec<String> = lines
                .iter()
                .rev()
                .take(12)
                .map(|l| format!("{} {} {}", l.ms, l.actor, l.event))
                .collect();
            panic!("no snapshot of {name} at {ms} ms; the trace ends (newest first): {tail:#?}")
        })
}

/// The epoch of a snapshot line.
pub fn epoch_of(snapshot: &str) -> Option<u64> {
    snapshot
        .split_whitespace()
        .find_map(|w| w.strip_prefix("epoch="))
        .and_then(|e| e.parse().ok())
}

/// Whether `after` shows the environment of `before` recovered automatically: unfenced with
/// no operation at a later epoch (the checker proves the fence was left only by a termination
/// proof of the exact executor).
pub fn recovered_since(before: &str, after: &str) -> bool {
    after.contains("fence=Healthy op=- ") && epoch_of(after) > epoch_of(before)
}

/// Every replica crashes at once, cut from the API server (so that nothing it had in flight
/// lands), and comes back a second later: the live operation's holder is gone for good.
pub fn orphan_the_live_operation() -> Vec<(u64, Action)> {
    let mut then = Vec::new();
    for i in 0..3 {
        let (a, b) = hosts(&format!("replica-{i}"), "apiserver");
        then.push((0, Action::Partition(a.clone(), b.clone())));
        then.push((0, Action::Crash(i)));
        then.push((900, Action::Repair(a, b)));
    }
    then
}

/// Replicas reload the security directory every 2 s; a change is in force everywhere this
/// long after it is written.
pub const RELOADED_MS: u64 = 2_600;

/// Client calls that completed in `[from, to)`: (ms, what, outcome).
pub fn calls_between(lines: &[Line], from: u64, to: u64) -> Vec<(u64, String, String)> {
    lines
        .iter()
        .filter(|l| l.ms >= from && l.ms < to)
        .filter_map(|l| call(l).map(|(what, outcome)| (l.ms, what.to_owned(), outcome.to_owned())))
        .collect()
}

/// The capacity ledger's ConfigMap, whose writes the outage race refuses.
pub const LEDGER: &str = "mecatl-execution-profile-allocations";

/// Whether the `snapshot ledger ...` lines at `ms` list environment `name`.
pub fn in_ledger(lines: &[Line], ms: u64, name: &str) -> bool {
    let quoted = format!("\"{name}\"");
    lines
        .iter()
        .filter(|l| l.ms == ms && l.event.starts_with("snapshot ledger "))
        .any(|l| l.event.contains(&quoted))
}
