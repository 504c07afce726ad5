//! The executor of `dev` and the in-process tests: one-shot helper calls through the local
//! transport ([`LocalTransport`]) and supervisor sessions through [`LocalSupervisors`]
//! (docs/commands.md §4.1, §11).
//!
//! With a sandboxed helper (`dev` by default) the supervisors are
//! [`LocalSupervisors::sandboxed`]: each is the init of its environment's sandbox
//! (docs/sandbox.md), and every helper call of the environment runs inside that same sandbox
//! through it ([`LocalTransport::through_supervisors`]), so a detached command is as confined
//! as a foreground one. With `dev --unsafe-no-isolation` they are plain child processes of the
//! provider, as the helper calls are.

use std::path::PathBuf;
use std::sync::Arc;

use super::environment_end::{EnvironmentProcesses, ProcessesRemain};
use super::local::{Isolation, LocalTransport, RunningHelpers};
use super::local_supervisor::{LocalSupervisorError, LocalSupervisors};
use super::protocol::{ExecutorEnvelope, ExecutorRequest};
use super::sandbox_networks::SandboxNetworks;
use super::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, SupervisorSession,
    SupervisorTarget, TransportError,
};

/// Where `dev` keeps the supervisor key, relative to the security directory (the file `serve`
/// reads there too).
pub const SUPERVISOR_KEY_FILE: &str = crate::security::supervisor_key::SUPERVISOR_KEY_FILE;
/// The directory of the supervisors' sockets, relative to the state directory (mode 0700).
pub const SUPERVISOR_SOCKETS_DIR: &str = "supervisors";

/// The local executor: the helper calls and the supervisors.
pub struct DevExecutor {
    helper: LocalTransport,
    supervisors: Option<Arc<LocalSupervisors>>,
}

impl DevExecutor {
    /// An executor running helper calls with `helper` and supervisors with their sockets in
    /// `sockets` and their secrets derived from `key`: sandboxed ones, through which every
    /// helper call then runs, when `helper` isolates; plain ones when it does not.
    pub fn new(helper: LocalTransport, sockets: impl Into<PathBuf>, key: Vec<u8>) -> Self {
        let (program, workspaces) = (helper.helper.clone(), helper.workspaces.clone());
        match helper.isolation.clone() {
            Isolation::None => Self {
                supervisors: Some(Arc::new(LocalSupervisors::new(
                    program, workspaces, sockets, key,
                ))),
                helper,
            },
            Isolation::Sandbox(policy) => {
                let supervisors = Arc::new(LocalSupervisors::sandboxed(
                    program, workspaces, sockets, key, policy,
                ));
                Self {
                    helper: helper.through_supervisors(supervisors.clone()),
                    supervisors: Some(supervisors),
                }
            }
        }
    }

    /// Lets `networks` choose the network of each environment's sandbox (sandboxed supervisors
    /// only; unisolated processes share the provider's network anyway).
    pub fn choose_networks_with(&self, networks: Arc<dyn SandboxNetworks>) {
        if let Some(supervisors) = &self.supervisors {
            supervisors.choose_networks_with(networks);
        }
    }

    /// What ends every process of an environment with proof (`dev`'s node agent asks it
    /// before it reports an executor Pod terminated).
    pub fn processes(&self) -> Option<Arc<dyn EnvironmentProcesses>> {
        let processes = DevProcesses {
            supervisors: self.supervisors.clone()?,
            helpers: self.helper.running_helpers().clone(),
        };
        Some(Arc::new(processes))
    }

    /// Whether this executor can open supervisor sessions.
    pub fn supervises(&self) -> bool {
        self.supervisors.is_some()
    }

    /// Whether helper calls run in sandboxes.
    pub fn isolates(&self) -> bool {
        self.helper.isolation != Isolation::None
    }

    /// [`LocalTransport::check_isolation`] through this executor's sandboxes.
    pub async fn check_isolation(&self) -> Result<(), TransportError> {
        self.helper.check_isolation().await
    }

    async fn open(&self, target: &SupervisorTarget) -> Result<SupervisorSession, TransportError> {
        let Some(supervisors) = &self.supervisors else {
            return Err(TransportError::Unsupported);
        };
        match supervisors.connect(&target.executor.environment).await {
            Ok(connection) => Ok(connection.boxed()),
            Err(LocalSupervisorError::Target(error)) => Err(error),
            Err(error) => Err(TransportError::stream(error.to_string())),
        }
    }
}

impl ExecutorTransport for DevExecutor {
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.helper.execute(target, request, cancel)
    }

    fn execute_operation<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: &'a str,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        self.helper
            .execute_operation(target, operation_id, request, cancel)
    }

    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        Box::pin(self.open(target))
    }
}

/// The processes of `dev`'s environments: the supervisors' holders, and the one-shot helper
/// calls an unsandboxed transport runs itself (outside any holder: the end waits for them).
struct DevProcesses {
    supervisors: Arc<LocalSupervisors>,
    helpers: Arc<RunningHelpers>,
}

impl EnvironmentProcesses for DevProcesses {
    fn end<'a>(&'a self, environment: &'a str) -> BoxFuture<'a, Result<(), ProcessesRemain>> {
        Box::pin(async move {
            self.supervisors.end_processes(environment).await?;
            match self.helpers.of(environment) {
                0 => Ok(()),
                running => Err(ProcessesRemain::HelpersRunning(running)),
            }
        })
    }
}

/// Reads the 32-byte supervisor key at `path`, writing a fresh one from `ids` (mode 0600) when
/// there is none yet.
pub fn load_or_create_key(
    path: &std::path::Path,
    ids: &dyn crate::runtime::IdSource,
) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::read(path) {
        Ok(key) if key.len() == 32 => return Ok(key),
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a 32-byte key", path.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut key = vec![0; 32];
    ids.fill(&mut key);
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&key)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_created_once_private_and_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SUPERVISOR_KEY_FILE);
        let ids = crate::runtime::SeededIds::new(7);
        let key = load_or_create_key(&path, &ids).unwrap();
        assert_eq!(key.len(), 32);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_key(&path, &ids).unwrap(), key);
        std::fs::write(&path, b"short").unwrap();
        assert!(load_or_create_key(&path, &ids).is_err());
    }

    #[test]
    fn a_sandboxed_helper_gets_sandboxed_supervisors() {
        let executor = DevExecutor::new(
            LocalTransport::new("/nonexistent/helper", "/nonexistent/workspaces"),
            "/nonexistent/supervisors",
            vec![0; 32],
        );
        assert!(executor.supervises() && executor.isolates());
        let supervisors = executor.supervisors.as_ref().unwrap();
        assert!(supervisors.is_sandboxed());
        let bare = DevExecutor::new(
            LocalTransport::unisolated("/nonexistent/helper", "/nonexistent/workspaces"),
            "/nonexistent/supervisors",
            vec![0; 32],
        );
        assert!(bare.supervises() && !bare.isolates());
        assert!(!bare.supervisors.as_ref().unwrap().is_sandboxed());
    }
}
