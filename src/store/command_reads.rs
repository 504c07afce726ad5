//! Supervised commands, the read-only part (docs/commands.md §5.3, §7): status, follow,
//! stdin, signals and listing (resize and attach are in [`super::command_terminal`]). Each starts from a claim [`Store::validate_run_claim_under`]
//! found current (one GET), requires the command's lease to belong to exactly that claim (a
//! foreign or earlier claim sees what an absent command looks like), and then asks the
//! supervisor, which checks the claim's tuple and deadline again. Nothing here writes to
//! Kubernetes: a keystroke or a poll costs no write.

use super::command_leases::{self as leases, find_owned, tuple_of};
use super::commands::{not_found, unreachable};
use super::validate::ValidatedClaim;
use super::{Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::ErrorCode as HelperCode;
use crate::executor::supervisor_protocol::{
    Chunk, CommandSignal, CommandView, MAX_LIST, SupervisorReply, SupervisorRequest,
};
use crate::executor::transport::SupervisorSession;
use crate::kube::crd::CommandLease;

/// One event of a followed command.
#[derive(Debug)]
pub enum FollowEvent {
    /// Output, in offset order, after `dropped` bytes that fell out of the window.
    Output {
        /// The chunks.
        chunks: Vec<Chunk>,
        /// Bytes lost before them.
        dropped: u64,
    },
    /// The command's end; the last event.
    End(CommandView),
}

/// An open follow of one command: its supervisor session.
pub struct CommandFollow {
    session: SupervisorSession,
    env: String,
    done: bool,
}

impl CommandFollow {
    /// The next event; `None` after the end.
    pub async fn next(&mut self) -> Option<Result<FollowEvent, StoreError>> {
        if self.done {
            return None;
        }
        let reply = match self.session.next_reply().await {
            Ok(Some(reply)) => reply,
            Ok(None) | Err(_) => {
                self.done = true;
                return Some(Err(unreachable(&self.env)));
            }
        };
        Some(match reply {
            SupervisorReply::Output {
                chunks,
                dropped_bytes,
            } => Ok(FollowEvent::Output {
                chunks,
                dropped: dropped_bytes,
            }),
            SupervisorReply::Status(view) => {
                self.done = true;
                Ok(FollowEvent::End(view))
            }
            SupervisorReply::Error(error) => {
                self.done = true;
                Err(refusal(&self.env, error.code))
            }
            _ => {
                self.done = true;
                Err(unreachable(&self.env))
            }
        })
    }
}

/// What a listing shows of one command (no output).
#[derive(Debug, Clone)]
pub struct ListedCommand {
    /// The supervisor's view, or one built from the recorded end.
    pub view: CommandView,
    /// Started detached.
    pub detached: bool,
}

impl Store {
    /// `CommandStatus`: the command's state and output from `offset` (at most `max_bytes`,
    /// 0 meaning 1 MiB). A command whose supervisor no longer has it answers its recorded end.
    pub async fn command_status(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        offset: u64,
        max_bytes: u64,
    ) -> Result<(CommandView, bool), StoreError> {
        let lease = self.owned_lease(claim, id)?;
        let request = SupervisorRequest::Status {
            command_id: id.to_owned(),
            claim: tuple_of(&claim.rc),
            offset,
            max_bytes,
        };
        let target = self.supervisor_target(&claim.observed)?;
        match self.supervisor_call(&target, &request).await {
            Ok(SupervisorReply::Status(view)) => Ok((view, lease.detached)),
            Ok(SupervisorReply::Error(error))
                if error.code == HelperCode::NotFound
                    && let Some(view) = leases::view_of_ended(&lease) =>
            {
                Ok((view, lease.detached))
            }
            Ok(SupervisorReply::Error(error)) => Err(refusal(&claim.rc.env.id, error.code)),
            Ok(_) => Err(unreachable(&claim.rc.env.id)),
            Err(error) => match leases::view_of_ended(&lease) {
                Some(view) => Ok((view, lease.detached)),
                None => Err(error),
            },
        }
    }

    /// `FollowCommand`: the command's output from `offset` live, then its end.
    pub async fn follow_command(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        offset: u64,
    ) -> Result<CommandFollow, StoreError> {
        self.owned_lease(claim, id)?;
        let env = claim.rc.env.id.clone();
        let target = self.supervisor_target(&claim.observed)?;
        let mut session = self.session(&target).await?;
        let request = SupervisorRequest::Follow {
            command_id: id.to_owned(),
            claim: tuple_of(&claim.rc),
            offset,
        };
        session
            .send(&request)
            .await
            .map_err(|_| unreachable(&env))?;
        Ok(CommandFollow {
            session,
            env,
            done: false,
        })
    }

    /// `WriteCommandStdin`: queues `data` (and closes stdin when `close`); answers the bytes
    /// accepted and whether stdin is still open.
    pub async fn write_command_stdin(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        data: Vec<u8>,
        close: bool,
    ) -> Result<(u64, bool), StoreError> {
        self.owned_lease(claim, id)?;
        let request = SupervisorRequest::Stdin {
            command_id: id.to_owned(),
            claim: tuple_of(&claim.rc),
            data,
            close,
        };
        let target = self.supervisor_target(&claim.observed)?;
        let reply = self.supervisor_call(&target, &request).await?;
        super::command_terminal::stdin_answer(&claim.rc.env.id, reply)
    }

    /// `SignalCommand`: sends `signal` to the command's process group (no write; the end,
    /// should it follow, is recorded by the next write that touches the commands).
    pub async fn signal_command(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        signal: CommandSignal,
    ) -> Result<CommandView, StoreError> {
        self.owned_lease(claim, id)?;
        let target = self.supervisor_target(&claim.observed)?;
        let env = &claim.rc.env.id;
        let request = SupervisorRequest::Signal {
            command_id: id.to_owned(),
            claim: tuple_of(&claim.rc),
            signal,
        };
        match self.supervisor_call(&target, &request).await? {
            SupervisorReply::Ok {} => {}
            SupervisorReply::Error(error) => return Err(refusal(env, error.code)),
            _ => return Err(unreachable(env)),
        }
        Ok(self.command_status(claim, id, 0, 1).await?.0)
    }

    /// `ListCommands`: the claim's commands, newest last, at most `limit` (0: 64), without
    /// output. A claim without leases costs no supervisor call.
    pub async fn list_commands(
        &self,
        claim: &ValidatedClaim,
        limit: usize,
    ) -> Result<Vec<ListedCommand>, StoreError> {
        let limit = if limit == 0 {
            MAX_LIST
        } else {
            limit.min(MAX_LIST)
        };
        let owned: Vec<CommandLease> = claim
            .observed
            .status
            .iter()
            .flat_map(|s| s.commands.iter())
            .filter(|l| leases::owned_by(l, &claim.rc))
            .cloned()
            .collect();
        let skip = owned.len().saturating_sub(limit);
        let owned = &owned[skip..];
        if owned.is_empty() {
            return Ok(Vec::new());
        }
        let views = if owned.iter().any(CommandLease::is_open) {
            let target = self.supervisor_target(&claim.observed)?;
            let request = SupervisorRequest::List {
                claim: tuple_of(&claim.rc),
                limit: MAX_LIST as u64,
            };
            match self.supervisor_call(&target, &request).await? {
                SupervisorReply::StatusList { commands } => commands,
                SupervisorReply::Error(error) => {
                    return Err(refusal(&claim.rc.env.id, error.code));
                }
                _ => return Err(unreachable(&claim.rc.env.id)),
            }
        } else {
            Vec::new()
        };
        Ok(owned
            .iter()
            .map(|lease| {
                let view = views
                    .iter()
                    .find(|v| v.command_id == lease.id)
                    .cloned()
                    .or_else(|| leases::view_of_ended(lease))
                    .unwrap_or_else(|| CommandView {
                        command_id: lease.id.clone(),
                        ..CommandView::default()
                    });
                ListedCommand {
                    view,
                    detached: lease.detached,
                }
            })
            .collect())
    }

    fn owned_lease(&self, claim: &ValidatedClaim, id: &str) -> Result<CommandLease, StoreError> {
        find_owned(&claim.observed, id, &claim.rc)
            .cloned()
            .ok_or_else(|| not_found(&claim.rc.env.id))
    }
}

/// A supervisor's refusal as the API's code: an id it does not know for this claim is
/// `command_not_found`, an ended command (or closed stdin, or no terminal) `command_ended`,
/// a bad offset or chunk INVALID_ARGUMENT.
pub(super) fn refusal(env: &str, code: HelperCode) -> StoreError {
    match code {
        HelperCode::NotFound => not_found(env),
        HelperCode::Conflict => StoreError::command(env, ErrorCode::CommandEnded, "command ended"),
        HelperCode::InvalidArgument => {
            StoreError::InvalidArgument("request refused by the supervisor")
        }
        HelperCode::ResourceExhausted => StoreError::ResourceExhausted {
            env: env.to_owned(),
            reason: "supervisor bound reached",
        },
        _ => unreachable(env),
    }
}
