//! What a call and a connection hold on the mTLS port (api-security §7, issue 15 item 3): a
//! cancelled data-plane call keeps its limiter slot until its dispatch (the executor call and
//! the completion write) has ended; connections beyond `--max-connections` and handshakes
//! beyond `--max-tls-handshakes` are closed at once, and a freed place admits again.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::{DEV_NAMESPACE, DevArgs, DevProvider};
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::server::ConnectionBounds;
use execution_provider::server::limiter::RpcLimiter;

/// A helper in front of the real one: while `armed` exists, a call removes it, creates
/// `started` and waits for a line on the FIFO `gate` before running the real helper.
struct GatedHelper {
    dir: PathBuf,
}

impl GatedHelper {
    fn new(dir: &Path) -> Self {
        let gate = dir.join("gate");
        let made = std::process::Command::new("mkfifo")
            .arg(&gate)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo");
        let script = format!(
            "#!/bin/sh\nif [ -e '{armed}' ]; then rm -f '{armed}'; : > '{started}'; read _ < '{gate}'; fi\nexec '{real}' \"$@\"\n",
            armed = dir.join("armed").display(),
            started = dir.join("started").display(),
            gate = gate.display(),
            real = helper_binary().display(),
        );
        let path = dir.join("gated-helper");
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self {
            dir: dir.to_owned(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join("gated-helper")
    }

    fn arm(&self) {
        std::fs::write(self.dir.join("armed"), b"").unwrap();
    }

    fn started(&self) -> bool {
        self.dir.join("started").exists()
    }

    /// Lets the waiting call go on (blocks until the helper has the FIFO open).
    async fn release(&self) {
        let gate = self.dir.join("gate");
        tokio::task::spawn_blocking(move || std::fs::write(gate, b"go\n"))
            .await
            .unwrap()
            .unwrap();
    }
}

async fn start(state: &Path, helper: PathBuf, connections: ConnectionBounds) -> DevProvider {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = DevArgs {
        state_dir: state.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        kube_listen: "127.0.0.1:0".parse().unwrap(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        helper: Some(helper),
        limits: Default::default(),
        connections,
        unsafe_no_isolation: false,
        telemetry: Default::default(),
    };
    execution_provider::cli::dev::start(&args)
        .await
        .expect("dev starts")
}

fn write(claim: &pb::RunClaimResponse, path: &str, data: &[u8]) -> pb::FileRequest {
    pb::FileRequest {
        context: Some(context("slot", claim)),
        operation: pb::FileOperation::Create as i32,
        path: path.into(),
        data: data.to_vec(),
        ..pb::FileRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_keeps_its_limiter_slot_until_its_dispatch_and_completion_end() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let helper = GatedHelper::new(tmp.path());
    let dev = start(&state, helper.path(), ConnectionBounds::default()).await;
    let limiter = RpcLimiter::new(4, 4).unwrap();
    dev.security.set_limiter(limiter.clone());
    let mut client = connect(dev.addr, &state, Some(&dev_identity(&state))).await;
    let env = ensure_ready(&mut client, "slot").await.environment.unwrap();
    let claim = acquire(&mut client, "slot", &env).await;

    helper.arm();
    let mut caller = client.clone();
    let request = write(&claim, "kept.txt", b"written after the caller left\n");
    let call = tokio::spawn(async move { caller.files(request).await });
    eventually(
        Duration::from_secs(30),
        "the executor call to start",
        || {
            let started = helper.started();
            async move { started.then_some(()) }
        },
    )
    .await;
    assert_eq!(limiter.active(), (1, 1), "the call holds its slot");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // A later call on the same connection completes after the cancellation was sent.
    client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap();
    let freed_early = tokio::time::timeout(Duration::from_secs(2), async {
        while limiter.active().0 > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        freed_early.is_err(),
        "the cancelled call's slot was freed while its executor call still ran"
    );
    assert_eq!(limiter.active(), (1, 1));

    helper.release().await;
    eventually(Duration::from_secs(30), "the slot to be released", || {
        let free = limiter.active() == (0, 0);
        async move { free.then_some(()) }
    })
    .await;
    // The slot ended after the completion write: the operation is off the record.
    let envs = kube::Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let status = envs.get(&env.id).await.unwrap().status.unwrap();
    assert!(status.active_operation.is_none(), "completion written");
    let read = client
        .files(pb::FileRequest {
            context: Some(context("slot", &claim)),
            operation: pb::FileOperation::Read as i32,
            path: "kept.txt".into(),
            ..pb::FileRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.data, b"written after the caller left\n");
}

async fn answers(addr: std::net::SocketAddr, state: &Path) -> Option<Client> {
    let mut client = connect(addr, state, Some(&dev_identity(state))).await;
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        client.list_execution_templates(pb::ListExecutionTemplatesRequest {}),
    )
    .await;
    matches!(answered, Ok(Ok(_))).then_some(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_are_closed_and_a_freed_place_admits_again() {
    let tmp = tempfile::tempdir().unwrap();
    let bounds = ConnectionBounds {
        connections: Some(2),
        handshakes: None,
    };
    let dev = start(tmp.path(), helper_binary(), bounds).await;
    let first = answers(dev.addr, tmp.path())
        .await
        .expect("first connection");
    let _second = answers(dev.addr, tmp.path())
        .await
        .expect("second connection");
    assert!(
        answers(dev.addr, tmp.path()).await.is_none(),
        "a third connection is closed"
    );
    drop(first);
    eventually(Duration::from_secs(20), "a freed place to admit", || {
        answers(dev.addr, tmp.path())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_in_progress_are_bounded_and_a_finished_one_frees_its_place() {
    let tmp = tempfile::tempdir().unwrap();
    let bounds = ConnectionBounds {
        connections: None,
        handshakes: Some(1),
    };
    let dev = start(tmp.path(), helper_binary(), bounds).await;
    // A peer that connects and never sends its ClientHello holds the only handshake place.
    let stalled = tokio::net::TcpStream::connect(dev.addr).await.unwrap();
    assert!(
        answers(dev.addr, tmp.path()).await.is_none(),
        "no handshake place is free"
    );
    drop(stalled);
    eventually(
        Duration::from_secs(20),
        "the handshake place to free",
        || answers(dev.addr, tmp.path()),
    )
    .await;
}
