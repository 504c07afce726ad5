//! Ask before fencing (the recovery issue, item 1): when an operation's holder is gone (its
//! lease expired), the reconciler asks the executor's supervisor about that operation id before
//! it fences, and the store moves the environment on by what the supervisor reports:
//!
//! | the supervisor says | the store writes |
//! |---|---|
//! | ended, proven, with its receipt | the outcome (`recoveredOperation`), the operation cleared |
//! | running, and the operation's claim is current | this replica adopts the lease (holder, renewal, expiry) |
//! | running, and the claim has ended | nothing until the call is cancelled and its end proven; then as the first row |
//! | nothing it can answer (no supervisor, unreachable, unknown id, unproven end, no answer in time) | nothing here: the reconciler fences, as before |
//!
//! Every write is guarded on the exact operation judged (same id, same expiry) and on the
//! same executor Pod that was asked, re-checked on the live object at every compare-and-swap
//! attempt, so that a completion, a renewal, a recovery or another replica's adoption landing
//! between the ask and the write is never overwritten. The asking is bounded by
//! [`ASK_DEADLINE`] (tokio time, the clock seam), so an unreachable executor still fences
//! promptly.

use std::time::{Duration, SystemTime};

use super::cas::{self, Decision};
use super::predicates::{healthy, template_retained, valid_claim};
use super::{OPERATION_TTL, Store, StoreError};
use crate::executor::protocol::CommandState;
use crate::executor::supervisor_protocol::{JournalEntry, SupervisorReply, SupervisorRequest};
use crate::executor::transport::SupervisorTarget;
use crate::kube::crd::{ActiveOperation, ExecutionEnvironment, RecoveredOperation, RfcTime};

/// How long asking the supervisor may take (opening the session and the answer) before the
/// reconciler gives up and fences.
pub const ASK_DEADLINE: Duration = Duration::from_secs(5);
/// How long a call whose claim ended gets to end after its cancel, at the supervisor.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How long the cancel of a call may take in all (its grace, the sweep, the transit).
pub const CANCEL_DEADLINE: Duration = Duration::from_secs(15);

/// What the supervisor said of an operation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// It ended and the end is proven: its journal entry, with its receipt.
    Ended(JournalEntry),
    /// It still runs.
    Running,
    /// Nothing that moves the environment on: why.
    Unanswered(&'static str),
}

/// What the store did with an expired operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Its outcome is recorded and it is cleared.
    Recorded,
    /// This replica holds its lease now, until this long from now.
    Adopted(Duration),
    /// Nothing was written: the caller fences, for this reason.
    Fence(&'static str),
}

impl Store {
    /// Settles `judged`, the expired operation of `o`, by asking the executor's supervisor.
    /// A write that finds the live operation changed (another id, another expiry, another
    /// Pod, a fence) fails with a retryable conflict and changes nothing.
    pub async fn settle_expired(
        &self,
        o: &ExecutionEnvironment,
        judged: &ActiveOperation,
    ) -> Result<Settled, StoreError> {
        let Ok(target) = self.supervisor_target(o) else {
            return Ok(Settled::Fence("no executor recorded"));
        };
        let asked = self.ask_operation(&target, &judged.id).await;
        match asked {
            Asked::Ended(entry) => self.record_ended(o, judged, &target, entry, false).await,
            Asked::Running if operation_claim_current(o, judged, self, self.now()) => {
                self.adopt(o, judged, &target).await
            }
            Asked::Running => match self.cancel_call(&target, &judged.id).await {
                Asked::Ended(entry) => self.record_ended(o, judged, &target, entry, true).await,
                Asked::Running => Ok(Settled::Fence("the cancelled call did not end")),
                Asked::Unanswered(why) => Ok(Settled::Fence(why)),
            },
            Asked::Unanswered(why) => Ok(Settled::Fence(why)),
        }
    }

    /// The supervisor's journal entry of `id` (never sealed: a call the supervisor does not
    /// know may still run somewhere else), within [`ASK_DEADLINE`].
    pub async fn ask_operation(&self, target: &SupervisorTarget, id: &str) -> Asked {
        let request = SupervisorRequest::Journal {
            command_id: id.to_owned(),
            seal: false,
        };
        self.asked(target, &request, ASK_DEADLINE).await
    }

    /// Cancels the journaled call `id` and answers its entry once ended, within
    /// [`CANCEL_DEADLINE`].
    async fn cancel_call(&self, target: &SupervisorTarget, id: &str) -> Asked {
        let request = SupervisorRequest::CancelCall {
            operation_id: id.to_owned(),
            grace_ms: CANCEL_GRACE.as_millis() as u64,
        };
        self.asked(target, &request, CANCEL_DEADLINE).await
    }

    async fn asked(
        &self,
        target: &SupervisorTarget,
        request: &SupervisorRequest,
        deadline: Duration,
    ) -> Asked {
        let until = self.runtime.clock.monotonic() + deadline;
        let reply = tokio::time::timeout_at(until, self.supervisor_call(target, request)).await;
        match reply {
            Err(_) => Asked::Unanswered("the supervisor did not answer in time"),
            Ok(Err(_)) => Asked::Unanswered("the supervisor cannot be asked"),
            Ok(Ok(SupervisorReply::Journal { entry: None })) => {
                Asked::Unanswered("the supervisor does not know the operation")
            }
            Ok(Ok(SupervisorReply::Journal { entry: Some(entry) })) => judge(entry),
            Ok(Ok(_)) => Asked::Unanswered("the supervisor answered something else"),
        }
    }

    /// Records the proven end `entry` of `judged` and clears it (guarded).
    async fn record_ended(
        &self,
        o: &ExecutionEnvironment,
        judged: &ActiveOperation,
        asked: &SupervisorTarget,
        entry: JournalEntry,
        cancelled_by_recovery: bool,
    ) -> Result<Settled, StoreError> {
        let env = o.metadata.name.clone().unwrap_or_default();
        let now = self.now();
        let record = RecoveredOperation {
            id: judged.id.clone(),
            operation: judged.operation.clone(),
            state: entry.state.as_str().to_owned(),
            terminal_receipt: entry.terminal_receipt.clone(),
            cancelled_by_recovery,
            recorded_at: RfcTime::from_system_time(now),
        };
        cas::update_status_from(&self.api, &env, Some(o.clone()), |live| {
            if !still_judged(live, judged, asked) {
                return Err(changed(&env));
            }
            let status = live.status.get_or_insert_with(Default::default);
            status.active_operation = None;
            status.recovered_operation = Some(record.clone());
            Ok(Decision::Write(()))
        })
        .await?;
        tracing::info!(
            env,
            operation = judged.id,
            state = record.state,
            "recorded an operation whose holder was gone"
        );
        Ok(Settled::Recorded)
    }

    /// Takes over the lease of `judged` as this replica (guarded; the claim must still be
    /// current on the live object).
    async fn adopt(
        &self,
        o: &ExecutionEnvironment,
        judged: &ActiveOperation,
        asked: &SupervisorTarget,
    ) -> Result<Settled, StoreError> {
        let env = o.metadata.name.clone().unwrap_or_default();
        let now = self.now();
        cas::update_status_from(&self.api, &env, Some(o.clone()), |live| {
            if !still_judged(live, judged, asked) {
                return Err(changed(&env));
            }
            if !operation_claim_current(live, judged, self, now) {
                return Err(changed(&env));
            }
            let status = live.status.get_or_insert_with(Default::default);
            if let Some(op) = status.active_operation.as_mut() {
                op.holder_id = self.holder_id.clone();
                op.renewed_at = RfcTime::from_system_time(now);
                op.expires_at = RfcTime::from_system_time(now + OPERATION_TTL);
            }
            Ok(Decision::Write(()))
        })
        .await?;
        tracing::info!(
            env,
            operation = judged.id,
            "adopted the lease of an operation whose holder was gone"
        );
        Ok(Settled::Adopted(OPERATION_TTL))
    }
}

/// Sorts a journal entry: a proven end with its receipt, still running, or nothing usable.
fn judge(entry: JournalEntry) -> Asked {
    if entry.state == CommandState::Running {
        return Asked::Running;
    }
    if entry.never_started {
        return Asked::Unanswered("the supervisor never ran the operation");
    }
    if !entry.proven || entry.terminal_receipt.is_empty() {
        return Asked::Unanswered("the operation's end is not proven");
    }
    Asked::Ended(entry)
}

/// The live object still records exactly the operation judged (same id, same expiry), still
/// unfenced, on the executor Pod whose supervisor was asked.
fn still_judged(
    live: &ExecutionEnvironment,
    judged: &ActiveOperation,
    asked: &SupervisorTarget,
) -> bool {
    let Some(status) = live.status.as_ref() else {
        return false;
    };
    let same_operation = status
        .active_operation
        .as_ref()
        .is_some_and(|op| op.id == judged.id && op.expires_at == judged.expires_at);
    let same_pod = status
        .pod
        .as_ref()
        .is_some_and(|p| p.uid == asked.pod_uid && p.name == asked.executor.pod_name);
    same_operation && same_pod && healthy(live)
}

/// The claim the operation runs under is still the environment's current, unexpired claim at
/// the operation's epoch and the environment's grant generation, with its template retained
/// and no lifecycle operation or deletion under way.
fn operation_claim_current(
    o: &ExecutionEnvironment,
    op: &ActiveOperation,
    store: &Store,
    now: SystemTime,
) -> bool {
    let Some((run, epoch)) = valid_claim(o) else {
        return false;
    };
    let status = o.status.clone().unwrap_or_default();
    run.claim_id == op.claim_id
        && run.run_id == op.run_id
        && run.epoch == op.epoch
        && epoch == op.epoch
        && status.grant_generation == Some(run.grant_generation)
        && now < run.expires_at.to_system_time()
        && status.lifecycle_operation.is_none()
        && o.metadata.deletion_timestamp.is_none()
        && template_retained(o, &store.templates)
}

fn changed(env: &str) -> StoreError {
    StoreError::Conflict {
        env: env.to_owned(),
        reason: "the expired operation changed before its settlement",
        retryable: true,
    }
}
