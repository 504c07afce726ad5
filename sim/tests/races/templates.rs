//! Races between the two templates of the simulated world for one binding
//! (CompetingTemplateBindingReleasesLosingReservation, spec/store.md §12).

use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::kube::crd::ledger_key;
use execution_provider::store::naming::{allocation_name, owner_hash};
use sim::Scenario;
use sim::script::Action;
use sim::workload::scripted::{Call, Request};
use sim::world::SECOND_TEMPLATE;

use crate::support::*;

/// When the two ensures leave their hosts.
const RACE_MS: u64 = 2_000;
/// How long both replicas' API traffic is held around them.
const HELD_MS: u64 = 1_000;
/// The scripted calls' owner, whom no workload client attests.
const OWNER: &str = "carol";

/// `host` (first platform) ensures `binding` for [`OWNER`] with `template` through `replica`.
fn ensure(host: &str, replica: u32, binding: &str, template: &str) -> Action {
    Action::Call(Call {
        host: host.to_owned(),
        platform: 0,
        replica,
        owner: OWNER.to_owned(),
        binding: binding.to_owned(),
        request: Request::Ensure(template.to_owned()),
    })
}

/// The environment name of [`OWNER`]'s `binding` on the first platform.
fn environment(binding: &str) -> String {
    allocation_name(
        DEV_CLIENT_URI,
        &owner_hash("https://issuer.sim", OWNER),
        binding,
    )
}

/// Whether the snapshot at `ms` lists `name` in `template`'s ledger entry.
fn holds_slot(lines: &[Line], ms: u64, template: &str, name: &str) -> bool {
    let prefix = format!("snapshot ledger {}=", ledger_key(template));
    let quoted = format!("\"{name}\"");
    lines
        .iter()
        .filter(|l| l.ms == ms)
        .filter_map(|l| l.event.strip_prefix(&prefix))
        .any(|names| names.contains(&quoted))
}

/// The outcome `host` traced for `what` (`ensure default`, ...) of `binding`.
fn outcome_of(lines: &[Line], host: &str, what: &str, binding: &str) -> (u64, String) {
    let prefix = format!("{what} {binding} via ");
    lines
        .iter()
        .filter(|l| l.actor == host && l.event.starts_with(&prefix))
        .find_map(|l| {
            let (_, outcome) = l.event.rsplit_once(" -> ")?;
            Some((l.ms, outcome.to_owned()))
        })
        .unwrap_or_else(|| panic!("{host} traced no {what} of {binding}"))
}

/// Two ensures of one binding with different templates (same platform, same owner) race
/// through two replicas whose API traffic is held, so that both read the binding's
/// environment as absent before either creates it: both reserve a slot of their own
/// template, both create, one create loses (409). The winner's ensure succeeds; the loser is
/// refused ALREADY_EXISTS (the binding belongs to another template) after releasing its
/// slot: a ledger snapshot lists the environment under the winner's template only. Capacity
/// is reusable: fresh bindings of both templates are ensured afterwards and hold their slots.
#[test]
fn two_templates_racing_for_one_binding_leave_one_winner_and_release_the_losing_slot() {
    const SNAPSHOT_MS: u64 = RACE_MS + 4_500;
    let contested = "contested";
    let mut script = Vec::new();
    for replica in ["replica-1", "replica-2"] {
        let (a, b) = hosts(replica, "apiserver");
        script.push(at(RACE_MS - 100, Action::Hold(a.clone(), b.clone())));
        script.push(at(RACE_MS + HELD_MS, Action::Release(a, b)));
    }
    script.extend([
        at(RACE_MS, ensure("race-default", 1, contested, "default")),
        at(
            RACE_MS,
            ensure("race-compact", 2, contested, SECOND_TEMPLATE),
        ),
        at(
            RACE_MS + 3_000,
            ensure("reuse", 0, "reuse-default", "default"),
        ),
        at(
            RACE_MS + 3_500,
            ensure("reuse", 0, "reuse-compact", SECOND_TEMPLATE),
        ),
        at(SNAPSHOT_MS, Action::Snapshot),
    ]);
    let name = environment(contested);
    for report in passes_for(Scenario::Smoke, 1..=3, 16, &script) {
        let lines = lines(&report);
        let first = outcome_of(&lines, "race-default", "ensure default", contested);
        let second = outcome_of(
            &lines,
            "race-compact",
            &format!("ensure {SECOND_TEMPLATE}"),
            contested,
        );
        let (winner, loser) = match (first.1.as_str(), second.1.as_str()) {
            ("ok", "AlreadyExists") => ("default", SECOND_TEMPLATE),
            ("AlreadyExists", "ok") => (SECOND_TEMPLATE, "default"),
            _ => panic!("not one winner and one ALREADY_EXISTS: {first:?} {second:?}"),
        };
        assert!(
            first.0 < SNAPSHOT_MS && second.0 < SNAPSHOT_MS,
            "the race ended after the snapshot: {first:?} {second:?}"
        );
        // The loser got past its (stale) absent read: its create was refused because the
        // winner's environment existed by then.
        let answered = first.0.max(second.0);
        assert!(
            lines.iter().any(|l| l.actor == "apiserver"
                && (RACE_MS..=answered).contains(&l.ms)
                && l.event.starts_with("exists 409 POST ")
                && l.event.ends_with("/executionenvironments")),
            "no create of an existing environment during the race"
        );
        snapshot_of(&lines, SNAPSHOT_MS, &name);
        assert!(
            holds_slot(&lines, SNAPSHOT_MS, winner, &name),
            "the winner ({winner}) lost its slot"
        );
        assert!(
            !holds_slot(&lines, SNAPSHOT_MS, loser, &name),
            "the loser ({loser}) kept its slot"
        );
        for (binding, template) in [
            ("reuse-default", "default"),
            ("reuse-compact", SECOND_TEMPLATE),
        ] {
            let what = format!("ensure {template}");
            let (_, outcome) = outcome_of(&lines, "reuse", &what, binding);
            assert_eq!(outcome, "ok", "{what} of {binding} after the race");
            assert!(
                holds_slot(&lines, SNAPSHOT_MS, template, &environment(binding)),
                "{binding} holds no slot of {template}"
            );
        }
    }
}
