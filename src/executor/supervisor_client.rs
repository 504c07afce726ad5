//! The provider's side of the supervisor channel (docs/commands.md §4): the handshake, tagging
//! of requests, and verification of every reply, over any byte stream (the supervisor's Unix
//! socket in `dev` and tests, a relay session over `pods/exec` in production).

use tokio::io::{AsyncRead, AsyncWrite};

use super::protocol::{ExecutorError, decode_strict};
use super::supervisor_protocol::{
    Binding, Direction, FrameError, Hello, MAX_FRAME, PROTOCOL_VERSION, SupervisorReply,
    SupervisorRequest, TAG_LEN, read_frame, secret_id, write_frame,
};

/// Why a supervisor exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The stream failed or a frame was over its bound.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream ended before a reply.
    #[error("the supervisor closed the connection")]
    Closed,
    /// The hello was malformed or of another protocol version.
    #[error("the supervisor's hello is not valid")]
    BadHello,
    /// The supervisor answered without a tag: it could not authenticate the request.
    #[error("the supervisor refused the request unauthenticated: {0:?}")]
    Untagged(Option<ExecutorError>),
    /// A reply's tag did not verify: it was not written by the enrolled supervisor.
    #[error("a reply failed authentication")]
    Forged,
    /// A verified reply did not decode.
    #[error("a reply did not decode: {0}")]
    Decode(String),
}

/// One authenticated connection.
pub struct SupervisorConnection<R, W> {
    reader: R,
    writer: W,
    hello: Hello,
    binding: Binding,
    secret: [u8; 32],
    request_index: u64,
    reply_index: u64,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> SupervisorConnection<R, W> {
    /// Reads the supervisor's hello; requests will be tagged with `secret`.
    pub async fn open(mut reader: R, writer: W, secret: [u8; 32]) -> Result<Self, ClientError> {
        let frame = read_frame(&mut reader, MAX_FRAME)
            .await?
            .ok_or(ClientError::Closed)?;
        let hello: Hello = decode_strict(&frame).map_err(|_| ClientError::BadHello)?;
        if hello.protocol != PROTOCOL_VERSION {
            return Err(ClientError::BadHello);
        }
        let binding = Binding::of(&hello).ok_or(ClientError::BadHello)?;
        Ok(Self {
            reader,
            writer,
            hello,
            binding,
            secret,
            request_index: 0,
            reply_index: 0,
        })
    }

    /// The supervisor's hello.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Whether the supervisor says it is enrolled with this connection's secret.
    pub fn enrolled_with_our_secret(&self) -> bool {
        self.hello.secret_id == secret_id(&self.secret)
    }

    /// Sends one tagged request.
    pub async fn send(&mut self, request: &SupervisorRequest) -> Result<(), ClientError> {
        let body = serde_json::to_vec(request).expect("requests encode");
        let tag = self
            .binding
            .tag(&self.secret, Direction::Request, self.request_index, &body);
        self.request_index += 1;
        write_frame(&mut self.writer, &[&tag, &body]).await?;
        Ok(())
    }

    /// The next verified reply; `None` when the supervisor closed the connection.
    pub async fn next_reply(&mut self) -> Result<Option<SupervisorReply>, ClientError> {
        next_verified(
            &mut self.reader,
            &self.binding,
            &self.secret,
            &mut self.reply_index,
        )
        .await
    }

    /// Splits the connection into its verified replies and its writing side (to close it,
    /// which cancels a `call` or ends a `follow`, while replies are still read).
    pub fn split(self) -> (ReplyReader<R>, W) {
        let replies = ReplyReader {
            reader: self.reader,
            binding: self.binding,
            secret: self.secret,
            reply_index: self.reply_index,
        };
        (replies, self.writer)
    }

    /// Sends `request` and returns its reply.
    pub async fn call(
        &mut self,
        request: &SupervisorRequest,
    ) -> Result<SupervisorReply, ClientError> {
        self.send(request).await?;
        self.next_reply().await?.ok_or(ClientError::Closed)
    }

    /// Enrolls this connection's secret (idempotent for the same secret).
    pub async fn enroll(&mut self) -> Result<SupervisorReply, ClientError> {
        let request = SupervisorRequest::Enroll {
            secret: hex::encode(self.secret),
        };
        self.call(&request).await
    }

    /// The same connection over boxed stream halves, so that sessions over different streams
    /// (a Unix socket, a relay session) have one type.
    pub fn boxed(
        self,
    ) -> SupervisorConnection<Box<dyn AsyncRead + Send + Unpin>, Box<dyn AsyncWrite + Send + Unpin>>
    where
        R: Send + 'static,
        W: Send + 'static,
    {
        SupervisorConnection {
            reader: Box::new(self.reader),
            writer: Box::new(self.writer),
            hello: self.hello,
            binding: self.binding,
            secret: self.secret,
            request_index: self.request_index,
            reply_index: self.reply_index,
        }
    }

    /// Gives back the stream halves (to close the writing side, for example).
    pub fn into_parts(self) -> (R, W) {
        (self.reader, self.writer)
    }
}

/// The reading side of a split connection.
pub struct ReplyReader<R> {
    reader: R,
    binding: Binding,
    secret: [u8; 32],
    reply_index: u64,
}

impl<R: AsyncRead + Unpin> ReplyReader<R> {
    /// The next verified reply; `None` when the supervisor closed the connection.
    pub async fn next_reply(&mut self) -> Result<Option<SupervisorReply>, ClientError> {
        next_verified(
            &mut self.reader,
            &self.binding,
            &self.secret,
            &mut self.reply_index,
        )
        .await
    }
}

async fn next_verified(
    reader: &mut (impl AsyncRead + Unpin),
    binding: &Binding,
    secret: &[u8; 32],
    reply_index: &mut u64,
) -> Result<Option<SupervisorReply>, ClientError> {
    let Some(frame) = read_frame(reader, MAX_FRAME).await? else {
        return Ok(None);
    };
    if frame.len() < TAG_LEN {
        return Err(ClientError::Forged);
    }
    let (tag, body) = frame.split_at(TAG_LEN);
    if tag.iter().all(|b| *b == 0) {
        let error = match decode_strict::<SupervisorReply>(body) {
            Ok(SupervisorReply::Error(error)) => Some(error),
            _ => None,
        };
        return Err(ClientError::Untagged(error));
    }
    if !binding.verify(secret, Direction::Reply, *reply_index, body, tag) {
        return Err(ClientError::Forged);
    }
    *reply_index += 1;
    decode_strict(body)
        .map(Some)
        .map_err(|e| ClientError::Decode(e.to_string()))
}

/// Connects to a supervisor's Unix socket (`@name` abstract, else a path).
pub async fn connect_unix(
    address: &str,
    secret: [u8; 32],
) -> Result<
    SupervisorConnection<tokio::net::unix::OwnedReadHalf, tokio::net::unix::OwnedWriteHalf>,
    ClientError,
> {
    let stream = crate::helper::relay::connect(address).map_err(FrameError::Io)?;
    stream.set_nonblocking(true).map_err(FrameError::Io)?;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(FrameError::Io)?;
    let (reader, writer) = stream.into_split();
    SupervisorConnection::open(reader, writer, secret).await
}
