//! The production transport: `execution-helper` run in an executor Pod through `pods/exec`
//! over WebSocket (kube `Api::<Pod>::exec`, k8s-executor §4.1).
//!
//! The request cannot choose anything about the session: the container is always
//! [`EXECUTOR_CONTAINER`] and argv is always [`HELPER_IN_IMAGE_PATH`] alone, with stdin, stdout
//! and stderr attached and no TTY. Framing follows §4.1 exactly as the local transport does:
//! the request JSON on stdin (with `\n`, and held open until cancel, for `command.start`; closing
//! it is the helper's cancel signal), stdout read up to 8 MiB and stderr up to 64 KiB (more is a
//! stream failure), a deadline on the whole exchange, and strict envelope decoding. stderr and
//! the exit status only matter when stdout is not a valid envelope.
//!
//! Supervisor sessions (detached and interactive commands) go through the same exec, turned
//! into the supervisor relay by its first stdin line ([`super::pod_relay`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use super::local::{COMMAND_DEADLINE_GRACE, FILE_OPERATION_DEADLINE, MAX_HELPER_STDERR};
use super::protocol::{
    ExecutorEnvelope, ExecutorRequest, MAX_JSON_BODY, Operation, command_timeout,
};
use super::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, SupervisorSession,
    SupervisorTarget, TransportError, decode_envelope, encode_request,
};

/// The container the helper runs in.
pub const EXECUTOR_CONTAINER: &str = "executor";
/// Where the executor image keeps the helper (k8s-executor §4.4: the image root path that
/// reference images already provide; our `execution-helper` binary is installed there).
pub const HELPER_IN_IMAGE_PATH: &str = "/mecatl-executor";
/// Buffer between the WebSocket task and our readers, per stream.
const STREAM_BUFFER: usize = 64 * 1024;

/// Runs helper requests in executor Pods through the Kubernetes API.
#[derive(Clone)]
pub struct PodExecutor {
    client: kube::Client,
    file_deadline: Duration,
    command_grace: Duration,
    supervisor_key: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for PodExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodExecutor")
            .field("file_deadline", &self.file_deadline)
            .field("command_grace", &self.command_grace)
            .field(
                "supervisor_key",
                &self.supervisor_key.as_ref().map(|_| "set"),
            )
            .finish_non_exhaustive()
    }
}

impl PodExecutor {
    /// A transport using `client` (the provider's in-cluster credentials).
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            file_deadline: FILE_OPERATION_DEADLINE,
            command_grace: COMMAND_DEADLINE_GRACE,
            supervisor_key: None,
        }
    }

    /// Offers supervisor sessions, whose per-Pod secrets derive from `key` (`K_sup`,
    /// docs/commands.md §4.2). Without a key, [`ExecutorTransport::supervisor`] answers
    /// [`TransportError::Unsupported`].
    pub fn with_supervisor_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.supervisor_key = Some(Arc::from(key.into()));
        self
    }

    /// Overrides the deadline of a file operation and the grace added to a command's timeout.
    pub fn with_deadlines(mut self, file_deadline: Duration, command_grace: Duration) -> Self {
        self.file_deadline = file_deadline;
        self.command_grace = command_grace;
        self
    }

    async fn run(
        &self,
        target: &ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> Result<ExecutorEnvelope, TransportError> {
        let body = encode_request(&request)?;
        if target.namespace.is_empty() || target.pod_name.is_empty() {
            return Err(TransportError::InvalidTarget {
                reason: "namespace and pod name are required".to_owned(),
            });
        }
        let is_command = request.operation == Operation::CommandStart;
        let deadline = if is_command {
            command_timeout(request.timeout_ms) + self.command_grace
        } else {
            self.file_deadline
        };
        let exchange = self.exchange(target, body, is_command, cancel);
        let (stdout, stderr, status) = tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| TransportError::stream("executor deadline exceeded"))??;
        decode_envelope(&stdout).map_err(|error| explain(error, &stderr, status))
    }

    async fn exchange(
        &self,
        target: &ExecutorTarget,
        body: Vec<u8>,
        is_command: bool,
        cancel: CancelSignal,
    ) -> Result<(Vec<u8>, Vec<u8>, Option<String>), TransportError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let params = AttachParams::default()
            .container(EXECUTOR_CONTAINER)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .tty(false)
            .max_stdin_buf_size(STREAM_BUFFER)
            .max_stdout_buf_size(STREAM_BUFFER)
            .max_stderr_buf_size(STREAM_BUFFER);
        let mut attached = pods
            .exec(&target.pod_name, [HELPER_IN_IMAGE_PATH], &params)
            .await
            .map_err(|e| TransportError::stream(format!("exec: {e}")))?;
        let mut stdin = attached.stdin().expect("stdin was asked for");
        let stdout = attached.stdout().expect("stdout was asked for");
        let stderr = attached.stderr().expect("stderr was asked for");
        let status = attached.take_status();

        let feeding = async move {
            // Write errors are ignored: if the helper stopped reading, its answer says why.
            if stdin.write_all(&body).await.is_ok() && is_command {
                let held = stdin.write_all(b"\n").await.is_ok() && stdin.flush().await.is_ok();
                if held {
                    cancel.cancelled().await;
                }
            }
            // Dropping the writer closes the helper's stdin (v5: a close frame).
            let _ = stdin.shutdown().await;
        };
        let reading = async {
            tokio::try_join!(
                read_bounded(stdout, MAX_JSON_BODY, "stdout"),
                read_bounded(stderr, MAX_HELPER_STDERR, "stderr")
            )
        };
        let (stdout, stderr) = feed_until_read(feeding, reading).await?;
        let status = match status {
            Some(status) => status.await.and_then(|s| {
                (s.status.as_deref() != Some("Success")).then(|| s.message.unwrap_or_default())
            }),
            None => None,
        };
        // The session ends with the call; dropping `attached` tears the WebSocket down.
        drop(attached);
        Ok((stdout, stderr, status))
    }
}

/// Feeds stdin while reading; returns once both outputs ended. If the outputs end while stdin
/// is still held (the helper answered), the feeder is dropped, which closes stdin.
async fn feed_until_read<T>(
    feeding: impl std::future::Future<Output = ()>,
    reading: impl std::future::Future<Output = Result<T, TransportError>>,
) -> Result<T, TransportError> {
    tokio::pin!(feeding);
    tokio::pin!(reading);
    let mut fed = false;
    loop {
        tokio::select! {
            outputs = &mut reading => return outputs,
            () = &mut feeding, if !fed => fed = true,
        }
    }
}

/// Adds what the session said when stdout was not a valid envelope.
fn explain(error: TransportError, stderr: &[u8], status: Option<String>) -> TransportError {
    let Some(status) = status else {
        return error;
    };
    let stderr = String::from_utf8_lossy(&stderr[..stderr.len().min(512)]);
    TransportError::stream(format!("{error}; exec status: {status}; stderr: {stderr}"))
}

/// Reads `reader` to EOF, failing once it passes `limit` bytes.
async fn read_bounded(
    reader: impl AsyncRead + Unpin,
    limit: usize,
    name: &str,
) -> Result<Vec<u8>, TransportError> {
    let mut buffer = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut buffer)
        .await
        .map_err(|e| TransportError::stream(format!("reading helper {name}: {e}")))?;
    if buffer.len() > limit {
        return Err(TransportError::stream(format!(
            "helper {name} exceeds {limit} bytes"
        )));
    }
    Ok(buffer)
}

impl ExecutorTransport for PodExecutor {
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(self.run(target, request, cancel))
    }

    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        Box::pin(async move {
            let Some(key) = &self.supervisor_key else {
                return Err(TransportError::Unsupported);
            };
            super::pod_relay::open_session(&self.client, target, key).await
        })
    }
}
