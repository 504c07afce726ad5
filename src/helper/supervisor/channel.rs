//! One connection to the supervisor (docs/commands.md §4.3): the hello, enrollment, tag
//! verification of every request, tagged replies, and the follow stream.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::journal::CommandEntry;
use super::service::Supervisor;
use crate::executor::protocol::{ErrorCode, ExecutorError, decode_strict};
use crate::executor::supervisor_protocol::{
    Binding, ClaimTuple, Direction, Hello, MAX_FOLLOWERS_PER_COMMAND, MAX_FRAME, MAX_STATUS_BYTES,
    PROTOCOL_VERSION, SupervisorReply, SupervisorRequest, TAG_LEN, parse_secret, read_frame,
    secret_id, write_frame,
};

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
