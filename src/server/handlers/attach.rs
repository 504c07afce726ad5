//! `AttachCommand` (docs/commands.md §6): one bidirectional stream on one command. The first
//! input opens it (a `CommandQueryRequest`, authorized like every command call, as
//! `command.start`); later inputs carry stdin bytes, its close, terminal resizes and signals;
//! the answer is the command's output from the open's offset, live, then its end.
//!
//! Two tasks serve a session, both ended when its answer stream ends or is dropped: one follows
//! the output, one applies the inputs in order over one supervisor control session. Both hand
//! their events to the answer stream through one bounded queue. The session holds a slot of the
//! output-stream bound, never one of the unary limiter's.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status, Streaming};

use super::ProviderService;
use super::auth::refuse;
use super::commands::{
    MAX_STDIN_CHUNK, OutputEvents, offset_of, pty_size, query_well_formed, supervisor_signal,
};
use crate::api::pb;
use crate::api::pb::command_attach_input::Input;
use crate::errors::{ErrorCode, WireError};
use crate::server::command_convert;
use crate::server::limiter::Slot;
use crate::store::StoreError;
use crate::store::command_reads::CommandFollow;
use crate::store::command_terminal::CommandControl;

/// Events waiting for a slow caller before the output task waits too.
const ATTACH_QUEUE: usize = 16;
/// How often a stdin chunk the command's full buffer refused is offered again, and the pause
/// between offers: the session's back-pressure (its inputs wait meanwhile), 10 s at most.
const STDIN_FULL_OFFERS: u32 = 500;
const STDIN_FULL_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

type Event = Result<pb::CommandOutputEvent, Status>;

impl ProviderService {
    /// Opens the session: the first input must be `open`; its query is authorized as
    /// `command.start`, and a later `signal` input also needs the grant to allow
    /// `command.cancel` (as `SignalCommand` does).
    pub(super) async fn handle_attach_command(
        &self,
        mut request: Request<Streaming<pb::CommandAttachInput>>,
    ) -> Result<Response<OutputEvents>, Status> {
        self.client(&request)?;
        let first = request.get_mut().message().await?;
        let open = match first.and_then(|i| i.input) {
            Some(Input::Open(q)) => q,
            _ => return Err(refuse(ErrorCode::InvalidArgument)),
        };
        let ok = query_well_formed(&open);
        let claim = self
            .authorize_command_call(&request, open.context.as_ref(), "command.start", ok)
            .await?;
        let may_signal = self.grant_allows(&request, open.context.as_ref(), "command.cancel");
        // A stream holds a slot of its own bound, not one of the unary limiter's.
        let slot = self
            .streams
            .try_acquire(claim.caller_client())
            .ok_or_else(|| Status::from(WireError::retryable(ErrorCode::StreamLimit)))?;
        let (follow, control) = self
            .store
            .attach_command(&claim, &open.command_id, offset_of(open.offset))
            .await?;
        drop(claim);
        let inputs = request.into_inner();
        Ok(Response::new(attach_events(
            follow, control, inputs, may_signal, slot,
        )))
    }
}

/// Aborts its task when dropped: a session's tasks end with its answer stream.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What an answer stream holds while it is open.
struct Held {
    _output: AbortOnDrop,
    _input: AbortOnDrop,
    _slot: Slot,
}

/// The session's answer: the output task's events and the input task's refusal, in arrival
/// order, ending after the command's end or the first error.
fn attach_events(
    follow: CommandFollow,
    control: CommandControl,
    inputs: Streaming<pb::CommandAttachInput>,
    may_signal: bool,
    slot: Slot,
) -> OutputEvents {
    let (tx, rx) = mpsc::channel::<Event>(ATTACH_QUEUE);
    let held = Held {
        _output: AbortOnDrop(tokio::spawn(pump_output(follow, tx.clone()))),
        _input: AbortOnDrop(tokio::spawn(pump_input(inputs, control, may_signal, tx))),
        _slot: slot,
    };
    let events = futures::stream::unfold((rx, held, false), |(mut rx, held, ended)| async move {
        if ended {
            return None;
        }
        let event = rx.recv().await?;
        let last = match &event {
            Err(_) => true,
            Ok(e) => matches!(e.event, Some(pb::command_output_event::Event::End(_))),
        };
        Some((event, (rx, held, last)))
    });
    Box::pin(events)
}

/// Forwards the follow's events until the command's end (or the follow's failure).
async fn pump_output(mut follow: CommandFollow, tx: mpsc::Sender<Event>) {
    while let Some(event) = follow.next().await {
        let events: Vec<Event> = match event {
            Ok(event) => command_convert::follow_events(event, true)
                .into_iter()
                .map(Ok)
                .collect(),
            Err(error) => vec![Err(Status::from(error))],
        };
        for event in events {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// Applies the caller's inputs in order until they end. A refusal ends the session with its
/// code, except `command_ended` (the command's end, or its stdin closed): that only stops the
/// inputs, so that a keystroke racing the command's end never hides the end's status.
async fn pump_input(
    mut inputs: Streaming<pb::CommandAttachInput>,
    mut control: CommandControl,
    may_signal: bool,
    tx: mpsc::Sender<Event>,
) {
    while let Ok(Some(input)) = inputs.message().await {
        match apply(&mut control, input, may_signal).await {
            Ok(()) => {}
            Err(Refused::Ended) => return,
            Err(Refused::Status(status)) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        }
    }
}

/// Why an input was not applied.
enum Refused {
    /// The command has ended or its stdin is closed.
    Ended,
    /// Anything else, as the caller gets it.
    Status(Status),
}

impl From<StoreError> for Refused {
    fn from(error: StoreError) -> Self {
        if error.code() == ErrorCode::CommandEnded {
            Self::Ended
        } else {
            Self::Status(Status::from(error))
        }
    }
}

/// One input after the open: stdin (≤ 64 KiB), its close, a resize (1..=1000 each way), a
/// known signal the grant allows. A second `open`, an empty input or a bad value is
/// INVALID_ARGUMENT.
async fn apply(
    control: &mut CommandControl,
    input: pb::CommandAttachInput,
    may_signal: bool,
) -> Result<(), Refused> {
    let invalid = || Refused::Status(refuse(ErrorCode::InvalidArgument));
    match input.input {
        Some(Input::Stdin(data)) if data.len() <= MAX_STDIN_CHUNK => {
            write_stdin(control, data, false).await
        }
        Some(Input::CloseStdin(close)) => {
            if close {
                write_stdin(control, Vec::new(), true).await?;
            }
            Ok(())
        }
        Some(Input::Resize(size)) => {
            let size = pty_size(&size).ok_or_else(invalid)?;
            Ok(control.resize(size).await?)
        }
        Some(Input::Signal(signal)) => {
            let signal = supervisor_signal(signal).ok_or_else(invalid)?;
            if !may_signal {
                return Err(Refused::Status(refuse(ErrorCode::PermissionDenied)));
            }
            Ok(control.signal(signal).await?)
        }
        _ => Err(invalid()),
    }
}

/// Writes one stdin chunk, offering it again while the command's stdin buffer is full.
async fn write_stdin(
    control: &mut CommandControl,
    data: Vec<u8>,
    close: bool,
) -> Result<(), Refused> {
    let mut offers = 0;
    loop {
        match control.stdin(data.clone(), close).await {
            Err(error) if error.code() == ErrorCode::StdinFull && offers < STDIN_FULL_OFFERS => {
                offers += 1;
                tokio::time::sleep(STDIN_FULL_PAUSE).await;
            }
            answer => return answer.map(|_| ()).map_err(Refused::from),
        }
    }
}
