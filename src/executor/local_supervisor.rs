//! Supervisors for `dev` and tests: one `execution-helper supervise` per environment, started
//! on demand on `<workspaces>/<environment>` with its socket at `<sockets>/<environment>.sock`
//! (a directory of mode 0700), enrolled with the secret derived from the provider's key
//! (docs/commands.md §4.1, §4.2). The provider side connects through [`LocalSupervisors::connect`].
//!
//! [`LocalSupervisors::sandboxed`] makes each supervisor the init (PID 1) of its environment's
//! sandbox (docs/sandbox.md): the sandbox's host stage binds the socket, in a directory the
//! sandbox does not see, and hands the listening descriptor down to the init, so only the
//! provider can connect. Such a supervisor stops by itself once idle (no running command, no
//! open connection) for [`SandboxPolicy::idle_exit`], and [`LocalSupervisors::stop`] ends it
//! at once (its whole PID namespace dies with it); the next connection starts a fresh one.
//! [`LocalSupervisors::call`] runs one one-shot helper request inside it (what the local
//! transport does for every call of a sandboxed environment).
//!
//! Unsandboxed, each supervisor runs under a plain holder ([`sandbox::plain_command`]); either
//! way [`LocalSupervisors::end_processes`] ends every process of an environment with proof
//! ([`super::environment_end`]).

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use super::environment_end::{self, EnvironmentProcesses, ProcessesRemain};
use super::local::{LocalTransport, SandboxPolicy};
use super::protocol::MAX_JSON_BODY;
use super::sandbox_networks::SandboxNetworks;
use super::supervisor_client::{ClientError, SupervisorConnection, connect_unix};
use super::supervisor_protocol::{
    FrameError, MAX_CALL_CHUNK, SupervisorReply, SupervisorRequest, derive_secret,
};
use super::transport::{BoxFuture, CancelSignal, TransportError};
use crate::sandbox::{self, Network, SandboxSpec};

/// How long a freshly started supervisor may take to listen.
pub const SUPERVISOR_START_DEADLINE: Duration = Duration::from_secs(10);
/// The namespace and Pod UID a local environment's secret is derived with.
pub const LOCAL_NAMESPACE: &str = "dev";
/// See [`LOCAL_NAMESPACE`].
pub const LOCAL_POD_UID: &str = "local";
/// Pause between connection attempts while a supervisor starts.
const START_POLL: Duration = Duration::from_millis(5);

/// A connection to a local supervisor.
pub type LocalConnection = SupervisorConnection<OwnedReadHalf, OwnedWriteHalf>;

/// Why a local supervisor could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum LocalSupervisorError {
    /// The environment name is not a plain name.
    #[error(transparent)]
    Target(#[from] TransportError),
    /// Starting the supervisor failed.
    #[error("cannot start the supervisor: {0}")]
    Start(std::io::Error),
    /// The supervisor (or its sandbox) exited before it answered.
    #[error(
        "the supervisor exited before it answered (a sandbox setup failure is on the provider's stderr)"
    )]
    Exited,
    /// It did not listen in time.
    #[error("the supervisor did not listen within its deadline")]
    NotListening,
    /// The channel failed or enrollment was refused.
    #[error(transparent)]
    Channel(#[from] ClientError),
}

/// The supervisors of local environments.
pub struct LocalSupervisors {
    layout: LocalTransport,
    sockets: PathBuf,
    key: Vec<u8>,
    sandbox: Option<SandboxPolicy>,
    networks: OnceLock<Arc<dyn SandboxNetworks>>,
    started: Mutex<BTreeMap<String, Child>>,
}

impl std::fmt::Debug for LocalSupervisors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSupervisors")
            .field("workspaces", &self.layout.workspaces)
            .field("sockets", &self.sockets)
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

impl LocalSupervisors {
    /// Supervisors running `helper` on `<workspaces>/<environment>` with no isolation, their
    /// sockets in `sockets`, their secrets derived from `key`. Supervisors this value started
    /// end with it.
    pub fn new(
        helper: impl Into<PathBuf>,
        workspaces: impl Into<PathBuf>,
        sockets: impl Into<PathBuf>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            layout: LocalTransport::unisolated(helper, workspaces),
            sockets: sockets.into(),
            key: key.into(),
            sandbox: None,
            networks: OnceLock::new(),
            started: Mutex::new(BTreeMap::new()),
        }
    }

    /// As [`LocalSupervisors::new`], but each supervisor is the init of its environment's
    /// sandbox, built with `policy` (whose hidden paths gain `sockets`).
    pub fn sandboxed(
        helper: impl Into<PathBuf>,
        workspaces: impl Into<PathBuf>,
        sockets: impl Into<PathBuf>,
        key: impl Into<Vec<u8>>,
        mut policy: SandboxPolicy,
    ) -> Self {
        let mut supervisors = Self::new(helper, workspaces, sockets, key);
        if !policy.hidden.contains(&supervisors.sockets) {
            policy.hidden.push(supervisors.sockets.clone());
        }
        supervisors.sandbox = Some(policy);
        supervisors
    }

    /// Lets `networks` choose each sandbox's network (once; later calls change nothing).
    /// Without, every sandbox gets its policy's network.
    pub fn choose_networks_with(&self, networks: Arc<dyn SandboxNetworks>) {
        let _ = self.networks.set(networks);
    }

    /// Whether supervisors run in sandboxes.
    pub fn is_sandboxed(&self) -> bool {
        self.sandbox.is_some()
    }

    /// The socket of `environment`'s supervisor.
    pub fn socket_of(&self, environment: &str) -> Result<PathBuf, TransportError> {
        self.layout.workspace_of(environment)?;
        Ok(self.sockets.join(format!("{environment}.sock")))
    }

    /// The name of the pids cgroup the holders of `environment` join: the environment's name
    /// and a tag of this value's socket directory, so that another `dev` state directory's
    /// environment of the same name is never taken for this one.
    pub fn cgroup_name_of(&self, environment: &str) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.sockets.as_os_str().as_encoded_bytes());
        format!("{environment}.{}", hex::encode(&digest[..4]))
    }

    /// The secret `environment`'s supervisor is enrolled with.
    pub fn secret_of(&self, environment: &str) -> [u8; 32] {
        derive_secret(&self.key, LOCAL_NAMESPACE, environment, LOCAL_POD_UID)
    }

    /// The host pid of the process this value started for `environment` (the sandbox's host
    /// stage when sandboxed, the plain holder otherwise), while it runs.
    pub fn started_pid(&self, environment: &str) -> Option<u32> {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let child = started.get_mut(environment)?;
        match child.try_wait() {
            Ok(None) => child.id(),
            _ => None,
        }
    }

    /// An authenticated connection to `environment`'s supervisor, started and enrolled first
    /// when none listens.
    pub async fn connect(
        &self,
        environment: &str,
    ) -> Result<LocalConnection, LocalSupervisorError> {
        let socket = self.socket_of(environment)?;
        let address = socket.display().to_string();
        let secret = self.secret_of(environment);
        let deadline = tokio::time::Instant::now() + SUPERVISOR_START_DEADLINE;
        let mut spawned = false;
        loop {
            match connect_unix(&address, secret).await {
                Ok(connection) if connection.enrolled_with_our_secret() => return Ok(connection),
                Ok(connection) => match self.enroll(connection).await {
                    Err(LocalSupervisorError::Channel(e)) if went_away(&e) => {}
                    enrolled => return enrolled,
                },
                Err(e) if went_away(&e) => {}
                Err(e) => return Err(e.into()),
            }
            // Nobody answers: none runs, it is starting, or an idle one is exiting.
            if !self.is_running(environment) {
                if spawned {
                    return Err(LocalSupervisorError::Exited);
                }
                let network = self.network_of(environment).await;
                self.start(environment, &socket, network)?;
                spawned = true;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(LocalSupervisorError::NotListening);
            }
            tokio::time::sleep(START_POLL).await;
        }
    }

    /// Ends `environment`'s supervisor and every process of it, and waits for that; nothing
    /// to do when none runs.
    pub async fn stop(&self, environment: &str) {
        let child = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(environment);
        if let Some(mut child) = child
            && let Err(error) =
                environment_end::end_holder(&mut child, environment_end::END_DEADLINE).await
        {
            tracing::warn!(%error, environment, "a stopped supervisor's end is not proven");
        }
    }

    /// Ends every process of `environment` (its supervisor and everything that runs under it,
    /// detached commands included) and proves it ([`super::environment_end`]): through the
    /// holder this value started, and through every pids cgroup a holder of the environment
    /// joined. With neither (nothing started here and no pids hierarchy) only a socket that
    /// was never bound, or that an earlier proven end removed, proves that nothing runs.
    pub async fn end_processes(&self, environment: &str) -> Result<(), ProcessesRemain> {
        let socket = self
            .socket_of(environment)
            .map_err(|_| ProcessesRemain::BadName(environment.to_owned()))?;
        let holder = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(environment);
        let ours = holder.is_some();
        if let Some(mut child) = holder {
            environment_end::end_holder(&mut child, environment_end::END_DEADLINE).await?;
        }
        let cgroup = self.cgroup_name_of(environment);
        let found = environment_end::end_cgroups(&cgroup, environment_end::END_DEADLINE).await?;
        if !ours && found.is_none() && socket.exists() {
            return Err(ProcessesRemain::Unknown);
        }
        self.forget_socket(environment, &socket);
        Ok(())
    }

    /// Removes the socket of an environment whose processes were proven gone, unless a new
    /// supervisor was started for it since.
    fn forget_socket(&self, environment: &str, socket: &Path) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = started.get_mut(environment)
            && matches!(child.try_wait(), Ok(None))
        {
            return;
        }
        let _ = std::fs::remove_file(socket);
    }

    /// Runs one one-shot helper `request` in `environment`'s supervisor: its stdout, once the
    /// helper exited successfully. `hold_stdin` keeps the helper's stdin open until `cancel`
    /// (a foreground command), as the local transport does with a helper of its own; with an
    /// `operation_id` the supervisor journals the call under it.
    pub async fn call(
        &self,
        environment: &str,
        request: &[u8],
        (hold_stdin, operation_id): (bool, Option<&str>),
        cancel: CancelSignal,
    ) -> Result<Vec<u8>, TransportError> {
        let unreachable = |e: LocalSupervisorError| match e {
            LocalSupervisorError::Target(e) => e,
            other => TransportError::stream(format!("the environment's sandbox: {other}")),
        };
        let failed = |e: ClientError| TransportError::stream(format!("the supervisor call: {e}"));
        let mut connection = self.connect(environment).await.map_err(unreachable)?;
        connection
            .send(&SupervisorRequest::Call {
                request_bytes: request.len() as u64,
                hold_stdin,
                operation_id: operation_id.map(str::to_owned),
            })
            .await
            .map_err(failed)?;
        for chunk in request.chunks(MAX_CALL_CHUNK) {
            let input = SupervisorRequest::CallInput {
                data: chunk.to_vec(),
            };
            connection.send(&input).await.map_err(failed)?;
        }
        let (mut replies, mut writer) = connection.split();
        let reading = async {
            let mut stdout = Vec::new();
            loop {
                match replies.next_reply().await.map_err(failed)? {
                    Some(SupervisorReply::CallOutput { data }) => {
                        if stdout.len() + data.len() > MAX_JSON_BODY {
                            return Err(TransportError::stream(format!(
                                "helper stdout exceeds {MAX_JSON_BODY} bytes"
                            )));
                        }
                        stdout.extend_from_slice(&data);
                    }
                    Some(SupervisorReply::CallEnded { exit_code: 0, .. }) => return Ok(stdout),
                    Some(SupervisorReply::CallEnded { exit_code, stderr }) => {
                        let said = stderr.lines().last().unwrap_or("").trim().to_owned();
                        tracing::warn!(exit_code, stderr = said, "the executor helper failed");
                        return Err(TransportError::stream(format!(
                            "helper exited with exit status: {exit_code}: {said}"
                        )));
                    }
                    Some(SupervisorReply::Error(error)) => {
                        return Err(TransportError::stream(format!(
                            "the supervisor refused the call: {}",
                            error.message
                        )));
                    }
                    Some(other) => {
                        return Err(TransportError::stream(format!(
                            "unexpected supervisor reply {other:?}"
                        )));
                    }
                    None => return Err(failed(ClientError::Closed)),
                }
            }
        };
        let closing = async {
            cancel.cancelled().await;
            // Closing our side closes the helper's stdin: the command is cancelled and
            // still answers.
            let _ = writer.shutdown().await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            result = reading => result,
            () = closing => unreachable!("closing never completes"),
        }
    }

    async fn enroll(
        &self,
        mut connection: LocalConnection,
    ) -> Result<LocalConnection, LocalSupervisorError> {
        match connection.enroll().await? {
            SupervisorReply::Enrolled { .. } => Ok(connection),
            _ => Err(ClientError::Untagged(None).into()),
        }
    }

    fn is_running(&self, environment: &str) -> bool {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        match started.get_mut(environment) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The network of `environment`'s next sandbox, when a chooser was given.
    async fn network_of(&self, environment: &str) -> Option<Network> {
        match (&self.sandbox, self.networks.get()) {
            (Some(_), Some(networks)) => Some(networks.network_of(environment).await),
            _ => None,
        }
    }

    fn start(
        &self,
        environment: &str,
        socket: &Path,
        network: Option<Network>,
    ) -> Result<(), LocalSupervisorError> {
        let workspace = self.layout.workspace_of(environment)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.sockets)
            .map_err(LocalSupervisorError::Start)?;
        // One start per environment at a time: a concurrent caller waits for the same one.
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = started.get_mut(environment)
            && matches!(child.try_wait(), Ok(None))
        {
            return Ok(());
        }
        let mut command = match &self.sandbox {
            None => {
                std::fs::create_dir_all(&workspace).map_err(LocalSupervisorError::Start)?;
                let inner = [
                    "supervise".into(),
                    "--workspace".into(),
                    workspace.clone().into_os_string(),
                    "--socket".into(),
                    socket.as_os_str().to_owned(),
                ];
                let spec = SandboxSpec {
                    cgroup_name: self.cgroup_name_of(environment),
                    ..SandboxSpec::new(&workspace, environment)
                };
                Command::from(sandbox::plain_command(&self.layout.helper, &spec, &inner))
            }
            Some(policy) => {
                let spec = SandboxSpec {
                    network: network.unwrap_or_else(|| policy.network.clone()),
                    limits: policy.limits.clone(),
                    hidden: policy.hidden.clone(),
                    listen: Some(socket.to_owned()),
                    cgroup_name: self.cgroup_name_of(environment),
                    ..SandboxSpec::new(&workspace, environment)
                };
                let idle = policy.idle_exit.as_millis().max(1).to_string();
                let inner = [
                    "supervise".into(),
                    "--workspace".into(),
                    sandbox::WORKSPACE_PATH.into(),
                    "--idle-exit-ms".into(),
                    idle.into(),
                ];
                Command::from(sandbox::command(&self.layout.helper, &spec, &inner))
            }
        };
        let child = command
            .env_clear()
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(LocalSupervisorError::Start)?;
        started.insert(environment.to_owned(), child);
        Ok(())
    }
}

/// Supervisors this value started end with it: each holder's children are killed, and the
/// holder then reaps everything it held and exits by itself (killing the holder instead would
/// leave an unsandboxed supervisor and its commands running).
impl Drop for LocalSupervisors {
    fn drop(&mut self) {
        let started = self.started.get_mut().unwrap_or_else(|e| e.into_inner());
        for child in started.values_mut() {
            if !matches!(child.try_wait(), Ok(None)) {
                continue;
            }
            let holder = child
                .id()
                .and_then(|p| rustix::process::Pid::from_raw(p as i32));
            let held = holder.map(crate::helper::reaper::children_of);
            match held {
                Some(held) if !held.is_empty() => {
                    for pid in held {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
                // Still starting: it holds nothing yet.
                _ => {
                    let _ = child.start_kill();
                }
            }
        }
    }
}

impl EnvironmentProcesses for LocalSupervisors {
    fn end<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<(), ProcessesRemain>> {
        Box::pin(self.end_processes(environment))
    }
}

/// Whether `error` means nobody (or nobody any more) serves the socket.
fn went_away(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Frame(FrameError::Io(_)) | ClientError::Closed
    )
}
