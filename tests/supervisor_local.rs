//! `LocalSupervisors`, the `dev` side of the supervisor: one supervisor per environment,
//! started on demand, enrolled with the key-derived secret, reused by later connections, each
//! on its own workspace.

use execution_provider::executor::local_supervisor::LocalSupervisors;
use execution_provider::executor::protocol::CommandState;
use execution_provider::executor::supervisor_protocol::{
    ClaimTuple, StartRequest, SupervisorReply, SupervisorRequest,
};

fn claim() -> ClaimTuple {
    ClaimTuple {
        claim_id: "claim".into(),
        run_id: "run".into(),
        epoch: 1,
        grant_generation: 1,
    }
}

fn start(id: &str, command: &str) -> SupervisorRequest {
    SupervisorRequest::Start(StartRequest {
        command_id: id.into(),
        claim: claim(),
        lease_ms: 60_000,
        command: command.into(),
        env: Vec::new(),
        working_dir: String::new(),
        timeout_ms: 0,
        stdin: false,
        pty: None,
        window_bytes: 0,
    })
}

async fn output_of(supervisors: &LocalSupervisors, environment: &str, id: &str) -> Vec<u8> {
    let mut connection = supervisors.connect(environment).await.unwrap();
    connection
        .send(&SupervisorRequest::Follow {
            command_id: id.into(),
            claim: claim(),
            offset: 0,
        })
        .await
        .unwrap();
    let mut bytes = Vec::new();
    loop {
        match connection.next_reply().await.unwrap() {
            Some(SupervisorReply::Output { chunks, .. }) => {
                chunks.iter().for_each(|c| bytes.extend_from_slice(&c.data))
            }
            Some(SupervisorReply::Status(view)) => {
                assert_eq!(view.state, CommandState::Succeeded);
                return bytes;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn each_environment_gets_one_supervisor_on_its_own_workspace_reused_by_later_connections() {
    let dir = tempfile::tempdir().unwrap();
    let supervisors = LocalSupervisors::new(
        env!("CARGO_BIN_EXE_execution-helper"),
        dir.path().join("workspaces"),
        dir.path().join("supervisors"),
        b"dev key".to_vec(),
    );
    let first = supervisors.connect("exec-a").await.unwrap();
    let boot = first.hello().boot_id.clone();
    let again = supervisors.connect("exec-a").await.unwrap();
    assert_eq!(again.hello().boot_id, boot, "the same supervisor answers");
    assert!(again.enrolled_with_our_secret());
    let other = supervisors.connect("exec-b").await.unwrap();
    assert_ne!(
        other.hello().boot_id,
        boot,
        "another environment has its own"
    );

    for environment in ["exec-a", "exec-b"] {
        let mut connection = supervisors.connect(environment).await.unwrap();
        let reply = connection.call(&start("op-pwd", "pwd")).await.unwrap();
        assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
        let root = dir.path().join("workspaces").join(environment);
        let expected = format!("{}\n", root.canonicalize().unwrap().display());
        assert_eq!(
            output_of(&supervisors, environment, "op-pwd").await,
            expected.as_bytes()
        );
    }
    let mode = std::fs::metadata(dir.path().join("supervisors")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(mode.permissions().mode() & 0o777, 0o700);
    assert!(supervisors.connect("../escape").await.is_err());
}

/// The transport seam: `dev`'s executor opens an enrolled session for an environment when the
/// helper runs without isolation, and refuses (`Unsupported`, nothing started) when sandboxed.
#[tokio::test]
async fn the_dev_executor_opens_enrolled_sessions_only_without_isolation() {
    use execution_provider::executor::local::LocalTransport;
    use execution_provider::executor::{
        DevExecutor, ExecutorTarget, ExecutorTransport, SupervisorTarget, TransportError,
    };
    let dir = tempfile::tempdir().unwrap();
    let workspaces = dir.path().join("workspaces");
    let helper = env!("CARGO_BIN_EXE_execution-helper");
    let target = SupervisorTarget {
        executor: ExecutorTarget {
            namespace: "dev".into(),
            pod_name: "exec-a".into(),
            environment: "exec-a".into(),
        },
        pod_uid: "local".into(),
    };
    let sandboxed = DevExecutor::new(
        LocalTransport::new(helper, &workspaces),
        dir.path().join("supervisors"),
        b"dev key".to_vec(),
    );
    assert!(matches!(
        sandboxed.supervisor(&target).await.err(),
        Some(TransportError::Unsupported)
    ));
    assert!(!dir.path().join("supervisors").exists(), "nothing started");

    let executor = DevExecutor::new(
        LocalTransport::unisolated(helper, &workspaces),
        dir.path().join("supervisors"),
        b"dev key".to_vec(),
    );
    let mut session = executor.supervisor(&target).await.unwrap();
    let reply = session.call(&start("op-echo", "echo seam")).await.unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    // A second session reaches the same supervisor, which knows the command.
    let again = executor.supervisor(&target).await.unwrap();
    assert_eq!(again.hello().boot_id, session.hello().boot_id);
    assert!(
        again.enrolled_with_our_secret(),
        "the first session enrolled it"
    );
    let bad = SupervisorTarget {
        executor: ExecutorTarget {
            environment: "../escape".into(),
            ..target.executor.clone()
        },
        ..target.clone()
    };
    assert!(matches!(
        executor.supervisor(&bad).await.err(),
        Some(TransportError::InvalidTarget { .. })
    ));
}
