//! When a slot kept after an ambiguous create may be reclaimed: the create deadline every
//! create carries, the rule that voids a create landing after it, and the proof that no
//! create of a reservation can still land (docs/store.md, "The capacity ledger").
//!
//! Every create of an environment carries `spec.createDeadline` = the provider's clock + 30 s
//! (whole seconds, rounded up), and its reservation records that deadline first. An object
//! whose `metadata.creationTimestamp` (set by the API server) is later than its own deadline
//! *landed late*: it is void, never served, never provisioned, not counted, and the
//! reconciler deletes it. A slot whose recorded deadline `D` is older than the provider's
//! clock by more than the clock-skew bound (30 s) plus a second is reclaimed when a read of
//! the environment, made after that instant, finds no object, or a void one. The proof: the
//! read is a quorum read, so a create it did not see lands after it, when the API server's
//! clock (within 30 s of the provider's) is past `D + 1`; its whole-second creationTimestamp
//! is then later than `D`, so it is void, however long the request was delayed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::kube::crd::ExecutionEnvironment;

/// How long after it is sent a create may land and still count.
pub const CREATE_WINDOW: Duration = Duration::from_secs(30);

/// The largest difference between the provider's clock and the API server's the proof
/// assumes (NTP keeps real clusters within milliseconds).
pub const CLOCK_SKEW_BOUND: Duration = Duration::from_secs(30);

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        .unwrap_or(0)
}

/// The deadline (unix seconds, rounded up) of a create sent at `now`.
#[must_use]
pub fn create_deadline(now: SystemTime) -> u64 {
    unix_seconds(now + CREATE_WINDOW).max(1)
}

/// Whether a create with `deadline`, not seen by a quorum read made at `now`, can no longer
/// land as a live environment: `now` is past `deadline + CLOCK_SKEW_BOUND + 1 s`. A deadline
/// of 0 (a slot seen held by a created environment) is never provable this way.
#[must_use]
pub fn can_no_longer_land(deadline: u64, now: SystemTime) -> bool {
    if deadline == 0 {
        return false;
    }
    let after = deadline
        .saturating_add(CLOCK_SKEW_BOUND.as_secs())
        .saturating_add(2);
    now >= UNIX_EPOCH + Duration::from_secs(after)
}

/// Whether `o` landed after its own create deadline (void: it holds nothing and is removed).
/// Objects without a deadline (created before the field existed) never are.
#[must_use]
pub fn landed_late(o: &ExecutionEnvironment) -> bool {
    let (Some(deadline), Some(created)) = (
        o.spec.create_deadline.as_ref(),
        o.metadata.creation_timestamp.as_ref(),
    ) else {
        return false;
    };
    created.0.as_second() > deadline.0.as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proof_waits_for_the_deadline_the_skew_and_a_second() {
        let now = UNIX_EPOCH + Duration::from_millis(1_800_000_000_250);
        let deadline = create_deadline(now);
        assert_eq!(deadline, 1_800_000_031, "rounded up");
        let just_before = UNIX_EPOCH + Duration::from_secs(deadline + 31);
        assert!(!can_no_longer_land(deadline, just_before));
        let after = UNIX_EPOCH + Duration::from_secs(deadline + 32);
        assert!(can_no_longer_land(deadline, after));
        assert!(
            !can_no_longer_land(0, after),
            "a held slot is never reclaimed so"
        );
    }
}
