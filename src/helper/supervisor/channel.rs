//! One connection to the supervisor (docs/commands.md §4.3): the hello, enrollment, tag
//! verification of every request, tagged replies, and the follow stream.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::helper_call::{self, CallEvent};
use super::journal::CommandEntry;
use super::service::Supervisor;
use crate::executor::protocol::{ErrorCode, ExecutorError, MAX_JSON_BODY, decode_strict};
use crate::executor::supervisor_protocol::{
    Binding, ClaimTuple, Direction, Hello, MAX_CALL_CHUNK, MAX_FOLLOWERS_PER_COMMAND, MAX_FRAME,
    MAX_STATUS_BYTES, PROTOCOL_VERSION, SupervisorReply, SupervisorRequest, TAG_LEN, parse_secret,
    read_frame, secret_id, write_frame,
};
use crate::executor::supervisor_protocol::{JournalEntry, operation_receipt};

/// The writing side of a connection: numbers and tags every reply.
struct Replies<W> {
    writer: W,
    binding: Binding,
    index: u64,
}

impl<W: AsyncWrite + Unpin> Replies<W> {
    async fn tagged(&mut self, secret: &[u8; 32], reply: &SupervisorReply) -> bool {
        let body = serde_json::to_vec(reply).expect("replies encode");
        let tag = self
            .binding
            .tag(secret, Direction::Reply, self.index, &body);
        self.index += 1;
        write_frame(&mut self.writer, &[&tag, &body]).await.is_ok()
    }

    /// A reply nobody can verify: always an error, and the connection ends after it.
    async fn untagged(&mut self, code: ErrorCode, message: &str) {
        let reply = SupervisorReply::Error(ExecutorError::new(code, message));
        let body = serde_json::to_vec(&reply).expect("replies encode");
        let _ = write_frame(&mut self.writer, &[&[0u8; TAG_LEN], &body]).await;
    }
}

/// Serves one connection until either side ends it.
pub async fn serve(
    supervisor: Arc<Supervisor>,
    reader: impl AsyncRead + Unpin,
    writer: impl AsyncWrite + Unpin,
) {
    let mut nonce = [0u8; 32];
    supervisor.runtime.ids.fill(&mut nonce);
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        boot_id: hex::encode(supervisor.boot_id),
        nonce: hex::encode(nonce),
        secret_id: supervisor
            .secret()
            .map(|s| secret_id(&s))
            .unwrap_or_default(),
    };
    let mut replies = Replies {
        writer,
        binding: Binding {
            boot_id: supervisor.boot_id.to_vec(),
            nonce: nonce.to_vec(),
        },
        index: 0,
    };
    let body = serde_json::to_vec(&hello).expect("hello encodes");
    if write_frame(&mut replies.writer, &[&body]).await.is_err() {
        return;
    }
    let mut reader = reader;
    let mut index = 0u64;
    loop {
        let frame = match read_frame(&mut reader, MAX_FRAME).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(_) => {
                replies
                    .untagged(ErrorCode::InvalidArgument, "malformed frame")
                    .await;
                return;
            }
        };
        if frame.len() < TAG_LEN {
            replies
                .untagged(ErrorCode::Unauthenticated, "request is not authenticated")
                .await;
            return;
        }
        let (tag, body) = frame.split_at(TAG_LEN);
        let Some(secret) = authenticate(&supervisor, &replies.binding, index, tag, body) else {
            replies
                .untagged(ErrorCode::Unauthenticated, "request is not authenticated")
                .await;
            return;
        };
        index += 1;
        let request = match decode_strict::<SupervisorRequest>(body) {
            Ok(request) => request,
            Err(_) => {
                let reply = SupervisorReply::Error(ExecutorError::new(
                    ErrorCode::InvalidArgument,
                    "malformed request",
                ));
                if !replies.tagged(&secret, &reply).await {
                    return;
                }
                continue;
            }
        };
        let reply = match request {
            SupervisorRequest::Enroll { secret: offered } => {
                match parse_secret(&offered).filter(|s| supervisor.enroll(*s)) {
                    Some(_) => SupervisorReply::Enrolled {
                        boot_id: hex::encode(supervisor.boot_id),
                    },
                    None => SupervisorReply::Error(ExecutorError::new(
                        ErrorCode::Unauthenticated,
                        "supervisor is enrolled with another secret",
                    )),
                }
            }
            SupervisorRequest::Call {
                request_bytes,
                hold_stdin,
                operation_id,
            } => {
                let mut requests = Requests {
                    reader: &mut reader,
                    index,
                };
                call(
                    &supervisor,
                    &secret,
                    &mut replies,
                    &mut requests,
                    request_bytes,
                    (hold_stdin, operation_id),
                )
                .await;
                return;
            }
            SupervisorRequest::Follow {
                command_id,
                claim,
                offset,
            } => {
                follow(
                    &supervisor,
                    &secret,
                    &mut replies,
                    &mut reader,
                    &command_id,
                    &claim,
                    offset,
                )
                .await;
                return;
            }
            other => supervisor.handle(other).await,
        };
        if !replies.tagged(&secret, &reply).await {
            return;
        }
    }
}

/// The secret the request's tag verifies with: the pinned one, or, before enrollment, the one
/// an `enroll` request offers (the only request accepted then).
fn authenticate(
    supervisor: &Supervisor,
    binding: &Binding,
    index: u64,
    tag: &[u8],
    body: &[u8],
) -> Option<[u8; 32]> {
    let secret = match supervisor.secret() {
        Some(secret) => secret,
        None => match decode_strict::<SupervisorRequest>(body).ok()? {
            SupervisorRequest::Enroll { secret } => parse_secret(&secret)?,
            _ => return None,
        },
    };
    binding
        .verify(&secret, Direction::Request, index, body, tag)
        .then_some(secret)
}

/// The reading side of a connection after its first request: verifies each further frame.
struct Requests<'a, R> {
    reader: &'a mut R,
    index: u64,
}

impl<R: AsyncRead + Unpin> Requests<'_, R> {
    /// The next request, verified with `secret`; `None` at the end of the stream or for a
    /// frame that is not a verified request.
    async fn next(
        &mut self,
        supervisor: &Supervisor,
        binding: &Binding,
    ) -> Option<SupervisorRequest> {
        let frame = read_frame(&mut *self.reader, MAX_FRAME).await.ok()??;
        if frame.len() < TAG_LEN {
            return None;
        }
        let (tag, body) = frame.split_at(TAG_LEN);
        let secret = supervisor.secret()?;
        if !binding.verify(&secret, Direction::Request, self.index, body, tag) {
            return None;
        }
        self.index += 1;
        decode_strict(body).ok()
    }
}

/// A `call`: reads its request from `call_input` frames, runs the one-shot helper in this
/// environment, and streams its output and end; anything more from the client, or its end,
/// closes the helper's stdin.
async fn call<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    supervisor: &Supervisor,
    secret: &[u8; 32],
    replies: &mut Replies<W>,
    requests: &mut Requests<'_, R>,
    request_bytes: u64,
    (hold_stdin, operation_id): (bool, Option<String>),
) {
    let Some(length) = usize::try_from(request_bytes)
        .ok()
        .filter(|l| *l <= MAX_JSON_BODY)
    else {
        let reply = SupervisorReply::Error(ExecutorError::new(
            ErrorCode::ResourceExhausted,
            "request is too large",
        ));
        replies.tagged(secret, &reply).await;
        return;
    };
    let mut request = Vec::with_capacity(length);
    while request.len() < length {
        let binding = replies.binding.clone();
        match requests.next(supervisor, &binding).await {
            Some(SupervisorRequest::CallInput { data })
                if data.len() <= MAX_CALL_CHUNK && request.len() + data.len() <= length =>
            {
                request.extend_from_slice(&data);
            }
            _ => {
                replies
                    .untagged(ErrorCode::InvalidArgument, "malformed call")
                    .await;
                return;
            }
        }
    }
    let cancel = helper_call::canceller();
    let journaled = match operation_id {
        None => None,
        Some(id) => match supervisor.begin_call(&id, cancel.clone()) {
            Ok(()) => Some(JournaledCall {
                supervisor,
                id,
                answer: Vec::new(),
            }),
            Err(error) => {
                replies.tagged(secret, &SupervisorReply::Error(error)).await;
                return;
            }
        },
    };
    let helper = &supervisor.helper;
    let started = helper_call::start(
        helper,
        &supervisor.root,
        supervisor.reaper_pids(),
        request,
        (hold_stdin, cancel),
    );
    let run = match started {
        Ok(run) => run,
        Err(error) => {
            if let Some(call) = journaled {
                call.refused();
            }
            replies.tagged(secret, &SupervisorReply::Error(error)).await;
            return;
        }
    };
    relay_call(run, journaled, secret, replies, requests).await;
}

/// Relays a started call's output and end to the client, journaling its outcome when it runs
/// under an operation id. The call runs to its end even when the client went away (its stdin
/// is then closed), so that its outcome is journaled.
async fn relay_call<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut run: helper_call::CallRun,
    mut journaled: Option<JournaledCall<'_>>,
    secret: &[u8; 32],
    replies: &mut Replies<W>,
    requests: &mut Requests<'_, R>,
) {
    let mut probe = [0u8; 1];
    let mut listening = true;
    let mut connected = true;
    loop {
        tokio::select! {
            event = run.events.recv() => match event {
                Some(CallEvent::Output(data)) => {
                    if let Some(call) = journaled.as_mut() {
                        call.answer.extend_from_slice(&data);
                    }
                    let reply = SupervisorReply::CallOutput { data };
                    if connected && !replies.tagged(secret, &reply).await {
                        connected = false;
                        run.cancel();
                    }
                    if !connected && journaled.is_none() {
                        return;
                    }
                }
                Some(CallEvent::Ended { exit_code, stderr }) => {
                    if let Some(call) = journaled.take() {
                        call.ended(exit_code);
                    }
                    let reply = SupervisorReply::CallEnded {
                        exit_code,
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    };
                    if connected {
                        replies.tagged(secret, &reply).await;
                    }
                    return;
                }
                None => return,
            },
            _ = requests.reader.read(&mut probe), if listening => {
                listening = false;
                run.cancel();
            }
        }
    }
}

/// A call journaled under an operation id: its answer so far, and its outcome once it ended.
/// Dropped without an end (the helper's events stopped), the outcome is journaled unproven.
struct JournaledCall<'a> {
    supervisor: &'a Supervisor,
    id: String,
    answer: Vec<u8>,
}

impl JournaledCall<'_> {
    /// The helper could not be started: nothing ran.
    fn refused(mut self) {
        let stone = call_outcome(&self.id, None, &[]);
        self.supervisor.finish_call(JournalEntry {
            never_started: true,
            ..stone
        });
        self.id.clear();
    }

    /// The helper exited with `exit_code`.
    fn ended(mut self, exit_code: i32) {
        let stone = call_outcome(&self.id, Some(exit_code), &self.answer);
        self.supervisor.finish_call(stone);
        self.id.clear();
    }
}

impl Drop for JournaledCall<'_> {
    fn drop(&mut self) {
        if !self.id.is_empty() {
            self.supervisor
                .finish_call(call_outcome(&self.id, None, &[]));
        }
    }
}

/// The journal entry of a call that ended: proven only when the helper exited 0 with exactly
/// one answer whose outcome is known (a command's answer carries its terminal receipt, a
/// refusal is not `fence_unknown`); its receipt binds that whole answer.
fn call_outcome(id: &str, exit_code: Option<i32>, answer: &[u8]) -> JournalEntry {
    use crate::executor::protocol::CommandState;
    let envelope = (exit_code == Some(0))
        .then(|| crate::executor::transport::decode_envelope(answer).ok())
        .flatten();
    let state = match envelope.and_then(|e| e.into_outcome()) {
        Some(Ok(response)) => match response.command {
            Some(command) if command.terminal_receipt.is_empty() => CommandState::FenceUnknown,
            Some(command) => command.state,
            None => CommandState::Succeeded,
        },
        Some(Err(error)) if error.code == ErrorCode::FenceUnknown => CommandState::FenceUnknown,
        Some(Err(_)) => CommandState::Failed,
        None => CommandState::FenceUnknown,
    };
    let proven = state != CommandState::FenceUnknown;
    JournalEntry {
        command_id: id.to_owned(),
        claim_id: String::new(),
        state,
        exit_code: exit_code.unwrap_or(-1),
        proven,
        terminal_receipt: if proven {
            operation_receipt(id, state, answer)
        } else {
            String::new()
        },
        never_started: false,
    }
}

/// Streams output from `offset` until the command ended and every byte was sent, then its
/// status; stops early when the client closes its side.
async fn follow<W: AsyncWrite + Unpin>(
    supervisor: &Supervisor,
    secret: &[u8; 32],
    replies: &mut Replies<W>,
    reader: &mut (impl AsyncRead + Unpin),
    command_id: &str,
    claim: &ClaimTuple,
    mut offset: u64,
) {
    let Some(entry) = supervisor.owned(command_id, claim) else {
        let reply =
            SupervisorReply::Error(ExecutorError::new(ErrorCode::NotFound, "command not found"));
        replies.tagged(secret, &reply).await;
        return;
    };
    if entry.followers.fetch_add(1, Ordering::SeqCst) >= MAX_FOLLOWERS_PER_COMMAND {
        entry.followers.fetch_sub(1, Ordering::SeqCst);
        let reply = SupervisorReply::Error(ExecutorError {
            retryable: true,
            ..ExecutorError::new(ErrorCode::ResourceExhausted, "too many followers")
        });
        replies.tagged(secret, &reply).await;
        return;
    }
    stream(&entry, secret, replies, reader, &mut offset).await;
    entry.followers.fetch_sub(1, Ordering::SeqCst);
}

async fn stream<W: AsyncWrite + Unpin>(
    entry: &CommandEntry,
    secret: &[u8; 32],
    replies: &mut Replies<W>,
    reader: &mut (impl AsyncRead + Unpin),
    offset: &mut u64,
) {
    let mut changes = entry.subscribe();
    let mut probe = [0u8; 1];
    loop {
        changes.borrow_and_update();
        let running = entry.is_running();
        let Some(view) = entry.view(*offset, MAX_STATUS_BYTES) else {
            let reply = SupervisorReply::Error(ExecutorError::new(
                ErrorCode::InvalidArgument,
                "offset is past the output",
            ));
            replies.tagged(secret, &reply).await;
            return;
        };
        if !view.chunks.is_empty() || view.dropped_bytes > 0 {
            *offset = view.next_offset;
            let reply = SupervisorReply::Output {
                chunks: view.chunks,
                dropped_bytes: view.dropped_bytes,
            };
            if !replies.tagged(secret, &reply).await {
                return;
            }
            continue;
        }
        if !running {
            replies.tagged(secret, &SupervisorReply::Status(view)).await;
            return;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            // Anything from the client (or its end) ends the follow.
            _ = reader.read(&mut probe) => return,
        }
    }
}
