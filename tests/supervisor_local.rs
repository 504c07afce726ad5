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
        request_digest: String::new(),
        replay_only: false,
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
    let supervisors = unsandboxed(dir.path());
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

/// The transport seam: `dev`'s executor opens an enrolled session for an environment, with the
/// helper sandboxed (the session's commands then run in the environment's sandbox, the same
/// one its helper calls run in) and without isolation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_executor_opens_enrolled_sessions_with_and_without_isolation() {
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
        dir.path().join("sandboxed"),
        b"dev key".to_vec(),
    );
    let mut session = sandboxed.supervisor(&target).await.unwrap();
    let reply = session
        .call(&start("op-tmp", "echo seam > /tmp/seam"))
        .await
        .unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    let mut request = execution_provider::executor::protocol::ExecutorRequest::new(
        execution_provider::executor::protocol::Operation::CommandStart,
    );
    request.command = "cat /tmp/seam && tr '\\0' ' ' < /proc/1/cmdline".into();
    request.command_id = "op-cat".into();
    request.timeout_ms = 10_000;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let envelope = sandboxed
            .execute(
                &target.executor,
                request.clone(),
                execution_provider::executor::CancelSignal::never(),
            )
            .await
            .unwrap();
        let status = envelope
            .response
            .and_then(|r| r.command)
            .expect("a command status");
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        if text.contains("seam") {
            assert!(
                text.contains("supervise"),
                "PID 1 is the supervisor: {text}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        !workspaces.join("exec-a").join("seam").exists()
            && !std::path::Path::new("/tmp/seam").exists(),
        "the command wrote the sandbox's /tmp"
    );

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

/// The host pids of the processes whose command line names `needle` (as one argument or part
/// of one).
fn host_pids_naming(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Supervisors of `dir` without a sandbox (`dev --unsafe-no-isolation`).
fn unsandboxed(dir: &std::path::Path) -> LocalSupervisors {
    LocalSupervisors::new(
        env!("CARGO_BIN_EXE_execution-helper"),
        dir.join("workspaces"),
        dir.join("supervisors"),
        b"dev key".to_vec(),
    )
}

fn sandboxed(dir: &std::path::Path, idle_exit: std::time::Duration) -> LocalSupervisors {
    use execution_provider::executor::local::SandboxPolicy;
    LocalSupervisors::sandboxed(
        env!("CARGO_BIN_EXE_execution-helper"),
        dir.join("workspaces"),
        dir.join("supervisors"),
        b"dev key".to_vec(),
        SandboxPolicy {
            hidden: vec![dir.to_owned()],
            idle_exit,
            ..SandboxPolicy::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_supervisor_stops_when_idle_and_a_fresh_one_starts_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let supervisors = sandboxed(dir.path(), std::time::Duration::from_millis(300));
    let first = supervisors.connect("exec-a").await.unwrap();
    let boot = first.hello().boot_id.clone();
    assert!(supervisors.started_pid("exec-a").is_some());
    drop(first);
    until("the idle sandbox ends", || {
        supervisors.started_pid("exec-a").is_none()
    })
    .await;
    let again = supervisors.connect("exec-a").await.unwrap();
    assert_ne!(again.hello().boot_id, boot, "a fresh supervisor answers");
    let enrolled = supervisors.connect("exec-a").await.unwrap();
    assert_eq!(enrolled.hello().boot_id, again.hello().boot_id);
    assert!(enrolled.enrolled_with_our_secret());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_sandboxed_supervisor_ends_every_process_of_its_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let supervisors = sandboxed(dir.path(), std::time::Duration::from_secs(600));
    let mut connection = supervisors.connect("exec-a").await.unwrap();
    let reply = connection
        .call(&start("op-sleep", "exec sleep 127.25"))
        .await
        .unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    until("the command runs", || {
        !host_pids_naming("127.25").is_empty()
    })
    .await;
    let socket = supervisors.socket_of("exec-a").unwrap();
    assert!(socket.exists());
    supervisors.stop("exec-a").await;
    until("the command ends with its sandbox", || {
        host_pids_naming("127.25").is_empty()
    })
    .await;
    assert!(supervisors.started_pid("exec-a").is_none());
    let next = supervisors.connect("exec-a").await.unwrap();
    assert_ne!(
        next.hello().boot_id,
        connection.hello().boot_id,
        "the next connection starts a fresh one"
    );
}

/// Starts a detached `sleep <mark>` in `exec-a` that also double-forks one out of its process
/// group, and ends the environment: the answer is `Ok` only once no process names the mark,
/// the socket is gone, and a second end finds nothing to end.
async fn an_end_answers_once_every_process_is_gone(supervisors: &LocalSupervisors, mark: &str) {
    let mut connection = supervisors.connect("exec-a").await.unwrap();
    let command = format!("(setsid sleep {mark} &) ; exec sleep {mark}");
    let reply = connection.call(&start("op-sleep", &command)).await.unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    until("both sleeps run", || host_pids_naming(mark).len() >= 2).await;
    supervisors
        .end_processes("exec-a")
        .await
        .expect("the end is proven");
    assert_eq!(
        host_pids_naming(mark),
        Vec::<u32>::new(),
        "a process outlived the proven end"
    );
    assert!(!supervisors.socket_of("exec-a").unwrap().exists());
    supervisors
        .end_processes("exec-a")
        .await
        .expect("nothing is left to end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_sandboxed_environment_answers_once_its_processes_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let supervisors = sandboxed(dir.path(), std::time::Duration::from_secs(600));
    an_end_answers_once_every_process_is_gone(&supervisors, "127.31").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_an_unsandboxed_environment_answers_once_its_processes_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let supervisors = unsandboxed(dir.path());
    an_end_answers_once_every_process_is_gone(&supervisors, "127.32").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_by_a_signal_proves_nothing() {
    use execution_provider::executor::environment_end::ProcessesRemain;
    let dir = tempfile::tempdir().unwrap();
    let supervisors = unsandboxed(dir.path());
    let mut connection = supervisors.connect("exec-a").await.unwrap();
    let reply = connection
        .call(&start("op-sleep", "exec sleep 127.33"))
        .await
        .unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    until("the sleep runs", || !host_pids_naming("127.33").is_empty()).await;
    let holder = supervisors.started_pid("exec-a").expect("a holder runs");
    let holder = rustix::process::Pid::from_raw(holder as i32).unwrap();
    rustix::process::kill_process(holder, rustix::process::Signal::KILL).unwrap();
    let first = supervisors.end_processes("exec-a").await;
    assert!(
        matches!(first, Err(ProcessesRemain::HolderKilled)),
        "{first:?}"
    );
    // What the holder held is found again only through its pids cgroup, where there is one.
    match supervisors.end_processes("exec-a").await {
        Ok(()) => assert_eq!(host_pids_naming("127.33"), Vec::<u32>::new()),
        Err(ProcessesRemain::Unknown) => {
            let mut left = host_pids_naming(&dir.path().display().to_string());
            left.extend(host_pids_naming("127.33"));
            for pid in left {
                let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        Err(other) => panic!("{other:?}"),
    }
}
