//! The script of the detached-command race (`races/commands.rs`), shared with the supervisor
//! canary (`canary.rs`): ensure, acquire a 30 s claim, start `sleep 90` detached, never renew,
//! and cut every replica off the executor node from just after the start until well after the
//! claim's expiry; then acquire the binding again (the run lasts until then: a run ends when
//! its last client is done).

use std::time::Duration;

use sim::script::{Action, Scripted};
use sim::workload::scripted::{Call, Request};

pub const HOST: &str = "detacher";
pub const BINDING: &str = "long-job";
pub const ENSURE_MS: u64 = 1_500;
/// Late enough for the environment to be Ready.
pub const ACQUIRE_MS: u64 = ENSURE_MS + 5_000;
pub const DETACH_MS: u64 = ACQUIRE_MS + 1_000;
pub const CUT_MS: u64 = DETACH_MS + 1_000;
/// The claim's TTL (the scripted acquire's).
pub const CLAIM_TTL_MS: u64 = 30_000;
/// Well after the claim's expiry, the kill bound and the slack the checker allows.
pub const REPAIR_MS: u64 = ACQUIRE_MS + CLAIM_TTL_MS + 14_000;
/// The second acquisition, after the repair.
pub const REACQUIRE_MS: u64 = REPAIR_MS + 2_000;
/// How long the random clients work (they are done long before the script).
pub const WORKLOAD_SECS: u64 = 16;
pub const COMMAND: &str = "sleep 90; echo done";

fn at(ms: u64, action: Action) -> Scripted {
    Scripted {
        at: Duration::from_millis(ms),
        action,
    }
}

fn call(request: Request) -> Action {
    Action::Call(Call {
        host: HOST.to_owned(),
        platform: 0,
        replica: 0,
        owner: "dana".to_owned(),
        binding: BINDING.to_owned(),
        request,
    })
}

/// The steps, for `replicas` replicas.
pub fn steps(replicas: u32) -> Vec<Scripted> {
    let mut steps = vec![
        at(ENSURE_MS, call(Request::Ensure("default".to_owned()))),
        at(ACQUIRE_MS, call(Request::Acquire)),
        at(DETACH_MS, call(Request::Detach(COMMAND.to_owned()))),
    ];
    for i in 0..replicas {
        let (replica, node) = (format!("replica-{i}"), "node-0".to_owned());
        steps.push(at(CUT_MS, Action::Partition(replica.clone(), node.clone())));
        steps.push(at(REPAIR_MS, Action::Repair(replica, node)));
    }
    steps.push(at(REACQUIRE_MS, call(Request::Acquire)));
    steps
}
