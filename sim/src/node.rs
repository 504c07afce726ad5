//! The executor node hosts: the in-memory executor served over turmoil TCP, so that a replica
//! reaches it across the simulated network (partitions, one-way cuts, held links and node
//! crashes apply to it), and [`HostedExecutor`], the replica-side `ExecutorTransport` that
//! calls it.
//!
//! The wire is the helper's own protocol with a small length prefix: the caller opens one
//! connection per call and sends two frames (the environment name, then the request exactly as
//! the helper reads it from stdin), and the node answers with one frame (the JSON envelope the
//! helper writes to stdout) and closes. Every frame is a 4-byte big-endian length followed by
//! that many bytes. An abandoned call drops its connection; a node that crashes mid-command
//! closes the connection without an answer. The node's workspaces live outside the host (in
//! the shared [`MemExecutor`] state), so they survive a crash as a disk would; calls in flight
//! die with the process.
//!
//! A connection whose first frame is `session <pod uid> <environment>` is a supervisor session
//! instead: the node hands it to that Pod's supervisor ([`NodeSupervisors`]), which speaks the
//! production tagged channel on it; [`HostedExecutor`] opens such sessions enrolled with the
//! Pod's derived secret, as `pods/exec` does in production.
//!
//! Cancellation is the production one (`pods/exec` holding the helper's stdin open for
//! `command.start`): after its two frames the caller of a command keeps its sending side open,
//! and closes it (a TCP half-close) when its cancel signal fires, then still waits for the
//! answer. While a command runs for a while, the node treats any further byte, end of stream
//! or error on the connection as the cancel, as the helper does with stdin: the command stops
//! without its effect and the answer says `cancelled`. An abandoned call (its connection
//! dropped) stops the command the same way. The caller's deadline is the production shape:
//! a file operation gets [`CALL_DEADLINE`], a command its own timeout plus [`COMMAND_GRACE`].

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use execution_provider::executor::pod_relay::enroll_session;
use execution_provider::executor::protocol::{MAX_JSON_BODY, Operation, command_timeout};
use execution_provider::executor::supervisor_client::SupervisorConnection;
use execution_provider::executor::supervisor_protocol::derive_secret;
use execution_provider::executor::transport::{SessionReader, SessionWriter};
use execution_provider::executor::transport::{decode_envelope, encode_request};
use execution_provider::executor::{
    BoxFuture, CancelSignal, ExecutorEnvelope, ExecutorRequest, ExecutorTarget, ExecutorTransport,
    SupervisorSession, SupervisorTarget, TransportError,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::executor::MemExecutor;
use crate::supervision::NodeSupervisors;

/// The port executor nodes listen on.
pub const NODE_PORT: u16 = 9443;
/// The longest environment name frame a node reads.
const MAX_ENVIRONMENT_FRAME: usize = 1024;
/// The longest request frame a node reads (twice the helper's bound, so that the helper's own
/// oversize refusal is what an oversize request meets).
const MAX_REQUEST_FRAME: usize = 2 * MAX_JSON_BODY;
/// The longest answer a caller reads (file contents and command output are base64 in JSON).
const MAX_ANSWER_FRAME: usize = 4 * MAX_JSON_BODY;
/// How long a file operation may take before the caller gives up (production gives it 2
/// minutes; the simulator's file operations take only the network's time).
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// What the caller adds to a command's own timeout before it gives up (production adds a
/// minute for the helper's cleanup and answer; the simulator's node answers a cancel or a
/// finished command at once, so a short grace keeps a call lost to a node fault short).
pub const COMMAND_GRACE: Duration = Duration::from_secs(3);

/// The turmoil host name of executor node `i`.
pub fn node_host(i: u32) -> String {
    format!("node-{i}")
}

/// Adds `count` executor node hosts serving `executor`.
pub fn add_nodes(sim: &mut turmoil::Sim<'_>, executor: &MemExecutor, count: u32) {
    for i in 0..count {
        let executor = executor.clone();
        let incarnations = Arc::new(AtomicU64::new(0));
        sim.host(node_host(i), move || {
            let executor = executor.clone();
            // Each incarnation's supervisors start afresh: a crash ends them and their commands.
            let life = incarnations.fetch_add(1, Ordering::Relaxed);
            let supervisors = Arc::new(NodeSupervisors::new(
                node_host(i),
                executor.commands(),
                (u64::from(i) << 32) ^ (life << 48),
            ));
            async move {
                let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), NODE_PORT);
                let listener = turmoil::net::TcpListener::bind(addr).await?;
                serve(listener, executor, supervisors).await?;
                Ok(())
            }
        });
    }
}

/// Answers every connection `listener` accepts with `executor` or, for a supervisor session,
/// the Pod's supervisor in `supervisors`, until the host stops.
pub async fn serve(
    listener: turmoil::net::TcpListener,
    executor: MemExecutor,
    supervisors: Arc<NodeSupervisors>,
) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let executor = executor.clone();
        let supervisors = supervisors.clone();
        tokio::spawn(async move {
            // A broken connection is the caller's problem: it sees no answer.
            let _ = answer(stream, &executor, &supervisors).await;
        });
    }
}

/// Reads one call from `stream`, runs it and writes the answer (or, on a crash mid-command,
/// closes without one).
async fn answer(
    mut stream: turmoil::net::TcpStream,
    executor: &MemExecutor,
    supervisors: &NodeSupervisors,
) -> io::Result<()> {
    let environment = read_frame(&mut stream, MAX_ENVIRONMENT_FRAME).await?;
    let environment = String::from_utf8(environment)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "environment is not UTF-8"))?;
    if let Some((pod_uid, environment)) = session_of(&environment) {
        let (reader, writer) = stream.into_split();
        supervisors
            .serve(pod_uid, environment, reader, writer)
            .await;
        return Ok(());
    }
    let node = supervisors.node();
    let frame = read_frame(&mut stream, MAX_REQUEST_FRAME).await?;
    tokio::time::sleep(executor.latency()).await;
    let envelope = match executor.command_time(&frame) {
        None => executor.serve_frame(&environment, &frame),
        Some(time) => {
            executor.start_frame(node, &environment, &frame);
            let mut byte = [0_u8; 1];
            tokio::select! {
                biased;
                // Any byte, end of stream or error after the request: the caller cancelled
                // (or gave up and dropped the connection).
                _ = stream.read(&mut byte) => {
                    Some(executor.cancel_frame(node, &environment, &frame))
                }
                () = tokio::time::sleep(time) => executor.finish_frame(node, &environment, &frame),
            }
        }
    };
    let Some(envelope) = envelope else {
        return Ok(());
    };
    let bytes = serde_json::to_vec(&envelope).expect("an envelope always encodes as JSON");
    write_frame(&mut stream, &bytes).await?;
    stream.flush().await
}

/// Reads one length-prefixed frame of at most `limit` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, limit: usize) -> io::Result<Vec<u8>> {
    let length = reader.read_u32().await? as usize;
    if length > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes exceeds {limit}"),
        ));
    }
    let mut bytes = vec![0; length];
    reader.read_exact(&mut bytes).await?;
    Ok(bytes)
}

/// Writes one length-prefixed frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, bytes: &[u8]) -> io::Result<()> {
    let length = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
    writer.write_u32(length).await?;
    writer.write_all(bytes).await
}

/// The first frame of a supervisor session: `session <pod uid> <environment>` (an environment
/// name has no space, so no call's first frame looks like it).
const SESSION_WORD: &str = "session ";

fn session_frame(pod_uid: &str, environment: &str) -> String {
    format!("{SESSION_WORD}{pod_uid} {environment}")
}

/// The Pod UID and environment of a session's first frame.
fn session_of(frame: &str) -> Option<(&str, &str)> {
    frame.strip_prefix(SESSION_WORD)?.split_once(' ')
}

/// The replica's side: runs each helper request on the node that holds the environment's
/// workspace, over one turmoil TCP connection per call. Build it anywhere; call it inside a
/// turmoil host.
#[derive(Debug, Clone)]
pub struct HostedExecutor {
    nodes: u32,
    file_deadline: Duration,
    command_grace: Duration,
    /// `K_sup`, from which each Pod's supervisor secret derives; none: no supervisor sessions.
    supervisor_key: Option<Arc<[u8]>>,
}

impl HostedExecutor {
    /// A transport to nodes `node-0..nodes`.
    pub fn new(nodes: u32) -> Self {
        assert!(nodes > 0, "a hosted executor needs at least one node");
        Self {
            nodes,
            file_deadline: CALL_DEADLINE,
            command_grace: COMMAND_GRACE,
            supervisor_key: None,
        }
    }

    /// The same transport, opening supervisor sessions enrolled with secrets derived from
    /// `key` (the production `PodExecutor::with_supervisor_key`).
    pub fn with_supervisor_key(mut self, key: &[u8]) -> Self {
        self.supervisor_key = Some(Arc::from(key));
        self
    }

    /// Opens an enrolled session with the supervisor of `target`'s Pod on its node.
    async fn open_session(
        &self,
        target: &SupervisorTarget,
    ) -> Result<SupervisorSession, TransportError> {
        let Some(key) = &self.supervisor_key else {
            return Err(TransportError::Unsupported);
        };
        let executor = &target.executor;
        if target.pod_uid.is_empty() || target.pod_uid.contains(' ') {
            return Err(TransportError::InvalidTarget {
                reason: "a pod UID is required".to_owned(),
            });
        }
        let secret = derive_secret(
            key,
            &executor.namespace,
            &executor.pod_name,
            &target.pod_uid,
        );
        let node = self.node_for(&executor.environment);
        let opening = async {
            let failed =
                |what: &str, e: io::Error| TransportError::stream(format!("{what} {node}: {e}"));
            let mut stream = turmoil::net::TcpStream::connect((node.as_str(), NODE_PORT))
                .await
                .map_err(|e| failed("connecting to", e))?;
            let first = session_frame(&target.pod_uid, &executor.environment);
            write_frame(&mut stream, first.as_bytes())
                .await
                .map_err(|e| failed("sending to", e))?;
            let (reader, writer) = stream.into_split();
            let reader: SessionReader = Box::new(reader);
            let writer: SessionWriter = Box::new(writer);
            let connection = SupervisorConnection::open(reader, writer, secret)
                .await
                .map_err(|e| TransportError::stream(format!("supervisor hello: {e}")))?;
            enroll_session(connection, &secret).await
        };
        tokio::time::timeout(self.file_deadline, opening)
            .await
            .map_err(|_| TransportError::stream("opening the supervisor session timed out"))?
    }

    /// How long the caller waits for `request`: a command's own timeout (the helper's bound
    /// when it names none) plus the grace, or the file deadline.
    pub fn deadline(&self, request: &ExecutorRequest) -> Duration {
        if request.operation == Operation::CommandStart {
            command_timeout(request.timeout_ms) + self.command_grace
        } else {
            self.file_deadline
        }
    }

    /// The node that holds `environment`'s workspace: a stable hash (FNV-1a), the same in
    /// every process.
    pub fn node_for(&self, environment: &str) -> String {
        let hash = environment.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        node_host((hash % u64::from(self.nodes)) as u32)
    }

    /// Sends one raw request frame for `environment` and decodes the answer, within the file
    /// deadline and never cancelled. Any network failure is an uncontrolled stream failure.
    pub async fn send_frame(
        &self,
        environment: &str,
        frame: &[u8],
    ) -> Result<ExecutorEnvelope, TransportError> {
        let never = CancelSignal::never();
        self.send(environment, frame, self.file_deadline, never)
            .await
    }

    /// Sends one frame within `deadline`; `cancel` closes the sending side (the node's cancel
    /// signal) and the call still waits for the answer.
    async fn send(
        &self,
        environment: &str,
        frame: &[u8],
        deadline: Duration,
        cancel: CancelSignal,
    ) -> Result<ExecutorEnvelope, TransportError> {
        let node = self.node_for(environment);
        tokio::time::timeout(deadline, call(&node, environment, frame, cancel))
            .await
            .map_err(|_| TransportError::stream("executor deadline exceeded"))?
    }
}

async fn call(
    node: &str,
    environment: &str,
    frame: &[u8],
    cancel: CancelSignal,
) -> Result<ExecutorEnvelope, TransportError> {
    let failed = |what: &str, e: io::Error| TransportError::stream(format!("{what} {node}: {e}"));
    let mut stream = turmoil::net::TcpStream::connect((node, NODE_PORT))
        .await
        .map_err(|e| failed("connecting to", e))?;
    write_frame(&mut stream, environment.as_bytes())
        .await
        .map_err(|e| failed("sending to", e))?;
    write_frame(&mut stream, frame)
        .await
        .map_err(|e| failed("sending to", e))?;
    stream.flush().await.map_err(|e| failed("sending to", e))?;
    let (mut reader, mut writer) = stream.into_split();
    // The sending side stays open (the helper's stdin held) until the cancel fires; it
    // closes with the call otherwise.
    let holding = async move {
        cancel.cancelled().await;
        let _ = writer.shutdown().await;
    };
    let reading = read_frame(&mut reader, MAX_ANSWER_FRAME);
    tokio::pin!(holding, reading);
    let mut held = true;
    let answer = loop {
        tokio::select! {
            biased;
            answer = &mut reading => break answer,
            () = &mut holding, if held => held = false,
        }
    };
    let answer = answer.map_err(|e| failed("no answer from", e))?;
    decode_envelope(&answer)
}

impl ExecutorTransport for HostedExecutor {
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        // Only a command is cancellable (a file operation closes stdin after the request in
        // production too, and the helper ignores it).
        Box::pin(async move {
            let frame = encode_request(&request)?;
            let deadline = self.deadline(&request);
            let cancel = if request.operation == Operation::CommandStart {
                cancel
            } else {
                CancelSignal::never()
            };
            self.send(&target.environment, &frame, deadline, cancel)
                .await
        })
    }

    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        Box::pin(self.open_session(target))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    use execution_provider::executor::{ExecutorTransport, Operation};

    use super::*;

    fn target() -> ExecutorTarget {
        ExecutorTarget {
            namespace: "execution".into(),
            pod_name: "executor-1".into(),
            environment: "exec-1".into(),
        }
    }

    fn create(path: &str, data: &[u8]) -> ExecutorRequest {
        let mut request = ExecutorRequest::at(Operation::FileCreate, path);
        request.data = data.to_vec();
        request
    }

    #[tokio::test]
    async fn a_frame_round_trips_and_one_over_its_limit_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, b"exec-1").await.unwrap();
        assert_eq!(read_frame(&mut b, 6).await.unwrap(), b"exec-1");
        write_frame(&mut a, b"exec-12").await.unwrap();
        let error = read_frame(&mut b, 6).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_node_crash_mid_command_loses_the_answer_after_the_effect() {
        let mut sim = turmoil::Builder::new().build();
        let executor = MemExecutor::new(1, 1.0, Duration::from_millis(5));
        add_nodes(&mut sim, &executor, 1);
        sim.client("replica-0", async move {
            let mut request = ExecutorRequest::new(Operation::CommandStart);
            request.command_id = "cmd-1".into();
            request.command = "echo hi".into();
            let transport = HostedExecutor::new(1);
            let result = transport
                .execute(&target(), request, CancelSignal::never())
                .await;
            let error = result.expect_err("the answer is lost");
            assert!(error.is_uncontrolled(), "{error}");
            Ok(())
        });
        sim.run().unwrap();
        let effects = executor.effects();
        assert_eq!(effects.len(), 1, "{effects:?}");
        assert_eq!(effects[0].subject, "cmd-1");
    }

    #[test]
    fn the_workspace_survives_a_node_crash_and_restart() {
        let mut sim = turmoil::Builder::new().build();
        let executor = MemExecutor::new(1, 0.0, Duration::from_millis(5));
        add_nodes(&mut sim, &executor, 1);
        // 0: creating, 1: created (crash and restart the node now), 2: the node is back.
        let phase = Arc::new(AtomicU8::new(0));
        let seen = phase.clone();
        sim.client("replica-0", async move {
            let transport = HostedExecutor::new(1);
            let never = CancelSignal::never;
            let created = transport
                .execute(&target(), create("f", b"kept"), never())
                .await?;
            assert!(created.response.is_some(), "{created:?}");
            seen.store(1, Ordering::SeqCst);
            while seen.load(Ordering::SeqCst) == 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let read = ExecutorRequest::at(Operation::FileRead, "f");
            let envelope = transport.execute(&target(), read, never()).await?;
            assert_eq!(envelope.response.expect("an answer").data, b"kept");
            Ok(())
        });
        while phase.load(Ordering::SeqCst) == 0 {
            sim.step().unwrap();
        }
        sim.crash(node_host(0));
        for _ in 0..50 {
            sim.step().unwrap();
        }
        sim.bounce(node_host(0));
        phase.store(2, Ordering::SeqCst);
        sim.run().unwrap();
    }
}
