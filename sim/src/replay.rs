//! The determinism check behind `sim --twice`: one seed, replayed in two fresh processes of
//! the `sim` binary (exactly as its replay command runs it), must print the same output, line
//! for line, and end with the same exit code. Only the wall-clock speed in the closing line is
//! left out of the comparison; every trace line, every verdict and the closing line's counts
//! are compared.

use std::path::Path;
use std::process::Command;

use crate::Config;

/// What one fresh `sim --trace` process of a seed printed, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRun {
    /// The exit code (`None`: ended by a signal).
    pub code: Option<i32>,
    /// Everything it printed on standard output.
    pub stdout: String,
}

impl ChildRun {
    /// Runs `sim` (the binary at `exe`) on exactly `config`, with its trace.
    pub fn of(exe: &Path, config: &Config) -> std::io::Result<Self> {
        let output = Command::new(exe)
            .args(["--scenario", config.scenario.name()])
            .args(["--seed", &config.seed.to_string()])
            .args(["--replicas", &config.replicas.to_string()])
            .args(["--duration", &config.duration_secs.to_string(), "--trace"])
            .output()?;
        Ok(Self {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        })
    }

    /// The lines that must be identical in every replay: all of them, with the wall-clock
    /// speed taken out of the closing `ok:` line.
    pub fn comparable_lines(&self) -> Vec<String> {
        self.stdout.lines().map(without_wall_clock).collect()
    }

    /// Whether the run printed its closing line (`ok: ...` or `FAILED seed=...`).
    fn finished(&self) -> bool {
        self.stdout
            .lines()
            .any(|l| l.starts_with("ok: ") || l.starts_with("FAILED seed="))
    }
}

/// The closing line reports simulated seconds per wall second, the one thing that depends on
/// the machine; it is dropped from that line, everything else on it is kept.
fn without_wall_clock(line: &str) -> String {
    if !line.starts_with("ok: ") {
        return line.to_owned();
    }
    line.split(", ")
        .filter(|part| !part.ends_with("simulated s per wall s"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How two replays of one seed differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Divergence {
    /// A replay ended without its closing line, or by a signal: nothing can be compared.
    Unfinished {
        /// Which replay (1 or 2).
        replay: u8,
        /// Its exit code.
        code: Option<i32>,
    },
    /// The exit codes differ.
    ExitCode {
        /// The first replay's.
        first: Option<i32>,
        /// The second replay's.
        second: Option<i32>,
    },
    /// The output differs from this line (0-based) on.
    Output {
        /// The first differing line.
        line: usize,
        /// A few lines of the first replay from just before it.
        first: Vec<String>,
        /// The same lines of the second replay.
        second: Vec<String>,
    },
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unfinished { replay, code } => write!(
                f,
                "replay {replay} ended (exit code {code:?}) without its closing line"
            ),
            Self::ExitCode { first, second } => write!(
                f,
                "the two replays ended with different exit codes: {first:?} and {second:?}"
            ),
            Self::Output {
                line,
                first,
                second,
            } => {
                let from = line.saturating_sub(CONTEXT_BEFORE) + 1;
                writeln!(
                    f,
                    "the same seed gave two different traces, first at line {}:",
                    line + 1
                )?;
                writeln!(f, "  first run from line {from}:")?;
                for l in first {
                    writeln!(f, "    {l}")?;
                }
                writeln!(f, "  second run:")?;
                for l in second {
                    writeln!(f, "    {l}")?;
                }
                Ok(())
            }
        }
    }
}

const CONTEXT_BEFORE: usize = 3;
const CONTEXT_LINES: usize = 6;

/// Compares two replays of one seed; on success returns how many lines were identical.
pub fn compare(first: &ChildRun, second: &ChildRun) -> Result<usize, Divergence> {
    for (replay, run) in [(1, first), (2, second)] {
        if run.code.is_none() || !run.finished() {
            return Err(Divergence::Unfinished {
                replay,
                code: run.code,
            });
        }
    }
    if first.code != second.code {
        return Err(Divergence::ExitCode {
            first: first.code,
            second: second.code,
        });
    }
    let (a, b) = (first.comparable_lines(), second.comparable_lines());
    if a == b {
        return Ok(a.len());
    }
    let line = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.len().min(b.len()));
    let context = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .skip(line.saturating_sub(CONTEXT_BEFORE))
            .take(CONTEXT_LINES)
            .cloned()
            .collect()
    };
    Err(Divergence::Output {
        line,
        first: context(&a),
        second: context(&b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: i32, stdout: &str) -> ChildRun {
        ChildRun {
            code: Some(code),
            stdout: stdout.to_owned(),
        }
    }

    const CLOSING: &str =
        "ok: 1 seeds of smoke (8 simulated s, 35.2 simulated s per wall s, 40 operations checked)";

    #[test]
    fn only_the_wall_clock_speed_is_left_out() {
        let a = run(0, &format!("      1 client-0   ensure b\n{CLOSING}\n"));
        let faster = CLOSING.replace("35.2", "71.9");
        let b = run(0, &format!("      1 client-0   ensure b\n{faster}\n"));
        assert_eq!(compare(&a, &b), Ok(2));
        let more = CLOSING.replace("40 operations", "41 operations");
        let c = run(0, &format!("      1 client-0   ensure b\n{more}\n"));
        assert!(matches!(
            compare(&a, &c),
            Err(Divergence::Output { line: 1, .. })
        ));
    }

    #[test]
    fn a_different_trace_line_is_a_divergence() {
        let a = run(
            0,
            &format!("      1 client-0   ensure b -> ok\n{CLOSING}\n"),
        );
        let b = run(
            0,
            &format!("      1 client-0   ensure b -> Unavailable\n{CLOSING}\n"),
        );
        assert!(matches!(
            compare(&a, &b),
            Err(Divergence::Output { line: 0, .. })
        ));
    }

    #[test]
    fn a_different_exit_code_is_a_divergence() {
        let failed = "FAILED seed=1 scenario=smoke commit=x replay: ...\n";
        let a = run(1, failed);
        let b = run(0, failed);
        assert_eq!(
            compare(&a, &b),
            Err(Divergence::ExitCode {
                first: Some(1),
                second: Some(0)
            })
        );
    }

    #[test]
    fn a_replay_without_its_closing_line_proves_nothing() {
        let a = run(101, "");
        assert!(matches!(
            compare(&a, &a),
            Err(Divergence::Unfinished { replay: 1, .. })
        ));
        let killed = ChildRun {
            code: None,
            stdout: CLOSING.to_owned(),
        };
        assert!(matches!(
            compare(&run(0, CLOSING), &killed),
            Err(Divergence::Unfinished { replay: 2, .. })
        ));
    }
}
