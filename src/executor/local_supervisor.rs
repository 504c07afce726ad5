//! Supervisors for `dev` and tests: one `execution-helper supervise` per environment, started
//! on demand on `<workspaces>/<environment>` with its socket at `<sockets>/<environment>.sock`
//! (a directory of mode 0700), enrolled with the secret derived from the provider's key
//! (docs/commands.md §4.1, §4.2). The provider side connects through [`LocalSupervisors::connect`].

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use super::local::LocalTransport;
use super::supervisor_client::{ClientError, SupervisorConnection, connect_unix};
use super::supervisor_protocol::{FrameError, SupervisorReply, derive_secret};
use super::transport::TransportError;

/// How long a freshly started supervisor may take to listen.
pub const SUPERVISOR_START_DEADLINE: Duration = Duration::from_secs(10);
/// The namespace and Pod UID a local environment's secret is derived with.
pub const LOCAL_NAMESPACE: &str = "dev";
/// See [`LOCAL_NAMESPACE`].
pub const LOCAL_POD_UID: &str = "local";

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
    started: Mutex<BTreeMap<String, Child>>,
}

impl LocalSupervisors {
    /// Supervisors running `helper` on `<workspaces>/<environment>`, their sockets in `sockets`,
    /// their secrets derived from `key`. Supervisors this value started end with it.
    pub fn new(
        helper: impl Into<PathBuf>,
        workspaces: impl Into<PathBuf>,
        sockets: impl Into<PathBuf>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            layout: LocalTransport::new(helper, workspaces),
            sockets: sockets.into(),
            key: key.into(),
            started: Mutex::new(BTreeMap::new()),
        }
    }

    /// The socket of `environment`'s supervisor.
    pub fn socket_of(&self, environment: &str) -> Result<PathBuf, TransportError> {
        self.layout.workspace_of(environment)?;
        Ok(self.sockets.join(format!("{environment}.sock")))
    }

    /// The secret `environment`'s supervisor is enrolled with.
    pub fn secret_of(&self, environment: &str) -> [u8; 32] {
        derive_secret(&self.key, LOCAL_NAMESPACE, environment, LOCAL_POD_UID)
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
        if let Ok(connection) = connect_unix(&address, secret).await {
            if connection.enrolled_with_our_secret() {
                return Ok(connection);
            }
            return self.enroll(connection).await;
        }
        self.start(environment, &socket)?;
        let deadline = tokio::time::Instant::now() + SUPERVISOR_START_DEADLINE;
        let connection = loop {
            match connect_unix(&address, secret).await {
                Ok(connection) => break connection,
                Err(ClientError::Frame(FrameError::Io(_)))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(ClientError::Frame(FrameError::Io(_))) => {
                    return Err(LocalSupervisorError::NotListening);
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.enroll(connection).await
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

    fn start(
        &self,
        environment: &str,
        socket: &std::path::Path,
    ) -> Result<(), LocalSupervisorError> {
        let workspace = self.layout.workspace_of(environment)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.sockets)
            .map_err(LocalSupervisorError::Start)?;
        std::fs::create_dir_all(&workspace).map_err(LocalSupervisorError::Start)?;
        // One start per environment at a time: a concurrent caller waits for the same one.
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = started.get_mut(environment)
            && matches!(child.try_wait(), Ok(None))
        {
            return Ok(());
        }
        let child = Command::new(&self.layout.helper)
            .arg("supervise")
            .arg("--workspace")
            .arg(&workspace)
            .arg("--socket")
            .arg(socket)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(LocalSupervisorError::Start)?;
        started.insert(environment.to_owned(), child);
        Ok(())
    }
}
