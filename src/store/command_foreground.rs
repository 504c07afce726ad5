//! Foreground commands through the supervisor (docs/commands.md §6, "Foreground starts"): a
//! `StartCommand` without `detach` that asks for what the one-shot helper cannot take (command
//! variables, a working directory, a terminal, a client operation id). The call is admitted as
//! a detached start is (one write adding a lease, here marked not detached, then the
//! supervisor's `start`), follows the command to its end on the same call, reads its retained
//! output and records its end (a second write, reason `Exited`). A timeout of 0 is the
//! template's longest command, as for a one-shot command.
//!
//! The command belongs to the claim, not to the call: a call that is dropped leaves it running
//! under its claim (`ListCommands` shows it, `CommandStatus`/`FollowCommand` reattach, a replay
//! under the same operation id answers it at its end, a cancel or the claim's end ends it).

use super::command_leases::{self as leases, tuple_of};
use super::commands::{SupervisedStart, unreachable};
use super::validate::ValidatedClaim;
use super::{ClaimContext, Store, StoreError};
use crate::executor::supervisor_protocol::{
    CommandView, MAX_STATUS_BYTES, SupervisorReply, SupervisorRequest,
};
use crate::executor::transport::SupervisorSession;
use crate::kube::crd::CommandEndReason;

impl Store {
    /// Runs `start` in the foreground through the supervisor; answers the ended command with
    /// its whole retained output.
    pub async fn run_foreground(
        &self,
        claim: ValidatedClaim,
        mut start: SupervisedStart,
    ) -> Result<CommandView, StoreError> {
        let env = claim.rc.env.id.clone();
        let rc = claim.rc.clone();
        let target = self.supervisor_target(&claim.observed)?;
        start.detached = false;
        if start.timeout_ms == 0 {
            start.timeout_ms = self.longest_command_millis(&claim.observed)?;
        }
        let started = self.start_supervised(claim, start).await?;
        let id = started.command_id;
        // A follow holds its session to the end; the output is read on another.
        follow_to_end(&mut self.session(&target).await?, &env, &id, &rc).await?;
        let view = retained_output(&mut self.session(&target).await?, &env, &id, &rc).await?;
        let outcome = leases::outcome_of(&view, CommandEndReason::Exited, self.now());
        self.record_ends(&env, vec![(id, outcome)]).await?;
        Ok(view)
    }
}

/// Follows `id` until the supervisor reports its end (its output is read afterwards).
async fn follow_to_end(
    session: &mut SupervisorSession,
    env: &str,
    id: &str,
    rc: &ClaimContext,
) -> Result<(), StoreError> {
    let request = SupervisorRequest::Follow {
        command_id: id.to_owned(),
        claim: tuple_of(rc),
        offset: 0,
    };
    session.send(&request).await.map_err(|_| unreachable(env))?;
    loop {
        match session.next_reply().await {
            Ok(Some(SupervisorReply::Output { .. })) => {}
            Ok(Some(SupervisorReply::Status(_))) => return Ok(()),
            Ok(Some(SupervisorReply::Error(error))) => {
                return Err(super::command_reads::refusal(env, error.code));
            }
            Ok(Some(_) | None) | Err(_) => return Err(unreachable(env)),
        }
    }
}

/// The ended command with every retained output byte, read in pages of at most
/// [`MAX_STATUS_BYTES`].
async fn retained_output(
    session: &mut SupervisorSession,
    env: &str,
    id: &str,
    rc: &ClaimContext,
) -> Result<CommandView, StoreError> {
    let mut whole: Option<CommandView> = None;
    let mut offset = 0;
    loop {
        let request = SupervisorRequest::Status {
            command_id: id.to_owned(),
            claim: tuple_of(rc),
            offset,
            max_bytes: MAX_STATUS_BYTES as u64,
        };
        let page = match session.call(&request).await {
            Ok(SupervisorReply::Status(view)) => view,
            Ok(SupervisorReply::Error(error)) => {
                return Err(super::command_reads::refusal(env, error.code));
            }
            Ok(_) | Err(_) => return Err(unreachable(env)),
        };
        let done = page.chunks.is_empty();
        offset = page.next_offset;
        whole = Some(match whole {
            None => page,
            Some(mut so_far) => {
                so_far.chunks.extend(page.chunks);
                so_far.next_offset = page.next_offset;
                so_far
            }
        });
        if done {
            return whole.ok_or_else(|| unreachable(env));
        }
    }
}
