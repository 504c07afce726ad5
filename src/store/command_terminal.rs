//! Interactive commands (docs/commands.md §5.3, §8.1): resizing a command's terminal, and the
//! two supervisor sessions of an `AttachCommand`: a follow for its output and a control
//! session that carries its stdin, resizes and signals for the attach's whole life, so that a
//! keystroke costs one supervisor request and no new session.
//!
//! Read-only like [`super::command_reads`]: the claim is validated once (one GET, when the call
//! or the attach opens), the lease must belong to exactly that claim (a foreign or earlier claim
//! sees what an absent command looks like), and the supervisor checks the claim's tuple and
//! deadline again on every request. Nothing here writes to Kubernetes.

use super::command_leases::{find_owned, tuple_of};
use super::command_reads::{CommandFollow, refusal};
use super::commands::{not_found, unreachable};
use super::validate::ValidatedClaim;
use super::{Store, StoreError};
use crate::errors::ErrorCode;
use crate::executor::protocol::ErrorCode as HelperCode;
use crate::executor::supervisor_protocol::{
    ClaimTuple, CommandSignal, PtySize, SupervisorReply, SupervisorRequest,
};
use crate::executor::transport::{SupervisorSession, SupervisorTarget};

/// The stdin, resize and signal requests of one attached command, over one supervisor session
/// opened at the first of them (and again after it broke).
pub struct CommandControl {
    store: Store,
    target: SupervisorTarget,
    claim: ClaimTuple,
    command_id: String,
    session: Option<SupervisorSession>,
}

impl CommandControl {
    /// Queues `data` on the command's stdin (and closes it when `close`); answers the bytes
    /// accepted and whether stdin is still open.
    pub async fn stdin(&mut self, data: Vec<u8>, close: bool) -> Result<(u64, bool), StoreError> {
        let request = SupervisorRequest::Stdin {
            command_id: self.command_id.clone(),
            claim: self.claim.clone(),
            data,
            close,
        };
        let reply = self.call(&request).await?;
        stdin_answer(self.env(), reply)
    }

    /// Sets the command's terminal size.
    pub async fn resize(&mut self, size: PtySize) -> Result<(), StoreError> {
        let request = SupervisorRequest::Resize {
            command_id: self.command_id.clone(),
            claim: self.claim.clone(),
            size,
        };
        let reply = self.call(&request).await?;
        resize_answer(self.env(), reply)
    }

    /// Sends `signal` to the command's process group (and its terminal's foreground job).
    pub async fn signal(&mut self, signal: CommandSignal) -> Result<(), StoreError> {
        let request = SupervisorRequest::Signal {
            command_id: self.command_id.clone(),
            claim: self.claim.clone(),
            signal,
        };
        match self.call(&request).await? {
            SupervisorReply::Ok {} => Ok(()),
            SupervisorReply::Error(error) => Err(refusal(self.env(), error.code)),
            _ => Err(unreachable(self.env())),
        }
    }

    fn env(&self) -> &str {
        &self.target.executor.environment
    }

    /// One request over the control session; a session that broke is dropped (the next
    /// request opens another) and the request answers UNAVAILABLE.
    async fn call(&mut self, request: &SupervisorRequest) -> Result<SupervisorReply, StoreError> {
        let mut session = match self.session.take() {
            Some(session) => session,
            None => self.store.session(&self.target).await?,
        };
        match session.call(request).await {
            Ok(reply) => {
                self.session = Some(session);
                Ok(reply)
            }
            Err(error) => {
                tracing::warn!(env = self.env(), %error, "attach control session failed");
                Err(unreachable(self.env()))
            }
        }
    }
}

impl Store {
    /// `ResizeCommand`: sets the command's terminal size; the kernel tells its foreground job
    /// (SIGWINCH). No write.
    pub async fn resize_command(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        size: PtySize,
    ) -> Result<(), StoreError> {
        let env = &claim.rc.env.id;
        find_owned(&claim.observed, id, &claim.rc).ok_or_else(|| not_found(env))?;
        let target = self.supervisor_target(&claim.observed)?;
        let request = SupervisorRequest::Resize {
            command_id: id.to_owned(),
            claim: tuple_of(&claim.rc),
            size,
        };
        let reply = self.supervisor_call(&target, &request).await?;
        resize_answer(env, reply)
    }

    /// `AttachCommand`: the command's output from `offset` live (then its end), and the control
    /// of its stdin, terminal size and signals under the same claim.
    pub async fn attach_command(
        &self,
        claim: &ValidatedClaim,
        id: &str,
        offset: u64,
    ) -> Result<(CommandFollow, CommandControl), StoreError> {
        let follow = self.follow_command(claim, id, offset).await?;
        let control = CommandControl {
            store: self.clone(),
            target: self.supervisor_target(&claim.observed)?,
            claim: tuple_of(&claim.rc),
            command_id: id.to_owned(),
            session: None,
        };
        Ok((follow, control))
    }
}

/// A supervisor's answer to `stdin`: a full buffer is `stdin_full` (retryable).
pub(super) fn stdin_answer(env: &str, reply: SupervisorReply) -> Result<(u64, bool), StoreError> {
    match reply {
        SupervisorReply::Stdin { accepted, open } => Ok((accepted, open)),
        SupervisorReply::Error(error) if error.code == HelperCode::ResourceExhausted => Err(
            StoreError::command(env, ErrorCode::StdinFull, "stdin is full"),
        ),
        SupervisorReply::Error(error) => Err(refusal(env, error.code)),
        _ => Err(unreachable(env)),
    }
}

/// A supervisor's answer to `resize`: a command without a terminal, or one that has ended, is
/// `command_ended` (FAILED_PRECONDITION); a size out of range INVALID_ARGUMENT.
fn resize_answer(env: &str, reply: SupervisorReply) -> Result<(), StoreError> {
    match reply {
        SupervisorReply::Ok {} => Ok(()),
        SupervisorReply::Error(error) if error.code == HelperCode::Conflict => {
            Err(StoreError::command(
                env,
                ErrorCode::CommandEnded,
                "command has ended or has no terminal",
            ))
        }
        SupervisorReply::Error(error) => Err(refusal(env, error.code)),
        _ => Err(unreachable(env)),
    }
}
