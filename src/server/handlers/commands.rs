//! The command-control RPCs of docs/commands.md §6, served by the executor supervisor through
//! the store: detached starts (on a terminal too), status, cancel, following output, stdin,
//! signals, terminal resizes and listing; `AttachCommand` is in [`super::attach`].
//!
//! Each runs the whole data-plane authorization chain read-only (context, grant, the durable
//! run claim) and checks the request's shape before the store acts; only a detached start and
//! a cancel write (their lease). Grants carry no new operation names: reads (status, follow,
//! list) are authorized as `command.status`, interaction (stdin, resize, attach) as
//! `command.start`, signals and cancel as `command.cancel`, so grants minted before these
//! RPCs keep working.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::refuse;
use crate::api::pb;
use crate::errors::{ErrorCode, WireError};
use crate::executor::supervisor_protocol::{CommandSignal, PtySize};
use crate::server::command_convert;
use crate::server::limiter::Slot;
use crate::store::command_reads::CommandFollow;
use crate::store::commands::SupervisedStart;
use crate::store::validate::ValidatedClaim;

/// The stream type of [`pb::CommandOutputEvent`] answers.
pub type OutputEvents =
    Pin<Box<dyn Stream<Item = Result<pb::CommandOutputEvent, Status>> + Send + 'static>>;

/// Largest stdin chunk one call may carry (docs/commands.md §6).
pub const MAX_STDIN_CHUNK: usize = 64 * 1024;
/// Largest `ListCommands` answer.
pub const MAX_LIST_COMMANDS: i32 = 64;
/// Largest PTY dimension.
pub const MAX_PTY_DIMENSION: u32 = 1000;

impl ProviderService {
    /// The read-only chain of one command-control call: context, grant for `operation`, the
    /// current run claim (one GET, no write); then `well_formed`, else INVALID_ARGUMENT.
    pub(super) async fn authorize_command_call<T>(
        &self,
        request: &Request<T>,
        context: Option<&pb::RequestContext>,
        operation: &str,
        well_formed: bool,
    ) -> Result<ValidatedClaim, Status> {
        let client = self.client(request)?;
        let (caller, rc) = self.data_plane_context(&client, context, operation)?;
        let policy = self.peer_policy(request, &client);
        let claim = self
            .store
            .validate_run_claim_under(&caller, &rc, policy)
            .await?;
        if !well_formed {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        Ok(claim)
    }

    /// Whether the caller's grant, as its context presents it, allows `operation` too (a local
    /// check of the grant's signature and operations; no read).
    pub(super) fn grant_allows<T>(
        &self,
        request: &Request<T>,
        context: Option<&pb::RequestContext>,
        operation: &str,
    ) -> bool {
        self.client(request)
            .is_ok_and(|client| self.data_plane_context(&client, context, operation).is_ok())
    }

    /// A `StartCommand` through the supervisor. With `detach`: the lease write, the
    /// supervisor's start, the id at once (with `pty`, on a terminal of that size). Without:
    /// what only the supervisor takes (variables, a working directory, a terminal, an
    /// operation id), run to its end on this call and answered with its retained output as a
    /// one-shot command's answer is.
    pub(super) async fn start_supervised_command(
        &self,
        claim: ValidatedClaim,
        r: &pb::CommandStartRequest,
    ) -> Result<Response<pb::CommandStartResponse>, Status> {
        let start = supervised_start(r, r.detach);
        let view = if r.detach {
            self.store.start_supervised(claim, start).await?
        } else {
            self.store.run_foreground(claim, start).await?
        };
        Ok(start_answer(&view, r.detach))
    }

    pub(super) async fn handle_command_status(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        let r = request.get_ref();
        let ok = query_well_formed(r);
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.status", ok)
            .await?;
        let (offset, max) = (offset_of(r.offset), u64::try_from(r.max_bytes).unwrap_or(0));
        let (view, detached) = self
            .store
            .command_status(&claim, &r.command_id, offset, max)
            .await?;
        Ok(Response::new(command_convert::command_view(
            &view, detached,
        )))
    }

    pub(super) async fn handle_cancel_command(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        let r = request.get_ref();
        let ok = query_well_formed(r);
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.cancel", ok)
            .await?;
        let grace = Duration::from_millis(u64::from(r.grace_millis));
        let view = self
            .store
            .cancel_command(claim, &r.command_id, grace)
            .await?;
        Ok(Response::new(command_convert::listed(&view, true)))
    }

    pub(super) async fn handle_follow_command(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<OutputEvents>, Status> {
        let r = request.get_ref();
        let ok = query_well_formed(r);
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.status", ok)
            .await?;
        // A stream holds a slot of its own bound, not one of the unary limiter's.
        let slot = self
            .streams
            .try_acquire(claim.caller_client())
            .ok_or_else(|| Status::from(WireError::retryable(ErrorCode::StreamLimit)))?;
        let follow = self
            .store
            .follow_command(&claim, &r.command_id, offset_of(r.offset))
            .await?;
        drop(claim);
        Ok(Response::new(output_events(follow, slot)))
    }

    pub(super) async fn handle_write_command_stdin(
        &self,
        request: Request<pb::CommandStdinRequest>,
    ) -> Result<Response<pb::CommandStdinResponse>, Status> {
        let r = request.get_ref();
        let ok = valid_command_id(&r.command_id) && r.data.len() <= MAX_STDIN_CHUNK;
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.start", ok)
            .await?;
        let (accepted, open) = self
            .store
            .write_command_stdin(&claim, &r.command_id, r.data.clone(), r.close)
            .await?;
        Ok(Response::new(pb::CommandStdinResponse {
            accepted_bytes: i64::try_from(accepted).unwrap_or(i64::MAX),
            stdin_open: open,
        }))
    }

    pub(super) async fn handle_signal_command(
        &self,
        request: Request<pb::CommandSignalRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        let r = request.get_ref();
        let signal = supervisor_signal(r.signal);
        let ok = valid_command_id(&r.command_id) && signal.is_some();
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.cancel", ok)
            .await?;
        let signal = signal.ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        let view = self
            .store
            .signal_command(&claim, &r.command_id, signal)
            .await?;
        Ok(Response::new(command_convert::listed(&view, true)))
    }

    /// `ResizeCommand`: read-only like stdin and signals (no status write).
    pub(super) async fn handle_resize_command(
        &self,
        request: Request<pb::CommandResizeRequest>,
    ) -> Result<Response<()>, Status> {
        let r = request.get_ref();
        let size = pty_size(&pb::PtySize {
            rows: r.rows,
            cols: r.cols,
        });
        let ok = valid_command_id(&r.command_id) && size.is_some();
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.start", ok)
            .await?;
        let size = size.ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        self.store
            .resize_command(&claim, &r.command_id, size)
            .await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_list_commands(
        &self,
        request: Request<pb::ListCommandsRequest>,
    ) -> Result<Response<pb::ListCommandsResponse>, Status> {
        let r = request.get_ref();
        let ok = (0..=MAX_LIST_COMMANDS).contains(&r.limit);
        let claim = self
            .authorize_command_call(&request, r.context.as_ref(), "command.status", ok)
            .await?;
        let limit = usize::try_from(r.limit).unwrap_or(0);
        let listed = self.store.list_commands(&claim, limit).await?;
        Ok(Response::new(pb::ListCommandsResponse {
            commands: listed
                .iter()
                .map(|c| command_convert::listed(&c.view, c.detached))
                .collect(),
        }))
    }
}

/// Most output streams (`FollowCommand`, `AttachCommand`) one replica serves at once, and per
/// client.
pub const MAX_COMMAND_STREAMS: usize = 256;
/// See [`MAX_COMMAND_STREAMS`].
pub const MAX_COMMAND_STREAMS_PER_CLIENT: usize = 64;

/// The wire events of a follow, holding its stream slot until the stream ends or is dropped.
fn output_events(follow: CommandFollow, slot: Slot) -> OutputEvents {
    let events = futures::stream::unfold(
        (follow, slot, std::collections::VecDeque::new()),
        |(mut follow, slot, mut pending)| async move {
            loop {
                if let Some(event) = pending.pop_front() {
                    return Some((Ok(event), (follow, slot, pending)));
                }
                match follow.next().await? {
                    Ok(event) => pending.extend(command_convert::follow_events(event, true)),
                    Err(error) => return Some((Err(Status::from(error)), (follow, slot, pending))),
                }
            }
        },
    );
    Box::pin(events)
}

pub(super) fn offset_of(offset: i64) -> u64 {
    u64::try_from(offset).unwrap_or(0)
}

pub(super) fn supervisor_signal(signal: i32) -> Option<CommandSignal> {
    match pb::CommandSignal::try_from(signal) {
        Ok(pb::CommandSignal::Int) => Some(CommandSignal::Int),
        Ok(pb::CommandSignal::Term) => Some(CommandSignal::Term),
        Ok(pb::CommandSignal::Kill) => Some(CommandSignal::Kill),
        Ok(pb::CommandSignal::Hup) => Some(CommandSignal::Hup),
        _ => None,
    }
}

/// Most variables one command may carry, and their bounds (docs/commands.md §4.4).
pub const MAX_ENV_VARS: usize = 64;
const MAX_ENV_NAME: usize = 128;
const MAX_ENV_VALUE: usize = 32 * 1024;
const MAX_ENV_TOTAL: usize = 64 * 1024;
const MAX_WORKING_DIRECTORY: usize = 4096;

/// The start options beyond today's foreground command: variables (count, names, sizes), a
/// working directory that is relative and stays inside the workspace, a PTY size.
pub(super) fn start_options_well_formed(r: &pb::CommandStartRequest) -> bool {
    let total: usize = r.env.iter().map(|v| v.name.len() + v.value.len()).sum();
    r.env.len() <= MAX_ENV_VARS
        && total <= MAX_ENV_TOTAL
        && r.env
            .iter()
            .all(|v| env_name_ok(&v.name) && v.value.len() <= MAX_ENV_VALUE)
        && working_directory_ok(&r.working_directory)
        && r.pty.as_ref().is_none_or(|p| pty_size_ok(p.rows, p.cols))
        && (r.operation_id.is_empty() || crate::server::validate::valid_id(&r.operation_id))
}

/// The supervisor's start of `r`.
fn supervised_start(r: &pb::CommandStartRequest, detached: bool) -> SupervisedStart {
    SupervisedStart {
        detached,
        command: r.command.clone(),
        env: r
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect(),
        working_dir: r.working_directory.clone(),
        timeout_ms: u64::try_from(r.timeout_millis).unwrap_or(0),
        stdin: r.open_stdin,
        pty: r.pty.as_ref().and_then(pty_size),
        operation_id: (!r.operation_id.is_empty()).then(|| r.operation_id.clone()),
    }
}

/// A `StartCommand` answer from the supervisor's view of the command.
fn start_answer(
    view: &crate::executor::supervisor_protocol::CommandView,
    detached: bool,
) -> Response<pb::CommandStartResponse> {
    let status = command_convert::command_view(view, detached);
    Response::new(pb::CommandStartResponse {
        command_id: view.command_id.clone(),
        state: status.state,
        result: Some(status),
    })
}

/// Whether the start asks for more than a one-shot foreground command.
pub(super) fn needs_supervisor(r: &pb::CommandStartRequest) -> bool {
    r.detach
        || !r.env.is_empty()
        || !r.working_directory.is_empty()
        || r.open_stdin
        || r.pty.is_some()
        || !r.operation_id.is_empty()
}

fn env_name_ok(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_ENV_NAME
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Empty (the root) or a relative path of normal components: no `..`, no root, no NUL.
fn working_directory_ok(dir: &str) -> bool {
    dir.len() <= MAX_WORKING_DIRECTORY
        && !dir.contains('\0')
        && !dir.starts_with('/')
        && dir.split('/').all(|c| c != "..")
}

/// A command id as the store mints and the supervisor accepts: 1..=128 bytes of
/// `[A-Za-z0-9._:-]` (docs/commands.md §3).
pub(super) fn valid_command_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A command id and a non-negative offset and bound.
pub(super) fn query_well_formed(r: &pb::CommandQueryRequest) -> bool {
    valid_command_id(&r.command_id) && r.offset >= 0 && r.max_bytes >= 0 && r.grace_millis <= 60_000
}

pub(super) fn pty_size_ok(rows: u32, cols: u32) -> bool {
    (1..=MAX_PTY_DIMENSION).contains(&rows) && (1..=MAX_PTY_DIMENSION).contains(&cols)
}

/// A terminal size in range as the supervisor takes it.
pub(super) fn pty_size(size: &pb::PtySize) -> Option<PtySize> {
    if !pty_size_ok(size.rows, size.cols) {
        return None;
    }
    Some(PtySize {
        rows: u16::try_from(size.rows).ok()?,
        cols: u16::try_from(size.cols).ok()?,
    })
}
