//! The dev-mode node agent: plays the kubelet for executor Pods and the volume binder for
//! workspace PVCs. A new Pod becomes Running and Ready with a workspace directory standing
//! for its PVC; a PVC is reported Bound. A Pod being deleted is reported terminated only once
//! every process of its environment (the supervisor and everything under it) is proven gone
//! ([`EnvironmentProcesses`]); until then it stays terminating, and the agent tries again
//! every [`END_RETRY`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::executor::environment_end::EnvironmentProcesses;
use crate::kube::crd::{LABEL_ENVIRONMENT, RfcTime};
use crate::runtime::Clock;

/// Pause before the agent tries again to end the processes of a Pod being deleted.
pub const END_RETRY: Duration = Duration::from_secs(1);

/// The node agent of one namespace.
#[derive(Clone)]
pub struct NodeAgent {
    client: kube::Client,
    namespace: String,
    workspaces: PathBuf,
    clock: Arc<dyn Clock>,
    processes: Arc<dyn EnvironmentProcesses>,
    /// The Pods (by UID) whose end is under way.
    ending: Arc<Mutex<BTreeSet<String>>>,
}

impl NodeAgent {
    /// An agent for `namespace` keeping workspaces under `workspaces/<environment>` and
    /// ending the environments' processes through `processes`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        workspaces: PathBuf,
        clock: Arc<dyn Clock>,
        processes: Arc<dyn EnvironmentProcesses>,
    ) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            workspaces,
            clock,
            processes,
            ending: Arc::default(),
        }
    }

    /// Runs until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::select! {
            () = self.clone().run_pods() => {}
            () = self.run_pvcs() => {}
            () = shutdown => {}
        }
    }

    async fn run_pods(self) {
        let api = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().labels(LABEL_ENVIRONMENT);
        let mut pods = watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            match pods.try_next().await {
                Ok(Some(pod)) => {
                    if let Err(error) = self.observe_pod(&api, &pod).await {
                        tracing::warn!(%error, "node agent could not update a Pod");
                    }
                }
                Ok(None) => return,
                Err(error) => tracing::debug!(%error, "node agent Pod watch restarting"),
            }
        }
    }

    async fn run_pvcs(self) {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().labels(LABEL_ENVIRONMENT);
        let mut pvcs = watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            match pvcs.try_next().await {
                Ok(Some(pvc)) => {
                    if let Err(error) = bind(&api, &pvc).await {
                        tracing::warn!(%error, "node agent could not bind a PVC");
                    }
                }
                Ok(None) => return,
                Err(error) => tracing::debug!(%error, "node agent PVC watch restarting"),
            }
        }
    }

    async fn observe_pod(&self, api: &Api<Pod>, pod: &Pod) -> Result<(), NodeAgentError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if matches!(phase.as_str(), "Succeeded" | "Failed") {
            return Ok(());
        }
        let environment = environment_of(pod);
        if pod.metadata.deletion_timestamp.is_some() {
            self.end_then_report(api, pod, environment);
            return Ok(());
        }
        if phase == "Running" {
            return Ok(());
        }
        self.prepare_workspace(&environment)?;
        let now = RfcTime::from_system_time(self.clock.wall()).whole_seconds();
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(running_status(now)),
        )
        .await?;
        Ok(())
    }

    /// Ends every process of the deleted Pod's environment and, once that is proven, reports
    /// its containers terminated; tries again while it is not (one attempt per Pod at a time).
    fn end_then_report(&self, api: &Api<Pod>, pod: &Pod, environment: String) {
        let (Some(uid), Some(name)) = (pod.metadata.uid.clone(), pod.metadata.name.clone()) else {
            return;
        };
        if !self.lock_ending().insert(uid.clone()) {
            return;
        }
        let (agent, api) = (self.clone(), api.clone());
        tokio::spawn(async move {
            loop {
                match agent.processes.end(&environment).await {
                    Ok(()) => {
                        let now = RfcTime::from_system_time(agent.clock.wall()).whole_seconds();
                        let patch = Patch::Merge(terminated_status(now));
                        if let Err(error) = api
                            .patch_status(&name, &PatchParams::default(), &patch)
                            .await
                        {
                            tracing::warn!(%error, pod = name, "node agent could not report a Pod terminated");
                        }
                        break;
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        pod = name,
                        "the deleted Pod's processes are not proven gone; it stays terminating"
                    ),
                }
                tokio::time::sleep(END_RETRY).await;
                let still_ours = api.get_opt(&name).await.ok().flatten().is_some_and(|p| {
                    p.metadata.uid.as_deref() == Some(uid.as_str())
                        && p.metadata.deletion_timestamp.is_some()
                });
                if !still_ours {
                    break;
                }
            }
            agent.lock_ending().remove(&uid);
        });
    }

    fn lock_ending(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.ending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates the directory that stands for the environment's PVC.
    fn prepare_workspace(&self, environment: &str) -> Result<(), NodeAgentError> {
        let valid = !environment.is_empty()
            && environment
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(NodeAgentError::BadEnvironmentLabel);
        }
        std::fs::create_dir_all(self.workspaces.join(environment))?;
        Ok(())
    }
}

/// Why the agent could not act on an object.
#[derive(Debug, thiserror::Error)]
pub enum NodeAgentError {
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The workspace directory could not be created.
    #[error("workspace directory: {0}")]
    Io(#[from] std::io::Error),
    /// The environment label is not a plain resource name.
    #[error("environment label is not a resource name")]
    BadEnvironmentLabel,
}

/// The environment a Pod belongs to, from its label.
fn environment_of(pod: &Pod) -> String {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ENVIRONMENT))
        .cloned()
        .unwrap_or_default()
}

async fn bind(
    api: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
) -> Result<(), NodeAgentError> {
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Bound") || pvc.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let requested = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let patch = json!({"status": {
        "phase": "Bound",
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": requested},
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

fn condition(type_: &str, status: &str, now: &RfcTime) -> serde_json::Value {
    json!({"type": type_, "status": status, "lastTransitionTime": now})
}

fn running_status(now: RfcTime) -> serde_json::Value {
    json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": now,
        "conditions": [
            condition("PodScheduled", "True", &now),
            condition("Initialized", "True", &now),
            condition("ContainersReady", "True", &now),
            condition("Ready", "True", &now),
        ],
        "containerStatuses": [{
            "name": "executor",
            "ready": true,
            "started": true,
            "restartCount": 0,
            "image": "",
            "imageID": "",
            "state": {"running": {"startedAt": now}},
        }],
    }})
}

fn terminated_status(now: RfcTime) -> serde_json::Value {
    json!({"status": {
        "phase": "Failed",
        "conditions": [
            condition("ContainersReady", "False", &now),
            condition("Ready", "False", &now),
        ],
        "containerStatuses": [{
            "name": "executor",
            "ready": false,
            "started": false,
            "restartCount": 0,
            "image": "",
            "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "Killed", "finishedAt": now}},
        }],
    }})
}
