//! A supervisor session through `pods/exec` (docs/commands.md §4): the helper is started in the
//! executor container with its fixed argv, its first stdin line turns it into the relay, and
//! the exec session's stdin and stdout then carry the tagged supervisor channel end to end.
//!
//! The session owns the exec session: it lives exactly as long as the returned connection, and
//! dropping the connection tears the WebSocket down (which ends the relay in the Pod). The relay
//! holds no secret; the provider derives the Pod's secret and enrolls a fresh supervisor, and
//! never sends it to a supervisor that reports another secret.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncRead, AsyncWriteExt as _, ReadBuf};

use super::pod_exec::{EXECUTOR_CONTAINER, HELPER_IN_IMAGE_PATH};
use super::supervisor_client::{ClientError, SupervisorConnection};
use super::supervisor_protocol::{SupervisorReply, derive_secret, secret_id};
use super::transport::{
    SessionReader, SessionWriter, SupervisorSession, SupervisorTarget, TransportError,
};
use crate::helper::relay::{RELAY_WORD, RelayOpen};

/// Buffer between the WebSocket task and the session, per direction.
const RELAY_BUFFER: usize = 256 * 1024;
/// How long opening a session (exec, hello, enrollment) may take.
pub const OPEN_DEADLINE: Duration = Duration::from_secs(30);

/// The exec session's stdout, holding the exec session itself: dropping the reader ends it.
struct RelayReader<R> {
    stdout: R,
    _session: AttachedProcess,
}

impl<R: AsyncRead + Unpin> AsyncRead for RelayReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

/// Opens an enrolled session with the supervisor of `target`'s Pod, whose secret derives from
/// `key` (docs/commands.md §4.2).
pub async fn open_session(
    client: &kube::Client,
    target: &SupervisorTarget,
    key: &[u8],
) -> Result<SupervisorSession, TransportError> {
    let executor = &target.executor;
    if executor.namespace.is_empty() || executor.pod_name.is_empty() || target.pod_uid.is_empty() {
        return Err(TransportError::InvalidTarget {
            reason: "namespace, pod name and pod UID are required".to_owned(),
        });
    }
    let secret = derive_secret(
        key,
        &executor.namespace,
        &executor.pod_name,
        &target.pod_uid,
    );
    tokio::time::timeout(OPEN_DEADLINE, open(client, target, secret))
        .await
        .map_err(|_| TransportError::stream("opening the supervisor session timed out"))?
}

async fn open(
    client: &kube::Client,
    target: &SupervisorTarget,
    secret: [u8; 32],
) -> Result<SupervisorSession, TransportError> {
    let executor = &target.executor;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &executor.namespace);
    let params = AttachParams::default()
        .container(EXECUTOR_CONTAINER)
        .stdin(true)
        .stdout(true)
        .stderr(false)
        .tty(false)
        .max_stdin_buf_size(RELAY_BUFFER)
        .max_stdout_buf_size(RELAY_BUFFER);
    let mut attached = pods
        .exec(&executor.pod_name, [HELPER_IN_IMAGE_PATH], &params)
        .await
        .map_err(|e| TransportError::stream(format!("exec: {e}")))?;
    let mut stdin = attached.stdin().expect("stdin was asked for");
    let stdout = attached.stdout().expect("stdout was asked for");
    let mut line = serde_json::to_vec(&RelayOpen {
        relay: RELAY_WORD.to_owned(),
    })
    .expect("the relay line encodes");
    line.push(b'\n');
    stdin
        .write_all(&line)
        .await
        .map_err(|e| TransportError::stream(format!("writing the relay line: {e}")))?;
    let reader: SessionReader = Box::new(RelayReader {
        stdout,
        _session: attached,
    });
    let writer: SessionWriter = Box::new(stdin);
    let connection = SupervisorConnection::open(reader, writer, secret)
        .await
        .map_err(|e| session_failed("hello", e))?;
    enroll_session(connection, &secret).await
}

/// Enrolls a fresh supervisor; a supervisor enrolled with our secret is used as it is, one
/// enrolled with another is refused without our secret being sent. (The simulator's node
/// transport enrolls through it too.)
pub async fn enroll_session(
    mut connection: SupervisorSession,
    secret: &[u8; 32],
) -> Result<SupervisorSession, TransportError> {
    let reported = connection.hello().secret_id.clone();
    if reported == secret_id(secret) {
        return Ok(connection);
    }
    if !reported.is_empty() {
        return Err(TransportError::stream(
            "the supervisor is enrolled with another secret",
        ));
    }
    match connection.enroll().await {
        Ok(SupervisorReply::Enrolled { .. }) => Ok(connection),
        Ok(other) => Err(TransportError::stream(format!(
            "enrollment refused: {}",
            reply_word(&other)
        ))),
        Err(e) => Err(session_failed("enrollment", e)),
    }
}

fn reply_word(reply: &SupervisorReply) -> String {
    match reply {
        SupervisorReply::Error(error) => format!("{:?}", error.code),
        _ => "unexpected reply".to_owned(),
    }
}

fn session_failed(step: &str, error: ClientError) -> TransportError {
    let reason = match error {
        // The relay ends at once when no supervisor listens in the Pod (or the helper is one
        // that does not know the relay line and answered it as a bad request).
        ClientError::Closed => "no supervisor answered in the executor".to_owned(),
        other => other.to_string(),
    };
    TransportError::stream(format!("supervisor {step}: {reason}"))
}
