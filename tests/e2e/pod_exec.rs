//! The production executor transport (`PodExecutor`: `pods/exec` over WebSocket) against a
//! real API server: the API server forwards the exec to kwok, which runs the helper on the
//! Pod's workspace directory. Files land in that directory, commands report exit codes, and
//! closing stdin cancels a running command.

use std::time::Duration;

use execution_provider::executor::pod_exec::{EXECUTOR_CONTAINER, PodExecutor};
use execution_provider::executor::protocol::{
    CommandState, ExecutorEnvelope, ExecutorRequest, ExecutorResponse, Operation,
};
use execution_provider::executor::transport::{
    CancelHandle, CancelSignal, ExecutorTarget, ExecutorTransport,
};
use execution_provider::kube::crd::pod_name;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::cluster::{Cluster, eventually};
use crate::kwok_exec::{ensure_rule, workspace_dir};

/// A Pod that satisfies Pod Security `restricted`, with the executor's container name.
fn restricted_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": EXECUTOR_CONTAINER,
                "image": "registry.invalid/executor@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "command": ["/bin/sh", "-c", "sleep infinity"],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true
                }
            }]
        }
    }))
    .unwrap()
}

async fn call(
    transport: &PodExecutor,
    target: &ExecutorTarget,
    request: ExecutorRequest,
    cancel: CancelSignal,
) -> ExecutorResponse {
    let envelope: ExecutorEnvelope = transport
        .execute(target, request, cancel)
        .await
        .expect("the helper answers through pods/exec");
    envelope
        .response
        .unwrap_or_else(|| panic!("the helper refused: {:?}", envelope.error))
}

fn command(text: &str, id: &str) -> ExecutorRequest {
    let mut request = ExecutorRequest::new(Operation::CommandStart);
    request.command = text.to_owned();
    request.command_id = id.to_owned();
    request.timeout_ms = 30_000;
    request
}

pub async fn the_pod_exec_transport_runs_the_helper_in_a_kwok_pod_through_the_api_server(
    cluster: Cluster,
) {
    if !crate::kwok_exec::kwok_serves_exec() {
        eprintln!("skipped: this case drives kwok's exec; on kind the flow tests cover pods/exec");
        return;
    }
    let ns = cluster.namespace("podexec").await;
    let environment = "exec-e2e-transport";
    let pod = pod_name(environment);
    ensure_rule(&ns.client, &cluster.work, &ns.name, environment).await;
    let pods = Api::<Pod>::namespaced(ns.client.clone(), &ns.name);
    pods.create(&PostParams::default(), &restricted_pod(&pod))
        .await
        .expect("a restricted Pod is admitted");
    eventually(
        Duration::from_secs(60),
        "kwok to mark the Pod ready",
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                let status = pods.get(&pod).await.ok()?.status?;
                let ready = status
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            }
        },
    )
    .await;

    let transport = PodExecutor::new(ns.client.clone());
    let target = ExecutorTarget {
        namespace: ns.name.clone(),
        pod_name: pod.clone(),
        environment: environment.to_owned(),
    };
    let mut create = ExecutorRequest::new(Operation::FileCreate);
    create.path = "notes.txt".to_owned();
    create.data = b"written through pods/exec\n".to_vec();
    let created = call(&transport, &target, create, CancelSignal::never()).await;
    assert_eq!(
        created.version.len(),
        64,
        "a created file reports its version"
    );
    let on_disk = workspace_dir(&cluster.work, &ns.name, environment).join("notes.txt");
    assert_eq!(
        std::fs::read(&on_disk).unwrap(),
        b"written through pods/exec\n"
    );

    let mut read = ExecutorRequest::new(Operation::FileRead);
    read.path = "notes.txt".to_owned();
    let read = call(&transport, &target, read, CancelSignal::never()).await;
    assert_eq!(read.data, b"written through pods/exec\n");
    assert_eq!(read.version, created.version);

    let failed = call(
        &transport,
        &target,
        command("cat notes.txt; exit 3", "c1"),
        CancelSignal::never(),
    )
    .await
    .command
    .expect("a command status");
    assert_eq!(failed.state, CommandState::Failed);
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.stdout, b"written through pods/exec\n");
    assert_eq!(failed.terminal_receipt.len(), 64);

    // A running command is cancelled by closing stdin: cancel once its marker file exists.
    let (handle, signal) = CancelHandle::new();
    let marker = workspace_dir(&cluster.work, &ns.name, environment).join("started");
    let running = call(
        &transport,
        &target,
        command("touch started; sleep 60", "c2"),
        signal,
    );
    let cancel_once_started = async {
        eventually(Duration::from_secs(30), "the command to start", || {
            let exists = marker.exists();
            async move { exists.then_some(()) }
        })
        .await;
        handle.cancel();
    };
    let (cancelled, ()) = tokio::join!(running, cancel_once_started);
    let cancelled = cancelled.command.expect("a command status");
    assert_eq!(cancelled.state, CommandState::Cancelled, "{cancelled:?}");
    assert!(cancelled.terminal_receipt.len() == 64);

    ns.delete().await;
}
