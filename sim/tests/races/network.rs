//! Races on the network: API traffic held and released at once, answers held past the
//! client's deadline, a crash during dispatch with a peer cut from the API server.

use sim::Scenario;
use sim::script::Action;

use crate::support::*;

/// Stale observations (LifecycleStatusWritersRejectStaleObservations,
/// StaleReplacementObservationCannotOverwriteCompletion, ExpiredOperationFenceRevalidates…):
/// one replica's link to the API server is held for 8 s while the others carry on with
/// lifecycle operations, then everything it sent arrives at once.
#[test]
fn a_replica_whose_api_traffic_is_held_then_released_at_once_writes_nothing_stale() {
    let (a, b) = hosts("replica-0", "apiserver");
    let script = [
        at(1_000, Action::Hold(a.clone(), b.clone())),
        at(9_000, Action::Release(a, b)),
    ];
    for report in passes(Scenario::LifecycleRace, &script) {
        let trace = report.trace.text();
        assert!(trace.contains("script     Hold"), "{trace}");
        assert!(trace.contains("script     Release"), "{trace}");
    }
}

/// Answers held past the client's deadline (CancelledOperationStaysActiveUntilBackendStops…):
/// every replica's link to one client is held for 7 s (beyond the client's 5 s deadline), so
/// the client gives up on calls the replicas complete; nothing runs twice and every ensure or
/// dispatch the client was told about holds.
#[test]
fn answers_held_past_the_client_deadline_never_make_an_operation_run_twice() {
    let mut script = Vec::new();
    for replica in ["replica-0", "replica-1", "replica-2"] {
        let (a, b) = hosts(replica, "client-0");
        script.push(at(1_500, Action::Hold(a.clone(), b.clone())));
        script.push(at(8_500, Action::Release(a, b)));
    }
    passes(Scenario::Smoke, &script);
}

/// A replica crashes while its dispatches are in flight and the API server is cut from a
/// second one (operation lease and fencing between replicas, §8.4): the survivors and the
/// restarted replica keep every invariant and converge.
#[test]
fn a_replica_crash_during_dispatch_with_a_peer_cut_from_the_api_server_converges() {
    let (a, b) = hosts("replica-1", "apiserver");
    let script = [
        at(1_200, Action::Crash(0)),
        at(1_500, Action::Partition(a.clone(), b.clone())),
        at(4_000, Action::Restart(0)),
        at(5_000, Action::Repair(a, b)),
    ];
    passes(Scenario::Smoke, &script);
}
