//! An [`ExecBackend`] for the in-process API server that plays the container runtime of
//! executor Pods: `pods/exec` of [`HELPER_IN_IMAGE_PATH`] in container [`EXECUTOR_CONTAINER`]
//! runs the local `execution-helper` on the Pod's workspace directory. The dev node agent and
//! the pod-exec tests use it, so that [`super::PodExecutor`] runs the real helper through the
//! real kube-rs exec client. Any other container or argv is refused, as the image offers
//! nothing else.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use crate::kube::apiserver::exec::{ExecBackend, ExecProcess, ExecRequest};

use super::pod_exec::{EXECUTOR_CONTAINER, HELPER_IN_IMAGE_PATH};

/// Chooses the workspace directory of the Pod an exec targets (`None`: no workspace, refused).
pub type WorkspaceOf = Arc<dyn Fn(&ExecRequest) -> Option<PathBuf> + Send + Sync>;
/// Chooses the socket of the supervisor that plays the Pod's main process (`None`: the
/// helper's default, as in a Pod).
pub type SupervisorSocketOf = Arc<dyn Fn(&ExecRequest) -> Option<String> + Send + Sync>;

/// Runs `execution-helper --workspace <dir>` for executor exec requests.
#[derive(Clone)]
pub struct HelperExecBackend {
    helper: PathBuf,
    workspace_of: WorkspaceOf,
    supervisor_socket_of: Option<SupervisorSocketOf>,
}

impl std::fmt::Debug for HelperExecBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperExecBackend")
            .field("helper", &self.helper)
            .finish_non_exhaustive()
    }
}

impl HelperExecBackend {
    /// A backend running `helper` on the workspace `workspace_of` picks for each Pod.
    pub fn new(helper: impl Into<PathBuf>, workspace_of: WorkspaceOf) -> Self {
        Self {
            helper: helper.into(),
            workspace_of,
            supervisor_socket_of: None,
        }
    }

    /// Points each exec's helper at the supervisor `socket_of` picks for its Pod
    /// (`--supervisor-socket`): where a test or node runs the supervisor that is the Pod's
    /// main process, off the shared abstract name a host's Pods would collide on.
    pub fn with_supervisor_sockets(mut self, socket_of: SupervisorSocketOf) -> Self {
        self.supervisor_socket_of = Some(socket_of);
        self
    }
}

impl ExecBackend for HelperExecBackend {
    fn start(&self, request: &ExecRequest) -> Result<ExecProcess, String> {
        if request.container != EXECUTOR_CONTAINER {
            return Err(format!("container {} has no helper", request.container));
        }
        if request.command != [HELPER_IN_IMAGE_PATH] {
            return Err("executable file not found in $PATH".to_owned());
        }
        let workspace = (self.workspace_of)(request)
            .ok_or_else(|| format!("pod {} has no workspace", request.pod))?;
        let socket = self
            .supervisor_socket_of
            .as_ref()
            .and_then(|of| of(request));
        let mut helper = tokio::process::Command::new(&self.helper);
        helper.arg("--workspace").arg(workspace);
        if let Some(socket) = socket {
            helper.arg("--supervisor-socket").arg(socket);
        }
        let mut child = helper
            .env_clear()
            .stdin(if request.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the helper: {e}"))?;
        let stdin = child
            .stdin
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>);
        let stdout = Box::new(child.stdout.take().expect("stdout is piped"));
        let stderr = Box::new(child.stderr.take().expect("stderr is piped"));
        let exit = Box::pin(async move {
            let status = child.wait().await.map_err(|e| e.to_string())?;
            status
                .code()
                .ok_or_else(|| format!("helper ended by {status}"))
        });
        Ok(ExecProcess {
            stdin,
            stdout,
            stderr,
            exit,
        })
    }
}
