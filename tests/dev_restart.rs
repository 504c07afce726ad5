//! Durability of `dev` across a stop: the process is killed (SIGKILL, no shutdown) right after
//! two acknowledged writes, and both are there after a restart on the same state directory; a
//! graceful stop lets the call in flight finish with its result (docs/operating.md §3).

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts the real binary and returns it with the address it prints.
async fn spawn_dev(state_dir: &Path) -> (Child, std::net::SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_execution-provider"))
        .arg("dev")
        .arg("--state-dir")
        .arg(state_dir)
        .args(["--listen", "127.0.0.1:0", "--kube-listen", "127.0.0.1:0"])
        .arg("--helper")
        .arg(helper_binary())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("execution-provider starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines
        .next_line()
        .await
        .unwrap()
        .expect("dev prints where it listens");
    let addr = first
        .split_whitespace()
        .find_map(|word| word.parse().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    // Keep reading so the provider never writes into a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_kill_and_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");

    let (mut first_run, addr) = spawn_dev(&state).await;
    let mut client = connect(addr, &state, Some(&dev_identity(&state))).await;
    let one = ensure(&mut client, "first").await;
    let two = ensure(&mut client, "second").await;
    first_run.kill().await.unwrap();

    let (_second_run, addr) = spawn_dev(&state).await;
    let mut client = connect(addr, &state, Some(&dev_identity(&state))).await;
    // A fresh allocation would mint a new random revision: equal revisions prove both writes
    // were kept.
    assert_eq!(
        ensure(&mut client, "first").await.environment,
        one.environment
    );
    assert_eq!(
        ensure(&mut client, "second").await.environment,
        two.environment
    );
    let ready = ensure_ready(&mut client, "second").await;
    assert_eq!(ready.environment, two.environment);
}

/// A graceful stop (SIGTERM's path) with a foreground command in flight: the call answers with
/// its result, the environment is not fenced, and the stop completes. The security authority
/// must keep judging until the server has drained: stopped with the signal, it turns stale
/// within a second and the call in flight is cut off as `fence_unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_the_call_in_flight_finish() {
    use execution_provider::api::pb;
    use execution_provider::cli::dev::DEV_NAMESPACE;
    use execution_provider::kube::crd::{ExecutionEnvironment, FenceState};
    use kube::Api;

    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let dev = start_dev(&state).await;
    let mut client = connect(dev.addr, &state, Some(&dev_identity(&state))).await;
    let env = ensure_ready(&mut client, "drain")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "drain", &env).await;
    let call = tokio::spawn({
        let mut client = client.clone();
        let request = pb::CommandStartRequest {
            context: Some(context("drain", &claim)),
            command: "sleep 2; echo drained".into(),
            timeout_millis: 20_000,
            ..Default::default()
        };
        async move { client.start_command(request).await }
    });
    let envs: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    eventually(Duration::from_secs(20), "the call in flight", || async {
        envs.get(&env.id).await.ok()?.status?.active_operation
    })
    .await;
    let kube = dev.kube.clone();
    dev.stop().await.expect("a graceful stop");
    let result = call
        .await
        .unwrap()
        .expect("the call in flight finishes")
        .into_inner()
        .result
        .expect("a foreground result");
    assert_eq!(
        result.state,
        pb::CommandState::Succeeded as i32,
        "{result:?}"
    );
    assert_eq!(result.stdout, b"drained\n");
    // Nothing was fenced: the in-process API server still answers after the stop.
    let status = Api::<ExecutionEnvironment>::namespaced(kube, DEV_NAMESPACE)
        .get(&env.id)
        .await
        .expect("the environment after the stop")
        .status
        .unwrap();
    assert_eq!(status.fence_state, Some(FenceState::Healthy), "{status:?}");
    assert!(status.active_operation.is_none(), "{status:?}");
}
