//! A real `execution-helper supervise` on a temporary workspace and socket, and the calls the
//! supervisor tests make to it: over its socket, or through a [`SessionSource`] (the
//! `pods/exec` relay of `tests/supervisor_pod_exec.rs`). The cases both routes run are in
//! [`cases`].

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use execution_provider::executor::SupervisorSession;
use execution_provider::executor::protocol::{CommandState, ErrorCode, ExecutorError};
use execution_provider::executor::supervisor_client::{SupervisorConnection, connect_unix};
use execution_provider::executor::supervisor_protocol::{
    ClaimTuple, CommandView, OutputStream, StartRequest, SupervisorReply, SupervisorRequest,
    derive_secret,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

#[macro_use]
pub mod cases;

pub type Connection = SupervisorConnection<OwnedReadHalf, OwnedWriteHalf>;

/// Another way to reach the supervisor than its socket: each call opens an authenticated
/// session through it.
pub trait SessionSource: Send + Sync {
    /// A fresh session, enrolled.
    fn open(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = SupervisorSession> + Send + '_>>;
}

/// The secret the tests enroll.
pub fn secret() -> [u8; 32] {
    derive_secret(b"supervisor-test-key", "ns", "executor-test", "uid-1")
}

/// A claim tuple.
pub fn claim(name: &str) -> ClaimTuple {
    ClaimTuple {
        claim_id: format!("claim-{name}"),
        run_id: format!("run-{name}"),
        epoch: 1,
        grant_generation: 1,
    }
}

/// A running supervisor.
pub struct Supervised {
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub socket: String,
    pub child: Child,
    /// Where the helpers' sessions go instead of the socket (with [`secret`]), when set.
    pub source: Option<Box<dyn SessionSource>>,
}

impl Supervised {
    /// Starts a supervisor and waits until its socket answers (not enrolled).
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let socket = dir.path().join("supervisor.sock").display().to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_execution-helper"))
            .arg("supervise")
            .arg("--workspace")
            .arg(&workspace)
            .arg("--socket")
            .arg(&socket)
            .kill_on_drop(true)
            .spawn()
            .expect("the supervisor starts");
        let supervised = Self {
            dir,
            workspace,
            socket,
            child,
            source: None,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&supervised.socket).is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the supervisor never listened"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        supervised
    }

    /// Starts a supervisor and enrolls [`secret`].
    pub async fn enrolled() -> Self {
        let supervised = Self::start().await;
        let mut connection = supervised.connect_with(secret()).await;
        let reply = connection.enroll().await.expect("enrollment answers");
        assert!(
            matches!(reply, SupervisorReply::Enrolled { .. }),
            "{reply:?}"
        );
        supervised
    }

    /// A connection whose requests are tagged with `secret`.
    pub async fn connect_with(&self, secret: [u8; 32]) -> Connection {
        connect_unix(&self.socket, secret)
            .await
            .expect("the supervisor answers with a hello")
    }

    /// A connection with the enrolled secret.
    pub async fn connect(&self) -> Connection {
        self.connect_with(secret()).await
    }

    /// A fresh session: through the source when one is set, else the socket with [`secret`].
    pub async fn open_session(&self) -> SupervisorSession {
        if let Some(source) = &self.source {
            return source.open().await;
        }
        self.connect().await.boxed()
    }

    /// One unary call on a fresh session.
    pub async fn call(&self, request: SupervisorRequest) -> SupervisorReply {
        self.open_session()
            .await
            .call(&request)
            .await
            .expect("a reply")
    }

    /// Starts `command` under `claim` with a 5-minute lease.
    pub async fn start_command(&self, id: &str, claim: &ClaimTuple, command: &str) -> CommandView {
        self.start_with(start_request(id, claim, command)).await
    }

    /// Starts a command; panics unless it runs.
    pub async fn start_with(&self, request: StartRequest) -> CommandView {
        match self.call(SupervisorRequest::Start(request)).await {
            SupervisorReply::Status(view) => view,
            other => panic!("start refused: {other:?}"),
        }
    }

    /// Follows a command from `offset` to its end; returns every output frame's chunks and the
    /// final view.
    pub async fn follow(&self, id: &str, claim: &ClaimTuple, offset: u64) -> Followed {
        let mut connection = self.open_session().await;
        connection
            .send(&SupervisorRequest::Follow {
                command_id: id.into(),
                claim: claim.clone(),
                offset,
            })
            .await
            .unwrap();
        let mut followed = Followed::default();
        loop {
            match connection.next_reply().await.expect("a verified frame") {
                Some(SupervisorReply::Output {
                    chunks,
                    dropped_bytes,
                }) => {
                    followed.dropped += dropped_bytes;
                    for chunk in chunks {
                        followed.add(chunk.stream, chunk.offset, &chunk.data);
                    }
                }
                Some(SupervisorReply::Status(view)) => {
                    followed.end = Some(view);
                    return followed;
                }
                other => panic!("unexpected follow frame {other:?}"),
            }
        }
    }

    /// A command's view from `offset`.
    pub async fn status(&self, id: &str, claim: &ClaimTuple, offset: u64) -> SupervisorReply {
        self.call(SupervisorRequest::Status {
            command_id: id.into(),
            claim: claim.clone(),
            offset,
            max_bytes: 0,
        })
        .await
    }

    /// Cancels a command and returns its final view.
    pub async fn cancel(&self, id: &str, claim: &ClaimTuple, grace_ms: u64) -> CommandView {
        match self
            .call(SupervisorRequest::Cancel {
                command_id: id.into(),
                claim: claim.clone(),
                grace_ms,
            })
            .await
        {
            SupervisorReply::Status(view) => view,
            other => panic!("cancel refused: {other:?}"),
        }
    }

    /// What the journal knows of `id`.
    pub async fn journal(
        &self,
        id: &str,
        seal: bool,
    ) -> Option<execution_provider::executor::supervisor_protocol::JournalEntry> {
        match self
            .call(SupervisorRequest::Journal {
                command_id: id.into(),
                seal,
            })
            .await
        {
            SupervisorReply::Journal { entry } => entry,
            other => panic!("journal refused: {other:?}"),
        }
    }

    /// Polls the journal until `id` is no longer running.
    pub async fn ended(
        &self,
        id: &str,
    ) -> execution_provider::executor::supervisor_protocol::JournalEntry {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(entry) = self.journal(id, false).await
                && entry.state != CommandState::Running
            {
                return entry;
            }
            assert!(tokio::time::Instant::now() < deadline, "{id} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reads a pid a command wrote into the workspace, waiting for it to appear.
    pub async fn pid_file(&self, name: &str) -> i32 {
        let path = self.workspace.join(name);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && let Ok(pid) = text.trim().parse()
            {
                return pid;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never appeared"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A start request with a 5-minute lease and defaults.
pub fn start_request(id: &str, claim: &ClaimTuple, command: &str) -> StartRequest {
    StartRequest {
        command_id: id.into(),
        claim: claim.clone(),
        lease_ms: 300_000,
        command: command.into(),
        env: Vec::new(),
        working_dir: String::new(),
        timeout_ms: 0,
        stdin: false,
        pty: None,
        window_bytes: 0,
        request_digest: String::new(),
        replay_only: false,
    }
}

/// What a follow saw.
#[derive(Debug, Default)]
pub struct Followed {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Offsets in the order the chunks arrived, with their lengths.
    pub spans: Vec<(u64, usize)>,
    pub dropped: u64,
    pub end: Option<CommandView>,
}

impl Followed {
    fn add(&mut self, stream: OutputStream, offset: u64, data: &[u8]) {
        self.spans.push((offset, data.len()));
        match stream {
            OutputStream::Stderr => self.stderr.extend_from_slice(data),
            _ => self.stdout.extend_from_slice(data),
        }
    }
}

/// Whether `pid` names a live process (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The error of a reply, or a panic.
pub fn error_of(reply: SupervisorReply) -> ExecutorError {
    match reply {
        SupervisorReply::Error(error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Asserts a reply is `not_found` with the generic message.
pub fn assert_absent(reply: SupervisorReply) {
    let error = error_of(reply);
    assert_eq!(error.code, ErrorCode::NotFound);
    assert_eq!(error.message, "command not found");
}
