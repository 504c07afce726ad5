//! The dev-mode node agent: plays the kubelet for executor Pods and the volume binder for
//! workspace PVCs. A new Pod becomes Running and Ready with a workspace directory standing
//! for its PVC; a Pod being deleted is reported terminated; a PVC is reported Bound.

use std::path::PathBuf;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::kube::crd::{LABEL_ENVIRONMENT, RfcTime};
use crate::runtime::Clock;

/// The node agent of one namespace.
#[derive(Clone)]
pub struct NodeAgent {
    client: kube::Client,
    namespace: String,
    workspaces: PathBuf,
    clock: Arc<dyn Clock>,
}

impl NodeAgent {
    /// An agent for `namespace` keeping workspaces under `workspaces/<environment>`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        workspaces: PathBuf,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            workspaces,
            clock,
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
        let now = RfcTime::from_system_time(self.clock.wall()).whole_seconds();
        let patch = if pod.metadata.deletion_timestamp.is_some() {
            if matches!(phase.as_str(), "Succeeded" | "Failed") {
                return Ok(());
            }
            terminated_status(now)
        } else {
            if phase == "Running" || matches!(phase.as_str(), "Succeeded" | "Failed") {
                return Ok(());
            }
            let environment = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_ENVIRONMENT))
                .cloned()
                .unwrap_or_default();
            self.prepare_workspace(&environment)?;
            running_status(now)
        };
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
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
