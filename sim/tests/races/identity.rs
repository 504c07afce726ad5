//! Races on the creator of an environment (CASRetryRechecksSubject, spec/store.md §12;
//! api-security §9.29): the creator changes between two compare-and-swap attempts of a
//! replica, over the wire. No provider code changes a creator (the environment name is
//! derived from the client, the owner and the binding, so two creators never share one), so
//! the change is a foreign write (`sim::peer`, an operator editing the resource) served just
//! before the replica's first status write.

use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::store::naming::{allocation_name, owner_hash};
use sim::Scenario;
use sim::peer::{CreatorChange, NewCreator};
use sim::script::Action;
use sim::workload::scripted::{Call, Request, run_id};

use crate::support::*;

const HOST: &str = "subject";
const OWNER: &str = "carol";
const ENSURE_MS: u64 = 1_500;
/// Late enough for both environments to be Ready.
const ACQUIRE_MS: u64 = ENSURE_MS + 5_000;
const SNAPSHOT_MS: u64 = ACQUIRE_MS + 2_000;

fn call(replica: u32, binding: &str, request: Request) -> Action {
    Action::Call(Call {
        host: HOST.to_owned(),
        platform: 0,
        replica,
        owner: OWNER.to_owned(),
        binding: binding.to_owned(),
        request,
    })
}

/// The first platform's client ensures two bindings for `carol`, then acquires a run on each
/// through another replica; just before the API server serves each acquire's status write, a
/// peer makes the environment another creator's (the second platform's client for one, the
/// owner `mallory` for the other). The write loses (409); the retry reads the new creator
/// and the acquire is refused NOT_FOUND, exactly like an acquire naming an absent
/// environment (§10.5); nothing is written: no claim (the epoch stays 1), and the history
/// check finds the refused operation id in no stored status (§10.6).
#[test]
fn a_creator_changed_between_two_attempts_of_an_acquire_is_not_found_and_writes_nothing() {
    let changes = [
        ("client-changes", NewCreator::Client),
        ("owner-changes", NewCreator::Owner),
    ];
    let mut script = Vec::new();
    for (binding, creator) in changes {
        script.push(at(
            ENSURE_MS,
            call(0, binding, Request::Ensure("default".to_owned())),
        ));
        script.push(at(
            ACQUIRE_MS - 500,
            Action::CreatorChange(CreatorChange {
                marker: run_id(HOST, binding),
                creator,
            }),
        ));
        script.push(at(ACQUIRE_MS, call(1, binding, Request::Acquire)));
    }
    script.push(at(SNAPSHOT_MS, Action::Snapshot));
    for report in passes_for(Scenario::Smoke, 1..=3, 16, &script) {
        let lines = lines(&report);
        for (binding, creator) in changes {
            let name = allocation_name(
                DEV_CLIENT_URI,
                &owner_hash("https://issuer.sim", OWNER),
                binding,
            );
            let changed = format!("peer changed the creator ({creator:?}) of {name} before PUT ");
            let peer = lines
                .iter()
                .find(|l| l.actor == "apiserver" && l.event.starts_with(&changed))
                .unwrap_or_else(|| panic!("the peer never saw the acquire's write on {binding}"));
            let path = peer.event.trim_start_matches(&changed);
            let conflict = format!("after the peer 409 PUT {path}");
            assert!(
                lines.iter().any(|l| l.event == conflict),
                "the acquire's write on {binding} did not lose to the peer"
            );
            let prefix = format!("acquire {binding} via replica-1 -> ");
            let acquired = lines
                .iter()
                .find(|l| l.actor == HOST && l.event.starts_with(&prefix))
                .unwrap_or_else(|| panic!("{HOST} traced no acquire of {binding}"));
            assert_eq!(
                acquired.event.trim_start_matches(&prefix),
                "NotFound as absent",
                "{binding}"
            );
            let snapshot = snapshot_of(&lines, SNAPSHOT_MS, &name);
            assert!(
                snapshot.contains(" epoch=1 "),
                "the refused acquire wrote a claim: {snapshot}"
            );
        }
    }
}
