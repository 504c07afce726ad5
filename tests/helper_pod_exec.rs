//! The executor conformance cases run through [`PodExecutor`]: the real kube-rs `pods/exec`
//! WebSocket client, against the in-process API server's exec endpoint served over loopback
//! HTTP/1 with upgrades, whose backend runs the real `execution-helper` on the Pod's workspace.

#[macro_use]
mod conformance;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use execution_provider::executor::pod_exec::{EXECUTOR_CONTAINER, HELPER_IN_IMAGE_PATH};
use execution_provider::executor::transport::decode_envelope;
use execution_provider::executor::{
    BoxFuture, CancelSignal, ExecutorEnvelope, ExecutorRequest, ExecutorTarget, ExecutorTransport,
    HelperExecBackend, Operation, PodExecutor, TransportError,
};
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::apiserver::exec::{ExecBackend, ExecProcess, ExecRequest};
use execution_provider::runtime::{SeededIds, clock::OffsetClock};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const NAMESPACE: &str = "execution";
const POD: &str = "executor-conformance";

/// An API server on loopback with one executor Pod whose workspace is a temporary directory.
struct PodFixture {
    _workspace: tempfile::TempDir,
    root: PathBuf,
    api: ApiServer,
    client: kube::Client,
    transport: PodExecutor,
    target: ExecutorTarget,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PodFixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(server: ApiServer) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let server = server.clone();
            tokio::spawn(async move {
                let _ = server.serve_connection(stream).await;
            });
        }
    });
    (format!("http://{address}"), task)
}

fn executor_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"containers": [{"name": EXECUTOR_CONTAINER, "image": "executor:dev"}]},
    }))
    .unwrap()
}

impl PodFixture {
    async fn new() -> Self {
        let workspace = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(workspace.path()).unwrap();
        let clock = OffsetClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let api = ApiServer::in_memory(Arc::new(clock), Arc::new(SeededIds::new(5)));
        let pod_root = root.clone();
        api.set_exec_backend(Arc::new(HelperExecBackend::new(
            env!("CARGO_BIN_EXE_execution-helper"),
            Arc::new(move |request| (request.pod == POD).then(|| pod_root.clone())),
        )));
        Api::<Pod>::namespaced(api.client(NAMESPACE), NAMESPACE)
            .create(&PostParams::default(), &executor_pod(POD))
            .await
            .unwrap();
        let (url, server) = serve(api.clone()).await;
        let config = kube::Config::new(url.parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        Self {
            _workspace: workspace,
            root,
            transport: PodExecutor::new(client.clone()),
            api,
            client,
            target: ExecutorTarget {
                namespace: NAMESPACE.into(),
                pod_name: POD.into(),
                environment: "exec-conformance".into(),
            },
            server,
        }
    }

    /// Sends `frame` as the helper's stdin through a raw exec session.
    async fn raw_exchange(&self, frame: Vec<u8>) -> Result<ExecutorEnvelope, TransportError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let params = AttachParams::default()
            .container(EXECUTOR_CONTAINER)
            .stdin(true)
            .stderr(false);
        let mut attached = pods
            .exec(POD, [HELPER_IN_IMAGE_PATH], &params)
            .await
            .map_err(|e| TransportError::stream(e.to_string()))?;
        let mut stdin = attached.stdin().unwrap();
        let mut stdout = attached.stdout().unwrap();
        let feed = async move {
            // The helper stops reading after 8 MiB + 1; a failed write after that is expected.
            let _ = stdin.write_all(&frame).await;
            let _ = stdin.shutdown().await;
        };
        let mut output = Vec::new();
        let (_, read) = tokio::join!(feed, stdout.read_to_end(&mut output));
        read.map_err(|e| TransportError::stream(e.to_string()))?;
        decode_envelope(&output)
    }
}

impl conformance::Fixture for PodFixture {
    fn transport(&self) -> &dyn ExecutorTransport {
        &self.transport
    }

    fn target(&self) -> &ExecutorTarget {
        &self.target
    }

    fn send_raw(&self, frame: Vec<u8>) -> BoxFuture<'_, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(self.raw_exchange(frame))
    }

    fn symlink(&self, link: &str, target: &str) {
        std::os::unix::fs::symlink(target, self.root.join(link)).expect("a symlink");
    }

    fn workspace_root(&self) -> String {
        self.root.to_string_lossy().into_owned()
    }

    fn runs_commands(&self) -> bool {
        true
    }

    fn process_group_alive(&self, group: i32) -> bool {
        let group = rustix::process::Pid::from_raw(group).expect("a positive id");
        rustix::process::test_kill_process_group(group).is_ok()
    }

    fn process_alive(&self, pid: i32) -> bool {
        let pid = rustix::process::Pid::from_raw(pid).expect("a positive id");
        rustix::process::test_kill_process(pid).is_ok()
    }
}

macro_rules! pod_exec_cases {
    ($module:ident => $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = PodFixture::new().await;
                conformance::$module::$case(&fixture).await;
            }
        )*
    };
}

every_conformance_case!(pod_exec_cases);

#[tokio::test]
async fn an_exec_into_a_missing_pod_is_a_stream_failure_that_fences() {
    let fixture = PodFixture::new().await;
    let target = ExecutorTarget {
        pod_name: "executor-gone".into(),
        ..fixture.target.clone()
    };
    let err = fixture
        .transport
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

#[tokio::test]
async fn only_the_helper_in_the_executor_container_can_be_run() {
    let fixture = PodFixture::new().await;
    let pods: Api<Pod> = Api::namespaced(fixture.client.clone(), NAMESPACE);
    let params = AttachParams::default().container(EXECUTOR_CONTAINER);
    let refused = pods.exec(POD, ["/bin/sh", "-c", "id"], &params).await;
    assert!(refused.is_err(), "any other argv is refused");
    let params = AttachParams::default().container("sidecar");
    let refused = pods.exec(POD, [HELPER_IN_IMAGE_PATH], &params).await;
    assert!(refused.is_err(), "any other container is refused");
}

/// A container runtime whose process never answers (and never reads stdin).
struct SilentBackend;

impl ExecBackend for SilentBackend {
    fn start(&self, _request: &ExecRequest) -> Result<ExecProcess, String> {
        let (stdout, _keep_stdout) = tokio::io::duplex(64);
        let (stderr, _keep_stderr) = tokio::io::duplex(64);
        Ok(ExecProcess {
            stdin: None,
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            exit: Box::pin(async move {
                let _held = (_keep_stdout, _keep_stderr);
                std::future::pending::<Result<i32, String>>().await
            }),
        })
    }
}

#[tokio::test]
async fn a_helper_that_does_not_answer_by_the_deadline_is_a_stream_failure() {
    let fixture = PodFixture::new().await;
    fixture.api.set_exec_backend(Arc::new(SilentBackend));
    let transport = PodExecutor::new(fixture.client.clone())
        .with_deadlines(Duration::from_millis(200), Duration::from_millis(200));
    let result = transport
        .execute(
            &fixture.target,
            ExecutorRequest::new(Operation::FileStat),
            CancelSignal::never(),
        )
        .await;
    match result {
        Err(TransportError::StreamFailed { reason }) => {
            assert!(reason.contains("deadline"), "{reason}")
        }
        other => panic!("expected a deadline failure, got {other:?}"),
    }
}

#[tokio::test]
async fn abandoning_a_pod_exec_call_cancels_the_command_and_its_group_is_gone() {
    use conformance::Fixture as _;
    let fixture = PodFixture::new().await;
    let request = ExecutorRequest::command("c-abandon", "echo $$ > abandon.pid; sleep 60");
    let pid_file = fixture.root.join("abandon.pid");
    {
        let call = fixture
            .transport
            .execute(&fixture.target, request, CancelSignal::never());
        tokio::pin!(call);
        let started = tokio::time::timeout(conformance::PATIENCE, async {
            loop {
                tokio::select! {
                    result = &mut call => panic!("the command ended early: {result:?}"),
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
                if std::fs::read_to_string(&pid_file).is_ok_and(|pid| pid.ends_with('\n')) {
                    return;
                }
            }
        })
        .await;
        assert!(started.is_ok(), "the command started");
        // Dropping the call here abandons it: the WebSocket closes, and stdin with it.
    }
    let group: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = tokio::time::timeout(conformance::PATIENCE, async {
        while fixture.process_group_alive(group) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the abandoned command's group is gone");
}
