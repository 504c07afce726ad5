//! Condition writes: replace by type (first match kept, duplicates dropped), append when
//! absent, keep `lastTransitionTime` unless the status value flips.

use crate::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironmentStatus, RfcTime,
};

/// Sets condition `type_` on `status`.
pub fn set_condition(
    status: &mut ExecutionEnvironmentStatus,
    type_: &str,
    value: ConditionStatus,
    reason: &str,
    message: &str,
    generation: i64,
    now: RfcTime,
) {
    let previous = status.conditions.iter().find(|c| c.type_ == type_).cloned();
    let last_transition_time = match &previous {
        Some(p) if p.status == value => p.last_transition_time,
        _ => now.whole_seconds(),
    };
    let updated = EnvironmentCondition {
        type_: type_.to_owned(),
        status: value,
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    };
    let mut seen = false;
    status.conditions.retain_mut(|c| {
        if c.type_ != type_ {
            return true;
        }
        if seen {
            return false;
        }
        seen = true;
        *c = updated.clone();
        true
    });
    if !seen {
        status.conditions.push(updated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> RfcTime {
        RfcTime::from_system_time(UNIX_EPOCH + Duration::from_millis(secs * 1000 + 250))
    }

    #[test]
    fn transition_time_moves_only_when_the_value_flips() {
        let mut status = ExecutionEnvironmentStatus::default();
        set_condition(
            &mut status,
            "Ready",
            ConditionStatus::False,
            "Reconciled",
            "waiting",
            1,
            at(10),
        );
        set_condition(
            &mut status,
            "Ready",
            ConditionStatus::False,
            "PVCUnavailable",
            "x",
            1,
            at(20),
        );
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(
            status.conditions[0].last_transition_time,
            at(10).whole_seconds()
        );
        assert_eq!(status.conditions[0].reason, "PVCUnavailable");
        set_condition(
            &mut status,
            "Ready",
            ConditionStatus::True,
            "Reconciled",
            "ok",
            2,
            at(30),
        );
        assert_eq!(
            status.conditions[0].last_transition_time,
            at(30).whole_seconds()
        );
    }

    #[test]
    fn duplicates_of_a_type_are_dropped() {
        let mut status = ExecutionEnvironmentStatus::default();
        set_condition(
            &mut status,
            "Ready",
            ConditionStatus::False,
            "A",
            "",
            1,
            at(1),
        );
        status.conditions.push(status.conditions[0].clone());
        set_condition(
            &mut status,
            "Retired",
            ConditionStatus::True,
            "B",
            "",
            1,
            at(1),
        );
        set_condition(
            &mut status,
            "Ready",
            ConditionStatus::True,
            "C",
            "",
            1,
            at(2),
        );
        let types: Vec<_> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Retired"]);
    }
}
