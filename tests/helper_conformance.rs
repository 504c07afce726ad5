//! The executor conformance cases (`tests/conformance`) run against the real
//! `execution-helper` through [`LocalTransport`], each on a fresh temporary workspace.

#[macro_use]
mod conformance;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use execution_provider::executor::transport::decode_envelope;
use execution_provider::executor::{
    BoxFuture, CancelSignal, ExecutorEnvelope, ExecutorRequest, ExecutorTarget, ExecutorTransport,
    LocalTransport, Operation, TransportError,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ENVIRONMENT: &str = "exec-conformance";

/// A temporary workspaces directory with one environment, reached through `LocalTransport`.
struct LocalFixture {
    _workspaces: tempfile::TempDir,
    root: PathBuf,
    transport: LocalTransport,
    target: ExecutorTarget,
}

impl LocalFixture {
    fn new() -> Self {
        let workspaces = tempfile::tempdir().expect("a temporary directory");
        let transport =
            LocalTransport::unisolated(env!("CARGO_BIN_EXE_execution-helper"), workspaces.path());
        let root = transport.workspace_of(ENVIRONMENT).expect("a plain name");
        std::fs::create_dir(&root).expect("the workspace directory");
        let root = std::fs::canonicalize(&root).expect("a canonical root");
        Self {
            _workspaces: workspaces,
            root,
            transport,
            target: ExecutorTarget {
                namespace: "execution".into(),
                pod_name: "executor-conformance".into(),
                environment: ENVIRONMENT.into(),
            },
        }
    }

    async fn raw_exchange(&self, frame: Vec<u8>) -> Result<ExecutorEnvelope, TransportError> {
        let mut child = tokio::process::Command::new(&self.transport.helper)
            .arg("--workspace")
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| TransportError::stream(e.to_string()))?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let feed = async move {
            // The helper stops reading after 8 MiB + 1; a broken pipe after that is expected.
            let _ = stdin.write_all(&frame).await;
        };
        let mut output = Vec::new();
        let (_, read) = tokio::join!(feed, stdout.read_to_end(&mut output));
        read.map_err(|e| TransportError::stream(e.to_string()))?;
        let status = child
            .wait()
            .await
            .map_err(|e| TransportError::stream(e.to_string()))?;
        assert!(status.success(), "the helper exits 0");
        decode_envelope(&output)
    }
}

impl conformance::Fixture for LocalFixture {
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

macro_rules! local_cases {
    ($module:ident => $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = LocalFixture::new();
                conformance::$module::$case(&fixture).await;
            }
        )*
    };
}

every_conformance_case!(local_cases);

#[test]
fn the_helper_is_found_beside_the_test_binary() {
    let found = LocalTransport::helper_beside_current_exe().expect("cargo builds the helper");
    assert!(found.ends_with("execution-helper"));
}

#[tokio::test]
async fn the_helper_creates_a_missing_workspace_root() {
    let workspaces = tempfile::tempdir().unwrap();
    let transport =
        LocalTransport::unisolated(env!("CARGO_BIN_EXE_execution-helper"), workspaces.path());
    let target = ExecutorTarget {
        namespace: "execution".into(),
        pod_name: "executor-new".into(),
        environment: "exec-new".into(),
    };
    let request = ExecutorRequest::new(Operation::FileList);
    let envelope = transport
        .execute(&target, request, CancelSignal::never())
        .await
        .expect("an answer");
    assert!(envelope.response.is_some(), "{envelope:?}");
    let meta = std::fs::metadata(workspaces.path().join("exec-new")).unwrap();
    assert!(meta.is_dir());
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o755
    );
}

#[tokio::test]
async fn abandoning_a_call_stops_its_helper_and_kills_the_command_group() {
    use conformance::Fixture as _;
    let fixture = LocalFixture::new();
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
        // Dropping the call here abandons it.
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
