//! kwok serves `pods/exec` by running the requested command as a local process, chosen by an
//! `Exec` object named after the Pod. This agent stands in for the executor image and for the
//! kubelet's part in it:
//!
//! * for every `ExecutionEnvironment` in the test namespace it creates the `Exec` rule of the
//!   environment's executor Pod, with a per-environment workspace directory (kept across Pod
//!   replacement, as the PVC is) as the working directory, the helper cargo built, and the
//!   abstract socket of that Pod's supervisor;
//! * it runs the Pod's main process, `execution-helper supervise` on that socket, one per Pod
//!   incarnation (docs/commands.md §2): started before the Pod exists, so no exec reaches a
//!   Pod before its supervisor, and bound to the first Pod UID of that name it sees;
//! * the supervisor runs under a plain holder (`execution-helper --sandbox-stage plain`,
//!   `src/sandbox/reaping.rs`): a child subreaper that exits only once every process the
//!   supervisor started, however it forked, is gone;
//! * when that Pod is deleted it stops the supervisor as a kubelet stops a container
//!   (SIGTERM, then SIGKILL to whatever the holder still has past the grace), and only when the
//!   holder exited with a status (its proof, which trusts nothing the supervisor says) it
//!   marks the Pod with [`PROCESSES_ENDED`], which the suite's `e2e-pod-terminate` stage waits
//!   for before it reports the Pod terminal. A stop that proves nothing leaves the Pod
//!   terminating. Then it starts a fresh supervisor for the next Pod of that name (a
//!   replacement).
//!
//! The rule and the first supervisor exist as soon as the resource does, before the reconciler
//! has created the Pod.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use execution_provider::kube::crd::{ExecutionEnvironment, pod_name};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher;
use sha2::Digest as _;

/// The variable that tells `tests/e2e/bin/execution-helper-kwok` which helper to run.
pub const HELPER_VARIABLE: &str = "E2E_EXECUTION_HELPER";
/// The variable that tells it where the Pod's supervisor listens.
pub const SUPERVISOR_VARIABLE: &str = "E2E_SUPERVISOR_SOCKET";
/// The annotation the `e2e-pod-terminate` stage waits for: the Pod's processes are gone.
pub const PROCESSES_ENDED: &str = "e2e.execution-provider/processes-ended";
/// How long a supervisor may take to stop (its commands' grace and sweeps included).
const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// How long the holder may then take to kill and reap what is left.
const END_DEADLINE: Duration = Duration::from_secs(10);

/// True when kwok serves `pods/exec` (the Go-module control plane); false on kind, where
/// `E2E_EXEC_BACKEND=kubelet` says a real kubelet runs the executor image's helper.
pub fn kwok_serves_exec() -> bool {
    std::env::var("E2E_EXEC_BACKEND").map_or(true, |backend| backend != "kubelet")
}

/// The helper binary cargo built for this test run.
pub fn helper_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_execution-helper"))
}

/// The workspace directory of `environment` in `namespace` under the control plane's work dir.
pub fn workspace_dir(work: &Path, namespace: &str, environment: &str) -> PathBuf {
    work.join("workspaces").join(namespace).join(environment)
}

/// The abstract socket of the supervisor of Pod `pod` in `namespace`: every kwok "Pod" shares
/// the host's network namespace, so the name carries the Pod's (a real Pod's supervisor uses
/// the default name in its own namespace).
pub fn supervisor_socket(namespace: &str, pod: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{namespace}/{pod}").as_bytes());
    format!("@execution-provider-e2e-{}", hex::encode(&digest[..12]))
}

fn exec_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Exec"),
        "execs",
    )
}

/// Creates (idempotently) the exec rule and workspace directory of `environment`.
pub async fn ensure_rule(client: &kube::Client, work: &Path, namespace: &str, environment: &str) {
    let dir = workspace_dir(work, namespace, environment);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let pod = pod_name(environment);
    let rule = serde_json::json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"execs": [{"local": {
            "workDir": dir,
            "envs": [
                {"name": HELPER_VARIABLE, "value": helper_binary()},
                {"name": SUPERVISOR_VARIABLE, "value": supervisor_socket(namespace, &pod)},
            ],
        }}]},
    });
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &exec_resource());
    api.patch(
        &pod,
        &PatchParams::apply("execution-provider-e2e").force(),
        &Patch::Apply(&rule),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot create the kwok exec rule {pod}: {e}"));
}

/// One supervisor, under its holder: the main process of one Pod incarnation.
struct Supervisor {
    /// The holder (the supervisor is its child).
    child: tokio::process::Child,
    /// The Pod it serves, once one of its name was seen.
    pod_uid: Option<String>,
}

impl Supervisor {
    /// Starts a supervisor on `socket` for the workspace `workspace` and waits until it listens.
    async fn start(workspace: &Path, socket: &str, log: &Path) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let pod = socket.trim_start_matches('@');
        let inner = [
            "supervise".into(),
            "--workspace".into(),
            workspace.as_os_str().to_owned(),
            "--socket".into(),
            socket.into(),
        ];
        let spec = execution_provider::sandbox::SandboxSpec::new(workspace, pod);
        let holder = execution_provider::sandbox::plain_command(&helper_binary(), &spec, &inner);
        let child = tokio::process::Command::from(holder)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("the supervisor starts");
        let name = socket.trim_start_matches('@').as_bytes().to_vec();
        crate::cluster::eventually(Duration::from_secs(20), "the supervisor to listen", || {
            let name = name.clone();
            async move {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).ok()?;
                std::os::unix::net::UnixStream::connect_addr(&addr)
                    .ok()
                    .map(drop)
            }
        })
        .await;
        Self {
            child,
            pod_uid: None,
        }
    }

    /// SIGTERM to the supervisor, a grace to end its commands, then SIGKILL to every process
    /// the holder still has until the holder exits: true only when it exited with a status,
    /// its proof that no process of the Pod is left.
    async fn stop(mut self) -> bool {
        let Some(pid) = self.child.id() else {
            return false;
        };
        let holder = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
        for supervisor in execution_provider::helper::reaper::children_of(holder) {
            let _ = rustix::process::kill_process(supervisor, rustix::process::Signal::TERM);
        }
        let _ = tokio::time::timeout(STOP_DEADLINE, self.child.wait()).await;
        use execution_provider::executor::environment_end::end_holder;
        match end_holder(&mut self.child, END_DEADLINE).await {
            Ok(()) => true,
            Err(error) => {
                eprintln!("e2e exec agent: {error}");
                let _ = self.child.kill().await;
                false
            }
        }
    }
}

/// What the agent runs for one namespace.
struct Supervisors {
    pods: Api<Pod>,
    work: PathBuf,
    namespace: String,
    /// By Pod name: the supervisor of the current (or next) Pod of that name.
    running: BTreeMap<String, Supervisor>,
    /// Pod UIDs whose supervisor was stopped.
    ended: BTreeSet<String>,
}

impl Supervisors {
    fn log(&self, pod: &str) -> PathBuf {
        let dir = self.work.join("supervisors");
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(format!("{}-{pod}.log", self.namespace))
    }

    async fn start(&self, environment: &str) -> Supervisor {
        let pod = pod_name(environment);
        let workspace = workspace_dir(&self.work, &self.namespace, environment);
        let socket = supervisor_socket(&self.namespace, &pod);
        Supervisor::start(&workspace, &socket, &self.log(&pod)).await
    }

    /// The environment exists: its first supervisor runs.
    async fn environment(&mut self, environment: &str) {
        let pod = pod_name(environment);
        if !self.running.contains_key(&pod) {
            let supervisor = self.start(environment).await;
            self.running.insert(pod, supervisor);
        }
    }

    /// A Pod event: bind the supervisor to a new Pod, or stop it when its Pod is deleted.
    async fn pod(&mut self, pod: &Pod) {
        let (Some(name), Some(uid)) = (pod.metadata.name.clone(), pod.metadata.uid.clone()) else {
            return;
        };
        let Some(environment) = environment_of(pod) else {
            return;
        };
        if self.ended.contains(&uid) {
            return;
        }
        let Some(supervisor) = self.running.get_mut(&name) else {
            return;
        };
        let deleting = pod.metadata.deletion_timestamp.is_some();
        match supervisor.pod_uid.as_deref() {
            None => supervisor.pod_uid = Some(uid.clone()),
            Some(bound) if bound == uid => {}
            // A Pod of this name we never saw deleted (its supervisor never got the proof it
            // needs): that Pod is gone without a report, and this one needs its own supervisor.
            Some(_) => {
                let old = self.running.remove(&name).expect("present");
                let _ = old.stop().await;
                let mut fresh = self.start(&environment).await;
                fresh.pod_uid = Some(uid.clone());
                self.running.insert(name.clone(), fresh);
            }
        }
        if !deleting {
            return;
        }
        let old = self.running.remove(&name).expect("present");
        self.ended.insert(uid.clone());
        let proven = old.stop().await;
        // The next Pod of this name (a replacement) gets a fresh supervisor before this one is
        // reported terminal, so it exists before that Pod can.
        let fresh = self.start(&environment).await;
        self.running.insert(name.clone(), fresh);
        if proven {
            self.report_ended(&name, &uid).await;
        } else {
            eprintln!(
                "e2e exec agent: the supervisor of {}/{name} ({uid}) did not prove its processes gone; the Pod stays terminating",
                self.namespace
            );
        }
    }

    /// Marks exactly the Pod `uid`: the UID in the patch is a precondition (a Pod of the same
    /// name with another UID refuses it).
    async fn report_ended(&self, name: &str, uid: &str) {
        let patch = serde_json::json!({"metadata": {
            "uid": uid,
            "annotations": {PROCESSES_ENDED: "true"},
        }});
        if let Err(e) = self
            .pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            eprintln!("e2e exec agent: cannot mark {}/{name}: {e}", self.namespace);
        }
    }

    /// Stops every supervisor (the test is over).
    async fn stop_all(&mut self) {
        for (_, supervisor) in std::mem::take(&mut self.running) {
            let _ = supervisor.stop().await;
        }
    }
}

/// The environment an executor Pod belongs to, from its label.
fn environment_of(pod: &Pod) -> Option<String> {
    pod.metadata
        .labels
        .as_ref()?
        .get(execution_provider::kube::crd::LABEL_ENVIRONMENT)
        .cloned()
}

/// The running agent of one namespace.
pub struct Agent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// Stops the agent and every supervisor it runs, each as a Pod's deletion would.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// Watches the namespace's environments and executor Pods, giving each environment its exec
/// rule and each Pod its supervisor, until stopped.
pub fn spawn_agent(client: kube::Client, work: PathBuf, namespace: String) -> Agent {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let environments = Api::<ExecutionEnvironment>::namespaced(client.clone(), &namespace);
        let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
        let mut env_events = watcher(environments, watcher::Config::default()).boxed();
        let mut pod_events = watcher(pods.clone(), watcher::Config::default()).boxed();
        let mut supervisors = Supervisors {
            pods,
            work: work.clone(),
            namespace: namespace.clone(),
            running: BTreeMap::new(),
            ended: BTreeSet::new(),
        };
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                Some(event) = env_events.next() => {
                    let env = match event {
                        Ok(watcher::Event::Apply(env) | watcher::Event::InitApply(env)) => env,
                        _ => continue,
                    };
                    if let Some(name) = env.metadata.name.as_deref() {
                        ensure_rule(&client, &work, &namespace, name).await;
                        supervisors.environment(name).await;
                    }
                }
                Some(event) = pod_events.next() => {
                    if let Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event {
                        supervisors.pod(&pod).await;
                    }
                }
            }
        }
        supervisors.stop_all().await;
    });
    Agent {
        stop: Some(stop),
        task,
    }
}
