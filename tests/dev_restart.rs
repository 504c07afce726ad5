//! Durability of `dev`: the process is killed (SIGKILL, no shutdown) right after two
//! acknowledged writes, and both are there after a restart on the same state directory.

mod common;

use std::path::Path;
use std::process::Stdio;

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
