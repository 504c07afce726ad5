//! kwok serves `pods/exec` by running the requested command as a local process, chosen by an
//! `Exec` object named after the Pod. This agent stands in for the executor image: for every
//! `ExecutionEnvironment` in the test namespace it creates the `Exec` rule of the environment's
//! executor Pod, with a per-environment workspace directory (kept across Pod replacement, as
//! the PVC is) as the working directory and the helper cargo built in the environment.
//!
//! The rule is created as soon as the resource exists, before the reconciler has created the
//! Pod, so no exec can reach the Pod before its rule.

use std::path::{Path, PathBuf};

use execution_provider::kube::crd::{ExecutionEnvironment, pod_name};
use futures::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher;

/// The variable that tells `tests/e2e/bin/execution-helper-kwok` which helper to run.
pub const HELPER_VARIABLE: &str = "E2E_EXECUTION_HELPER";

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
            "envs": [{"name": HELPER_VARIABLE, "value": helper_binary()}],
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

/// Watches the namespace's environments and gives each one its exec rule until aborted.
pub fn spawn_agent(
    client: kube::Client,
    work: PathBuf,
    namespace: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api = Api::<ExecutionEnvironment>::namespaced(client.clone(), &namespace);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let env = match event {
                Ok(watcher::Event::Apply(env) | watcher::Event::InitApply(env)) => env,
                _ => continue,
            };
            if let Some(name) = env.metadata.name.as_deref() {
                ensure_rule(&client, &work, &namespace, name).await;
            }
        }
    })
}
