//! Supervised commands, the written part (docs/commands.md §5): a detached start is one
//! compare-and-swap adding a `Running` lease, then the supervisor's `start`; a cancel moves the
//! lease `Running → Cancelling`, asks the supervisor, and records the proven end; a claim's end
//! (release, revocation, a new claim after expiry) ends the claim's commands at the supervisor
//! and records every outcome in one write; a renewal is forwarded to the supervisor.
//!
//! Leases are held by the claim, not by a replica, so nothing here renews anything while a
//! command runs. The read-only calls (status, follow, stdin, signals, list) are in
//! [`super::command_reads`].

use std::fmt;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::cas::{self, Decision};
use super::command_exits::{record_self_ended, self_ended};
use super::command_leases::{self as leases, find, find_owned, open_count, tuple_of};
use super::predicates::{
    active, claim_current, creator_matches, env_ref, healthy, published, ready, schema_current,
    template_retained,
};
use super::validate::ValidatedClaim;
use super::{ClaimContext, RunClaim, Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::ErrorCode as HelperCode;
use crate::executor::supervisor_protocol::{
    CommandView, MAX_LEASE, MAX_WINDOW, PtySize, StartRequest, SupervisorReply, SupervisorRequest,
};
use crate::executor::transport::{
    ExecutorTarget, SupervisorSession, SupervisorTarget, TransportError,
};
use crate::kube::crd::{
    CommandEndReason, CommandEndState, CommandLeaseState, ExecutionEnvironment, FenceState,
    MAX_RUNNING_COMMANDS,
};

/// What a start through the supervisor asks for beyond its shell text: a detached start, or a
/// foreground one with what the one-shot helper cannot take ([`Store::run_foreground`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SupervisedStart {
    /// Answer at once (detached) rather than at the command's end (foreground).
    pub detached: bool,
    /// Shell text for `/bin/sh -c`.
    pub command: String,
    /// Variables for the command only.
    pub env: Vec<(String, String)>,
    /// Relative to the workspace root.
    pub working_dir: String,
    /// 0: none (the claim bounds the command).
    pub timeout_ms: u64,
    /// Give the command a stdin pipe.
    pub stdin: bool,
    /// Run the command on a terminal of this size (its stdin, stdout and stderr).
    pub pty: Option<PtySize>,
    /// The client's operation id: a start replayed with it under the same claim answers the
    /// command it started (its id is derived from the claim and this id) instead of starting
    /// another; `None` mints a fresh command id.
    pub operation_id: Option<String>,
}

impl fmt::Debug for SupervisedStart {
    /// Variable values never reach logs or traces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SupervisedStart")
            .field("detached", &self.detached)
            .field("command_bytes", &self.command.len())
            .field("env_count", &self.env.len())
            .field("working_dir", &self.working_dir)
            .field("timeout_ms", &self.timeout_ms)
            .field("stdin", &self.stdin)
            .field("pty", &self.pty)
            .finish()
    }
}

impl Store {
    /// The supervisor of the environment's recorded executor Pod.
    pub(super) fn supervisor_target(
        &self,
        o: &ExecutionEnvironment,
    ) -> Result<SupervisorTarget, StoreError> {
        let env = o.metadata.name.clone().unwrap_or_default();
        let pod = o.status.as_ref().and_then(|s| s.pod.clone());
        let Some(pod) = pod.filter(|p| !p.name.is_empty()) else {
            return Err(StoreError::NotReady {
                env,
                reason: "executor pod not recorded",
                retryable: true,
            });
        };
        Ok(SupervisorTarget {
            executor: ExecutorTarget {
                namespace: self.namespace.clone(),
                pod_name: pod.name,
                environment: env,
            },
            pod_uid: pod.uid,
        })
    }

    /// An authenticated session with `target`'s supervisor. An executor without one answers
    /// UNIMPLEMENTED; an unreachable one UNAVAILABLE `executor_unreachable`.
    pub(super) async fn session(
        &self,
        target: &SupervisorTarget,
    ) -> Result<SupervisorSession, StoreError> {
        let env = &target.executor.environment;
        match self.executor.supervisor(target).await {
            Ok(session) => Ok(session),
            Err(TransportError::Unsupported) => Err(StoreError::command(
                env,
                ErrorCode::Unimplemented,
                "executor has no supervisor",
            )),
            Err(error) => {
                tracing::warn!(env, %error, "supervisor unreachable");
                Err(unreachable(env))
            }
        }
    }

    /// One request and its reply over a fresh session.
    pub(super) async fn supervisor_call(
        &self,
        target: &SupervisorTarget,
        request: &SupervisorRequest,
    ) -> Result<SupervisorReply, StoreError> {
        let mut session = self.session(target).await?;
        session.call(request).await.map_err(|error| {
            tracing::warn!(env = %target.executor.environment, %error, "supervisor call failed");
            unreachable(&target.executor.environment)
        })
    }

    /// A supervised `StartCommand`: one write adding a `Running` lease under the validated
    /// claim, then the supervisor's `start`; answers the command as it stands at once. A start the
    /// supervisor refuses definitively ends its lease (a second write); one without an answer
    /// stays `Running` until its claim's end seals it.
    pub async fn start_supervised(
        &self,
        claim: ValidatedClaim,
        start: SupervisedStart,
    ) -> Result<CommandView, StoreError> {
        let ValidatedClaim {
            caller,
            rc,
            observed,
            policy,
        } = claim;
        let env = rc.env.id.clone();
        let window = self.detached_bounds(&observed, &start)?;
        let target = self.supervisor_target(&observed)?;
        // Opening a session starts nothing: an executor without a supervisor writes nothing.
        let mut session = self.session(&target).await?;
        let (id, request_digest) = match &start.operation_id {
            Some(operation) => (
                client_command_id(&rc.claim_id, operation),
                start_digest(&start),
            ),
            None => (self.new_command_id(), String::new()),
        };
        let self_ended = self_ended(&mut session, &observed, &rc).await;
        let now = self.now();
        let expires = observed
            .status
            .as_ref()
            .and_then(|s| s.active_run.as_ref())
            .map(|r| r.expires_at.to_system_time());
        let replayed = cas::update_status_from(&self.api, &env, Some(observed), |o| {
            if !creator_matches(o, &caller) {
                return Err(StoreError::not_found(&env, "creator or owner differs"));
            }
            if !schema_current(o) || !template_retained(o, &self.templates) {
                return Err(StoreError::not_ready(
                    &env,
                    "schema or template unavailable",
                ));
            }
            let status = o.status.clone().unwrap_or_default();
            if status.lifecycle_operation.is_some() {
                return Err(StoreError::not_ready(&env, "lifecycle in progress"));
            }
            if !published(o, &rc.binding_id) {
                return Err(StoreError::not_found(&env, "published reference not found"));
            }
            if !claim_current(o, &rc, now) {
                return Err(StoreError::conflict(&env, "run claim is not current"));
            }
            if env_ref(o) != rc.env || !active(o) || !ready(o) || !healthy(o) {
                return Err(StoreError::not_ready(&env, "not ready at requested epoch"));
            }
            if status.pod.as_ref().map(|p| (&p.name, &p.uid))
                != Some((&target.executor.pod_name, &target.pod_uid))
            {
                return Err(StoreError::conflict(&env, "executor pod changed"));
            }
            if !policy.current(&o.spec.template_id) {
                return Err(StoreError::not_ready(&env, "client policy withdrawn"));
            }
            if let Some(known) = find(o, &id) {
                // A replay: the start was admitted before (its answer may have been lost).
                return Ok(Decision::Keep(Some(known.clone())));
            }
            let status = o.status.get_or_insert_with(Default::default);
            record_self_ended(status, &rc, &self_ended, now);
            if open_count(status) >= MAX_RUNNING_COMMANDS {
                return Err(StoreError::command(
                    &env,
                    ErrorCode::CommandLimit,
                    "too many running commands",
                ));
            }
            leases::push(status, leases::new_lease(&id, &rc, start.detached, now));
            Ok(Decision::Write(None))
        })
        .await?;
        let lease_ms = expires
            .and_then(|e| e.duration_since(now).ok())
            .unwrap_or_default()
            .min(MAX_LEASE);
        let request = SupervisorRequest::Start(StartRequest {
            command_id: id.clone(),
            claim: tuple_of(&rc),
            lease_ms: u64::try_from(lease_ms.as_millis()).unwrap_or(1).max(1),
            command: start.command,
            env: start.env,
            working_dir: start.working_dir,
            timeout_ms: start.timeout_ms,
            stdin: start.stdin,
            pty: start.pty,
            window_bytes: window,
            request_digest,
            replay_only: replayed.is_some(),
        });
        let reply = session.call(&request).await.map_err(|error| {
            tracing::warn!(env, %error, command = id, "start without an answer");
            unreachable(&env)
        })?;
        match reply {
            SupervisorReply::Status(view) => Ok(view),
            SupervisorReply::Error(error) if error.code == HelperCode::Conflict => Err(
                StoreError::conflict(&env, "operation id reused by another request"),
            ),
            SupervisorReply::Error(error) if replayed.is_some() => {
                // The supervisor no longer has it: its recorded end, if any.
                match replayed.as_ref().and_then(leases::view_of_ended) {
                    Some(view) if error.code == HelperCode::NotFound => Ok(view),
                    _ => Err(unreachable(&env)),
                }
            }
            SupervisorReply::Error(error) => {
                let code = match error.code {
                    HelperCode::ResourceExhausted => ErrorCode::CommandLimit,
                    HelperCode::InvalidArgument | HelperCode::NotFound => {
                        ErrorCode::InvalidArgument
                    }
                    // Anything else may have started something: the claim's end decides.
                    _ => return Err(unreachable(&env)),
                };
                self.end_refused_start(&env, &id).await;
                Err(StoreError::command(
                    &env,
                    code,
                    "supervisor refused the start",
                ))
            }
            _ => Err(unreachable(&env)),
        }
    }

    /// The execution settings of the environment's exact template revision.
    fn execution_spec(
        &self,
        o: &ExecutionEnvironment,
    ) -> Result<&crate::templates::ExecutionSpec, StoreError> {
        let env = o.metadata.name.as_deref().unwrap_or_default();
        let revision = self
            .templates
            .retained_revision(&o.spec.template_id, &o.spec.template_revision)
            .map_err(|_| StoreError::not_ready(env, "template definition unavailable"))?;
        Ok(revision.execution())
    }

    /// The template's longest command, in milliseconds.
    pub(super) fn longest_command_millis(
        &self,
        o: &ExecutionEnvironment,
    ) -> Result<u64, StoreError> {
        Ok(self.execution_spec(o)?.max_command_duration_millis())
    }

    /// The template's bounds on a supervised start; answers the retained output window.
    fn detached_bounds(
        &self,
        o: &ExecutionEnvironment,
        start: &SupervisedStart,
    ) -> Result<u64, StoreError> {
        let env = o.metadata.name.as_deref().unwrap_or_default();
        let spec = self.execution_spec(o)?;
        if start.command.len() as u64 > spec.max_command_bytes() {
            return Err(StoreError::ResourceExhausted {
                env: env.to_owned(),
                reason: "command exceeds the template bound",
            });
        }
        if start.timeout_ms > spec.max_command_duration_millis() {
            return Err(StoreError::InvalidArgument(
                "command timeout exceeds the template bound",
            ));
        }
        Ok(spec.max_command_bytes().min(MAX_WINDOW as u64))
    }

    async fn end_refused_start(&self, env: &str, id: &str) {
        let now = self.now();
        let ended = cas::update_status(&self.api, env, |o| {
            let status = o.status.get_or_insert_with(Default::default);
            if leases::end(status, id, leases::refused(now)) {
                Ok(Decision::Write(()))
            } else {
                Ok(Decision::Keep(()))
            }
        })
        .await;
        if let Err(error) = ended {
            tracing::warn!(env, %error, command = id, "could not end a refused start's lease");
        }
    }

    /// `CancelCommand`: `Running → Cancelling` (written), the supervisor's cancel (SIGTERM,
    /// `grace`, SIGKILL, proof), then `Ended` with the outcome (written). An ended command
    /// answers its recorded outcome; a foreign or unknown id is `command_not_found`.
    pub async fn cancel_command(
        &self,
        claim: ValidatedClaim,
        id: &str,
        grace: Duration,
    ) -> Result<CommandView, StoreError> {
        let ValidatedClaim { rc, observed, .. } = claim;
        let env = rc.env.id.clone();
        let lease = find_owned(&observed, id, &rc).ok_or_else(|| not_found(&env))?;
        if let Some(view) = leases::view_of_ended(lease) {
            return Ok(view);
        }
        let target = self.supervisor_target(&observed)?;
        let seen = observed.clone();
        let cancel_id = self.runtime.ids.hex(16);
        let now = self.now();
        let marked = cas::update_status_from(&self.api, &env, Some(observed), |o| {
            let Some(lease) = find_owned(o, id, &rc) else {
                return Err(not_found(&env));
            };
            if let Some(view) = leases::view_of_ended(lease) {
                return Ok(Decision::Keep(Some(view)));
            }
            if lease.state == CommandLeaseState::Cancelling {
                return Ok(Decision::Keep(None));
            }
            if !claim_current(o, &rc, now) {
                return Err(StoreError::conflict(&env, "run claim is not current"));
            }
            let status = o.status.get_or_insert_with(Default::default);
            if let Some(lease) = status.commands.iter_mut().find(|l| l.id == id) {
                lease.state = CommandLeaseState::Cancelling;
                lease.cancel_operation_id = Some(cancel_id.clone());
            }
            Ok(Decision::Write(None))
        })
        .await?;
        if let Some(view) = marked {
            return Ok(view);
        }
        let request = SupervisorRequest::Cancel {
            command_id: id.to_owned(),
            claim: tuple_of(&rc),
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(0),
        };
        let mut session = self.session(&target).await?;
        let reply = session.call(&request).await.map_err(|error| {
            tracing::warn!(env, %error, command = id, "cancel without an answer");
            unreachable(&env)
        })?;
        let view = match reply {
            SupervisorReply::Status(view) => view,
            SupervisorReply::Error(_) => {
                // The supervisor does not know it (never started, or a new boot): its journal,
                // sealed, says which.
                let entry = self.sealed_journal(&target, id).await?;
                let elsewhere = entry.as_ref().is_some_and(|e| {
                    !e.never_started
                        && (e.claim_id != rc.claim_id
                            || e.state == crate::executor::protocol::CommandState::Running)
                });
                if elsewhere {
                    // It knows the id under another tuple than this claim's (§7: the
                    // supervisor's own check): not this caller's command, and nothing of it is
                    // recorded here; its own claim's end decides.
                    return Err(not_found(&env));
                }
                let outcome = leases::outcome_of_journal(
                    entry.as_ref(),
                    CommandEndReason::Cancelled,
                    self.now(),
                );
                let view = CommandView {
                    command_id: id.to_owned(),
                    state: crate::executor::protocol::CommandState::Failed,
                    exit_code: outcome.exit_code,
                    ..CommandView::default()
                };
                self.record_ends(&env, vec![(id.to_owned(), outcome)])
                    .await?;
                return Ok(view);
            }
            _ => return Err(unreachable(&env)),
        };
        let outcome = leases::outcome_of(&view, CommandEndReason::Cancelled, self.now());
        // The same write records the claim's other commands that ended by themselves (§5.6).
        let exited = self_ended(&mut session, &seen, &rc).await;
        self.record_ends_and_exits(&env, vec![(id.to_owned(), outcome)], Some((&rc, &exited)))
            .await?;
        Ok(view)
    }

    /// The journal entry of `id`, sealed so that a start still in flight can no longer run.
    pub(super) async fn sealed_journal(
        &self,
        target: &SupervisorTarget,
        id: &str,
    ) -> Result<Option<crate::executor::supervisor_protocol::JournalEntry>, StoreError> {
        let request = SupervisorRequest::Journal {
            command_id: id.to_owned(),
            seal: true,
        };
        match self.supervisor_call(target, &request).await? {
            SupervisorReply::Journal { entry } => Ok(entry),
            _ => Err(unreachable(&target.executor.environment)),
        }
    }

    /// Records ends in one write; an end that is not proven fences the environment (something
    /// of the command may still run).
    pub(super) async fn record_ends(
        &self,
        env: &str,
        ends: Vec<(String, crate::kube::crd::CommandOutcome)>,
    ) -> Result<(), StoreError> {
        self.record_ends_and_exits(env, ends, None).await
    }

    /// [`Store::record_ends`], and in the same write the ends of `exits`' claim's commands
    /// that its supervisor reported ended by themselves.
    async fn record_ends_and_exits(
        &self,
        env: &str,
        ends: Vec<(String, crate::kube::crd::CommandOutcome)>,
        exits: Option<(&ClaimContext, &[CommandView])>,
    ) -> Result<(), StoreError> {
        let now = self.now();
        cas::update_status(&self.api, env, |o| {
            let status = o.status.get_or_insert_with(Default::default);
            let mut changed = false;
            for (id, outcome) in &ends {
                let unproven = outcome.state == CommandEndState::FenceUnknown;
                if leases::end(status, id, outcome.clone()) {
                    changed = true;
                    if unproven {
                        status.fence_state = Some(FenceState::FenceUnknown);
                    }
                }
            }
            if let Some((rc, ended)) = exits {
                changed |= record_self_ended(status, rc, ended, now);
            }
            Ok(if changed {
                Decision::Write(())
            } else {
                Decision::Keep(())
            })
        })
        .await
    }

    /// Ends every open command of `claim_id` at the supervisor and records the outcomes in
    /// one write (docs/commands.md §5.5). Nothing to do (no open lease of that claim) costs
    /// one read and no write.
    pub async fn end_claim_commands(&self, env: &str, claim_id: &str) -> Result<(), StoreError> {
        let Some(o) = cas::get(&self.api, env).await.ok().flatten() else {
            return Ok(());
        };
        self.end_claim_commands_of(&o, claim_id).await
    }

    pub(super) async fn end_claim_commands_of(
        &self,
        o: &ExecutionEnvironment,
        claim_id: &str,
    ) -> Result<(), StoreError> {
        self.end_claims_of(o, &[claim_id.to_owned()]).await
    }

    /// Ends every open command of `claim_id` at the supervisor (`end_claim`, then the sealed
    /// journal of any it did not report) and answers their outcomes, writing nothing. No
    /// open lease of that claim asks nothing.
    pub(super) async fn claim_ends_of(
        &self,
        o: &ExecutionEnvironment,
        claim_id: &str,
    ) -> Result<Vec<(String, crate::kube::crd::CommandOutcome)>, StoreError> {
        let env = o.metadata.name.clone().unwrap_or_default();
        let open: Vec<String> = o
            .status
            .iter()
            .flat_map(|s| s.commands.iter())
            .filter(|l| l.is_open() && l.claim_id == claim_id)
            .map(|l| l.id.clone())
            .collect();
        if open.is_empty() {
            return Ok(Vec::new());
        }
        let target = self.supervisor_target(o)?;
        let request = SupervisorRequest::EndClaim {
            claim_id: claim_id.to_owned(),
            grace_ms: 0,
        };
        let views = match self.supervisor_call(&target, &request).await? {
            SupervisorReply::StatusList { commands } => commands,
            _ => return Err(unreachable(&env)),
        };
        let mut ends = Vec::new();
        for id in open {
            let now = self.now();
            let outcome = match views.iter().find(|v| v.command_id == id) {
                Some(view) => leases::outcome_of(view, CommandEndReason::ClaimEnded, now),
                None => {
                    let entry = self.sealed_journal(&target, &id).await?;
                    leases::outcome_of_journal(entry.as_ref(), CommandEndReason::ClaimEnded, now)
                }
            };
            ends.push((id, outcome));
        }
        Ok(ends)
    }

    /// Ends the commands of every claim but the current, unexpired one: what a new claim
    /// needs before it may take the environment (C2).
    pub(super) async fn end_stale_claims(&self, env: &str) -> Result<(), StoreError> {
        let Some(o) = cas::get(&self.api, env).await.ok().flatten() else {
            return Ok(());
        };
        self.end_stale_claims_of(&o).await
    }

    /// [`Store::end_stale_claims`] on an object just read or written; no open lease costs
    /// nothing.
    pub(super) async fn end_stale_claims_of(
        &self,
        o: &ExecutionEnvironment,
    ) -> Result<(), StoreError> {
        let o = o.clone();
        let now = self.now();
        let current = super::predicates::valid_claim(&o)
            .filter(|(run, _)| now < run.expires_at.to_system_time())
            .map(|(run, _)| run.claim_id);
        let stale: Vec<String> = leases::open_claims(&o)
            .into_iter()
            .filter(|claim_id| Some(claim_id) != current.as_ref())
            .collect();
        self.end_claims_of(&o, &stale).await
    }

    /// Forwards a recorded renewal to the supervisor (no write), best effort: a supervisor
    /// that misses it kills at the old deadline, the conservative side.
    pub(super) async fn forward_renewal(&self, target: SupervisorTarget, claim: &RunClaim) {
        let now = self.now();
        let lease = claim
            .expires_at
            .duration_since(now)
            .unwrap_or_default()
            .min(MAX_LEASE);
        let request = SupervisorRequest::Renew {
            claim: crate::executor::supervisor_protocol::ClaimTuple {
                claim_id: claim.claim_id.clone(),
                run_id: claim.run_id.clone(),
                epoch: claim.epoch,
                grant_generation: claim.grant_generation,
            },
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(1).max(1),
        };
        match self.supervisor_call(&target, &request).await {
            Ok(SupervisorReply::Renewed { .. }) => {}
            other => tracing::warn!(env = %claim.env.id, ?other, "renewal not forwarded"),
        }
    }
}

/// The supervisor of an environment with open leases of `rc`'s claim, for a renewal to reach.
pub(super) fn renewal_target(
    store: &Store,
    o: &ExecutionEnvironment,
    rc: &ClaimContext,
) -> Option<SupervisorTarget> {
    let owns = o
        .status
        .as_ref()?
        .commands
        .iter()
        .any(|l| l.is_open() && leases::owned_by(l, rc));
    owns.then(|| store.supervisor_target(o).ok()).flatten()
}

pub(super) fn not_found(env: &str) -> StoreError {
    StoreError::command(
        env,
        ErrorCode::CommandNotFound,
        "no such command for this claim",
    )
}

/// The command id of a start under the client's `operation` id: derived from the claim, so a
/// replay under the same claim finds its command and no other claim can name it.
fn client_command_id(claim_id: &str, operation: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"mecatl-client-command-id/v1\0")
        .chain_update(claim_id.as_bytes())
        .chain_update(b"\0")
        .chain_update(operation.as_bytes())
        .finalize();
    hex::encode(&digest[..16])
}

/// A digest of everything a start asks for (variable values included; it stays in the
/// supervisor's memory and is never written to the status).
fn start_digest(start: &SupervisedStart) -> String {
    let mut digest = Sha256::new();
    let mut field = |bytes: &[u8]| {
        digest.update((bytes.len() as u64).to_be_bytes());
        digest.update(bytes);
    };
    field(start.command.as_bytes());
    for (name, value) in &start.env {
        field(name.as_bytes());
        field(value.as_bytes());
    }
    field(start.working_dir.as_bytes());
    field(&start.timeout_ms.to_be_bytes());
    field(&[u8::from(start.stdin)]);
    let pty = start
        .pty
        .map(|p| [p.rows.to_be_bytes(), p.cols.to_be_bytes()].concat());
    field(&pty.unwrap_or_default());
    if !start.detached {
        // Only foreground starts add a field, so detached digests stay what they were.
        field(b"foreground");
    }
    hex::encode(digest.finalize())
}

pub(super) fn unreachable(env: &str) -> StoreError {
    StoreError::command(
        env,
        ErrorCode::ExecutorUnreachable,
        "supervisor unreachable",
    )
}
