//! The phase census of the reconciler's watch cache, for the `environments{phase}` gauge:
//! the phases of `DescribeEnvironment` ([`crate::store::describe::phase`]), every one listed.

use crate::kube::crd::ExecutionEnvironment;
use crate::store::describe::{Phase, phase};

/// How many of `envs` stand in each phase, in [`Phase::ALL`] order, zeros included.
pub fn count<'a>(envs: impl Iterator<Item = &'a ExecutionEnvironment>) -> Vec<(&'static str, i64)> {
    let mut counts = [0i64; Phase::ALL.len()];
    for env in envs {
        let at = Phase::ALL
            .iter()
            .position(|p| *p == phase(env))
            .expect("ALL lists every phase");
        counts[at] += 1;
    }
    Phase::ALL
        .iter()
        .zip(counts)
        .map(|(p, n)| (p.as_str(), n))
        .collect()
}
