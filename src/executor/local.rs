//! The local transport: `execution-helper` run as a child process on a per-environment
//! workspace directory (the `dev` world and the helper's own tests).
//!
//! It follows the pod-exec framing of k8s-executor §4.1: the request JSON on stdin (plus `\n`
//! and held open for `command.start`), stdout captured up to 8 MiB and stderr up to 64 KiB,
//! strict envelope decoding, and a deadline. The workspace root is chosen here, by the
//! launcher, and never by the request.
//!
//! With [`Isolation::Sandbox`] (what `dev` uses unless `--unsafe-no-isolation`) each helper
//! call runs in a sandbox of its environment ([`crate::sandbox`]) that sees the workspace at
//! `/workspace`. Given [`LocalTransport::through_supervisors`] (what `dev` does) that is the
//! environment's one sandbox, whose init is its executor supervisor: the call is a `call` on
//! that supervisor, which runs the same one-shot helper inside it. Without, each call builds
//! a sandbox of its own (docs/sandbox.md compares the two).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::sandbox::{self, Limits, Network, SandboxSpec};

use super::local_supervisor::LocalSupervisors;

use super::protocol::{
    ExecutorEnvelope, ExecutorRequest, MAX_JSON_BODY, Operation, command_timeout,
};
use super::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, TransportError, decode_envelope,
    encode_request,
};

/// File name of the helper binary.
pub const HELPER_BINARY_NAME: &str = "execution-helper";
/// Largest helper stderr kept before the stream counts as failed (64 KiB).
pub const MAX_HELPER_STDERR: usize = 64 * 1024;
/// Deadline for one file operation.
pub const FILE_OPERATION_DEADLINE: Duration = Duration::from_secs(120);
/// Added to a command's timeout for the helper's cleanup and answer.
pub const COMMAND_DEADLINE_GRACE: Duration = Duration::from_secs(60);
/// How long an abandoned helper gets to clean up after its stdin closes before it is killed.
pub const ABANDONED_HELPER_GRACE: Duration = Duration::from_secs(5);

/// The scratch workspace of [`LocalTransport::check_isolation`] (no environment name starts
/// with a dot).
pub const ISOLATION_CHECK_WORKSPACE: &str = ".isolation-check";

/// Whether the helper runs in a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// In a sandbox of the environment, with these bounds.
    Sandbox(SandboxPolicy),
    /// As a plain child process with the provider's own privileges: `dev
    /// --unsafe-no-isolation`, and the tests of the helper's own confinement.
    None,
}

/// How long an environment's sandbox lives with no running command and no open connection.
pub const DEFAULT_SANDBOX_IDLE_EXIT: Duration = Duration::from_secs(600);

/// What every sandbox of this transport gets besides its workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// Its network.
    pub network: Network,
    /// Its bounds.
    pub limits: Limits,
    /// Host paths it must never see (the provider's state directory).
    pub hidden: Vec<PathBuf>,
    /// An environment's sandbox (whose init is its supervisor) stops after this long idle.
    pub idle_exit: Duration,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy {
            network: Network::None,
            limits: Limits::default(),
            hidden: Vec::new(),
            idle_exit: DEFAULT_SANDBOX_IDLE_EXIT,
        }
    }
}

/// Runs `execution-helper` locally on `<workspaces>/<environment>`.
#[derive(Clone, Debug)]
pub struct LocalTransport {
    /// The helper binary.
    pub helper: PathBuf,
    /// The directory holding one workspace directory per environment.
    pub workspaces: PathBuf,
    /// Sandboxed or not.
    pub isolation: Isolation,
    /// When set (and sandboxed), every call runs in the environment's own sandbox through its
    /// supervisor instead of a sandbox of its own.
    supervisors: Option<Arc<LocalSupervisors>>,
    /// The helper processes of this transport's own (not through a supervisor) that have not
    /// exited yet, by environment.
    running: Arc<RunningHelpers>,
}

/// Counts the helper processes a transport started itself, per environment, until each has
/// exited: they run outside the environment's holder, so its end proves nothing about them
/// (`executor::environment_end`).
#[derive(Debug, Default)]
pub struct RunningHelpers(std::sync::Mutex<std::collections::BTreeMap<String, usize>>);

impl RunningHelpers {
    /// How many helper processes of `environment` have not exited.
    pub fn of(&self, environment: &str) -> usize {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(environment).copied().unwrap_or(0)
    }

    fn enter(self: &Arc<Self>, environment: &str) -> RunningHelper {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(environment.to_owned()).or_default() += 1;
        RunningHelper {
            helpers: self.clone(),
            environment: environment.to_owned(),
        }
    }
}

/// One counted helper process; dropped once it has exited.
#[derive(Debug)]
struct RunningHelper {
    helpers: Arc<RunningHelpers>,
    environment: String,
}

impl Drop for RunningHelper {
    fn drop(&mut self) {
        let mut counts = self.helpers.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.environment) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.environment);
            }
        }
    }
}

impl LocalTransport {
    /// A transport running `helper` in a sandbox per environment on workspaces under
    /// `workspaces`, hiding `workspaces` and its parent directory from every sandbox.
    pub fn new(helper: impl Into<PathBuf>, workspaces: impl Into<PathBuf>) -> Self {
        let workspaces = workspaces.into();
        let hidden = [Some(workspaces.as_path()), workspaces.parent()]
            .into_iter()
            .flatten()
            .filter(|p| !p.as_os_str().is_empty() && *p != Path::new("/"))
            .map(Path::to_path_buf)
            .collect();
        Self {
            helper: helper.into(),
            workspaces,
            isolation: Isolation::Sandbox(SandboxPolicy {
                hidden,
                ..SandboxPolicy::default()
            }),
            supervisors: None,
            running: Arc::default(),
        }
    }

    /// The helper processes this transport started itself and that have not exited.
    pub fn running_helpers(&self) -> &Arc<RunningHelpers> {
        &self.running
    }

    /// The policy of this transport's sandboxes (`None` without isolation).
    pub fn sandbox_policy(&self) -> Option<&SandboxPolicy> {
        match &self.isolation {
            Isolation::Sandbox(policy) => Some(policy),
            Isolation::None => None,
        }
    }

    /// Runs every call of a sandboxed transport in the environment's sandbox of `supervisors`
    /// (which must be [`LocalSupervisors::sandboxed`]) instead of a sandbox per call.
    pub fn through_supervisors(self, supervisors: Arc<LocalSupervisors>) -> Self {
        assert!(
            supervisors.is_sandboxed(),
            "calls go through sandboxed supervisors only"
        );
        Self {
            supervisors: Some(supervisors),
            ..self
        }
    }

    /// A transport running `helper` with no isolation at all.
    pub fn unisolated(helper: impl Into<PathBuf>, workspaces: impl Into<PathBuf>) -> Self {
        Self {
            isolation: Isolation::None,
            ..Self::new(helper, workspaces)
        }
    }

    /// Runs one file operation in a sandbox over a scratch workspace, so that `dev` refuses to
    /// start (rather than fail every call) where the kernel cannot isolate.
    pub async fn check_isolation(&self) -> Result<(), TransportError> {
        let target = ExecutorTarget {
            namespace: String::new(),
            pod_name: String::new(),
            environment: ISOLATION_CHECK_WORKSPACE.to_owned(),
        };
        let request = ExecutorRequest::new(Operation::FileStat);
        let answer = self
            .run(&target, None, request, CancelSignal::never())
            .await;
        if let Some(supervisors) = &self.supervisors {
            supervisors.stop(ISOLATION_CHECK_WORKSPACE).await;
        }
        let _ = std::fs::remove_dir(self.workspaces.join(ISOLATION_CHECK_WORKSPACE));
        match answer?.response {
            Some(_) => Ok(()),
            None => Err(TransportError::stream(
                "the isolation check was refused by the helper",
            )),
        }
    }

    /// The launch of the helper for `environment` on `workspace`.
    fn helper_command(&self, environment: &str, workspace: &Path) -> Command {
        match &self.isolation {
            Isolation::None => {
                let mut command = Command::new(&self.helper);
                command.arg("--workspace").arg(workspace);
                command
            }
            Isolation::Sandbox(policy) => {
                let spec = SandboxSpec {
                    network: policy.network.clone(),
                    limits: policy.limits.clone(),
                    hidden: policy.hidden.clone(),
                    ..SandboxSpec::new(workspace, environment)
                };
                let inner = ["--workspace".into(), sandbox::WORKSPACE_PATH.into()];
                Command::from(sandbox::command(&self.helper, &spec, &inner))
            }
        }
    }

    /// The `execution-helper` next to the running executable (or next to its parent directory
    /// when the executable is a test binary in `target/*/deps`).
    pub fn helper_beside_current_exe() -> std::io::Result<PathBuf> {
        let exe = std::env::current_exe()?;
        let dir = exe.parent().unwrap_or(Path::new("."));
        let beside = dir.join(HELPER_BINARY_NAME);
        if beside.is_file() {
            return Ok(beside);
        }
        if dir.file_name().is_some_and(|name| name == "deps")
            && let Some(above) = dir.parent().map(|p| p.join(HELPER_BINARY_NAME))
            && above.is_file()
        {
            return Ok(above);
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{HELPER_BINARY_NAME} not found beside {}", exe.display()),
        ))
    }

    /// The workspace directory of `environment`; the name must be one plain path component.
    pub fn workspace_of(&self, environment: &str) -> Result<PathBuf, TransportError> {
        let plain = !environment.is_empty()
            && environment.len() <= 253
            && environment != "."
            && environment != ".."
            && environment
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !plain {
            return Err(TransportError::InvalidTarget {
                reason: "environment name is not a plain lowercase name".to_owned(),
            });
        }
        Ok(self.workspaces.join(environment))
    }

    async fn run(
        &self,
        target: &ExecutorTarget,
        operation_id: Option<&str>,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> Result<ExecutorEnvelope, TransportError> {
        let body = encode_request(&request)?;
        let workspace = self.workspace_of(&target.environment)?;
        let is_command = request.operation == Operation::CommandStart;
        let deadline = if is_command {
            command_timeout(request.timeout_ms) + COMMAND_DEADLINE_GRACE
        } else {
            FILE_OPERATION_DEADLINE
        };
        if let (Isolation::Sandbox(_), Some(supervisors)) = (&self.isolation, &self.supervisors) {
            let call = supervisors.call(
                &target.environment,
                &body,
                (is_command, operation_id),
                cancel,
            );
            let stdout = tokio::time::timeout(deadline, call)
                .await
                .map_err(|_| TransportError::stream("executor deadline exceeded"))??;
            return decode_envelope(&stdout);
        }
        let command = self.helper_command(&target.environment, &workspace);
        let running = self.running.enter(&target.environment);
        let mut helper = HelperProcess::spawn(command, &self.helper, running)?;
        let exchange = helper.exchange(body, is_command, cancel);
        let stdout = tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| TransportError::stream("executor deadline exceeded"))??;
        decode_envelope(&stdout)
    }
}

impl ExecutorTransport for LocalTransport {
    fn execute<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(self.run(target, None, request, cancel))
    }

    /// In a sandbox the call runs in the environment's supervisor, journaled under
    /// `operation_id`; without one, as [`ExecutorTransport::execute`].
    fn execute_operation<'a>(
        &'a self,
        target: &'a ExecutorTarget,
        operation_id: &'a str,
        request: ExecutorRequest,
        cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(self.run(target, Some(operation_id), request, cancel))
    }
}

/// One helper child process. If it is dropped before the helper exited (the call was abandoned
/// or timed out), its stdin is already closed, and the helper gets
/// [`ABANDONED_HELPER_GRACE`] to cancel and clean up its command before it is killed.
struct HelperProcess {
    child: Option<Child>,
    /// Counts this process until it has exited.
    running: Option<RunningHelper>,
}

impl HelperProcess {
    fn spawn(
        mut command: Command,
        helper: &Path,
        running: RunningHelper,
    ) -> Result<Self, TransportError> {
        let child = command
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                TransportError::stream(format!("cannot start {}: {e}", helper.display()))
            })?;
        Ok(Self {
            child: Some(child),
            running: Some(running),
        })
    }

    /// Feeds the request, reads the bounded outputs and waits for the helper to exit.
    async fn exchange(
        &mut self,
        body: Vec<u8>,
        is_command: bool,
        cancel: CancelSignal,
    ) -> Result<Vec<u8>, TransportError> {
        let child = self
            .child
            .as_mut()
            .expect("the child is present until drop");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");

        let feeding = Box::pin(async move {
            // Write errors are ignored: if the helper stopped reading, its answer says why.
            if stdin.write_all(&body).await.is_ok() && is_command {
                let held = stdin.write_all(b"\n").await.is_ok() && stdin.flush().await.is_ok();
                if held {
                    cancel.cancelled().await;
                }
            }
            drop(stdin);
        });
        let reading = async {
            tokio::try_join!(
                read_bounded(stdout, MAX_JSON_BODY, "stdout"),
                read_bounded(stderr, MAX_HELPER_STDERR, "stderr")
            )
        };
        tokio::pin!(reading);
        let mut feeding = Some(feeding);
        let outputs = loop {
            match feeding.as_mut() {
                Some(feed) => {
                    tokio::select! {
                        outputs = &mut reading => break outputs,
                        () = feed => feeding = None,
                    }
                }
                None => break reading.await,
            }
        };
        // Closes stdin if the helper answered while it was still held open.
        drop(feeding);
        let (stdout, stderr) = outputs?;
        let status = child
            .wait()
            .await
            .map_err(|e| TransportError::stream(format!("waiting for the helper: {e}")))?;
        self.child = None;
        if !status.success() {
            let said = String::from_utf8_lossy(&stderr);
            let said = said.lines().last().unwrap_or("").trim();
            tracing::warn!(%status, stderr = said, "the executor helper failed");
            return Err(TransportError::stream(format!(
                "helper exited with {status}: {said}"
            )));
        }
        Ok(stdout)
    }
}

impl Drop for HelperProcess {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        drop(child.stdin.take());
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let running = self.running.take();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if tokio::time::timeout(ABANDONED_HELPER_GRACE, child.wait())
                        .await
                        .is_err()
                    {
                        let _ = child.kill().await;
                    }
                    drop(running);
                });
            }
            Err(_) => {
                let _ = child.start_kill();
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_are_keyed_by_plain_environment_names_only() {
        let transport = LocalTransport::new("/bin/helper", "/var/ws");
        assert_eq!(
            transport.workspace_of("exec-0123abcd").unwrap(),
            PathBuf::from("/var/ws/exec-0123abcd")
        );
        for bad in ["", ".", "..", "../x", "a/b", "/abs", "UPPER", "a\0b"] {
            assert!(
                matches!(
                    transport.workspace_of(bad),
                    Err(TransportError::InvalidTarget { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_missing_helper_binary_is_a_stream_failure() {
        let transport = LocalTransport::new("/nonexistent/execution-helper", "/tmp");
        let target = ExecutorTarget {
            namespace: "ns".into(),
            pod_name: "executor-x".into(),
            environment: "exec-x".into(),
        };
        let err = transport
            .execute(
                &target,
                ExecutorRequest::new(Operation::FileStat),
                CancelSignal::never(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, TransportError::StreamFailed { .. }), "{err}");
        assert!(err.is_uncontrolled());
    }
}
