//! The command-control RPCs of docs/commands.md §6 that need the executor supervisor:
//! following output, stdin, signals, resize, listing and interactive sessions.
//!
//! Each runs the whole data-plane authorization chain read-only (context, grant, the durable
//! run claim) and checks the request's shape, so a caller learns its credentials are good
//! and its request well formed; then it answers UNIMPLEMENTED, having changed nothing, until
//! the supervisor is reachable from the store. Grants carry no new operation names: reads
//! (follow, list) are authorized as `command.status`, interaction (stdin, resize, attach) as
//! `command.start`, signals as `command.cancel`, so grants minted before these RPCs keep
//! working.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::ProviderService;
use super::auth::refuse;
use crate::api::pb;
use crate::errors::ErrorCode;

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
    /// current run claim; then `well_formed`, else INVALID_ARGUMENT.
    async fn authorize_command_call<T>(
        &self,
        request: &Request<T>,
        context: Option<&pb::RequestContext>,
        operation: &str,
        well_formed: bool,
    ) -> Result<(), Status> {
        let client = self.client(request)?;
        let (caller, rc) = self.data_plane_context(&client, context, operation)?;
        let policy = self.peer_policy(request, &client);
        self.store
            .validate_run_claim_under(&caller, &rc, policy)
            .await?;
        if !well_formed {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        Ok(())
    }

    pub(super) async fn handle_follow_command(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<OutputEvents>, Status> {
        let r = request.get_ref();
        let ok = query_well_formed(r);
        self.authorize_command_call(&request, r.context.as_ref(), "command.status", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
    }

    pub(super) async fn handle_write_command_stdin(
        &self,
        request: Request<pb::CommandStdinRequest>,
    ) -> Result<Response<pb::CommandStdinResponse>, Status> {
        let r = request.get_ref();
        let ok = valid_command_id(&r.command_id) && r.data.len() <= MAX_STDIN_CHUNK;
        self.authorize_command_call(&request, r.context.as_ref(), "command.start", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
    }

    pub(super) async fn handle_signal_command(
        &self,
        request: Request<pb::CommandSignalRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        let r = request.get_ref();
        let ok = valid_command_id(&r.command_id) && known_signal(r.signal);
        self.authorize_command_call(&request, r.context.as_ref(), "command.cancel", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
    }

    pub(super) async fn handle_resize_command(
        &self,
        request: Request<pb::CommandResizeRequest>,
    ) -> Result<Response<()>, Status> {
        let r = request.get_ref();
        let ok = valid_command_id(&r.command_id) && pty_size_ok(r.rows, r.cols);
        self.authorize_command_call(&request, r.context.as_ref(), "command.start", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
    }

    pub(super) async fn handle_list_commands(
        &self,
        request: Request<pb::ListCommandsRequest>,
    ) -> Result<Response<pb::ListCommandsResponse>, Status> {
        let r = request.get_ref();
        let ok = (0..=MAX_LIST_COMMANDS).contains(&r.limit);
        self.authorize_command_call(&request, r.context.as_ref(), "command.status", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
    }

    /// The first input must open the session; its query is authorized like a follow.
    pub(super) async fn handle_attach_command(
        &self,
        mut request: Request<Streaming<pb::CommandAttachInput>>,
    ) -> Result<Response<OutputEvents>, Status> {
        self.client(&request)?;
        let first = request.get_mut().message().await?;
        let open = match first.and_then(|i| i.input) {
            Some(pb::command_attach_input::Input::Open(q)) => q,
            _ => return Err(refuse(ErrorCode::InvalidArgument)),
        };
        let ok = query_well_formed(&open);
        self.authorize_command_call(&request, open.context.as_ref(), "command.start", ok)
            .await?;
        Err(refuse(ErrorCode::Unimplemented))
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
}

/// Whether the start asks for more than a one-shot foreground command.
pub(super) fn needs_supervisor(r: &pb::CommandStartRequest) -> bool {
    r.detach
        || !r.env.is_empty()
        || !r.working_directory.is_empty()
        || r.open_stdin
        || r.pty.is_some()
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

fn known_signal(signal: i32) -> bool {
    matches!(
        pb::CommandSignal::try_from(signal),
        Ok(pb::CommandSignal::Int
            | pb::CommandSignal::Term
            | pb::CommandSignal::Kill
            | pb::CommandSignal::Hup)
    )
}

pub(super) fn pty_size_ok(rows: u32, cols: u32) -> bool {
    (1..=MAX_PTY_DIMENSION).contains(&rows) && (1..=MAX_PTY_DIMENSION).contains(&cols)
}
