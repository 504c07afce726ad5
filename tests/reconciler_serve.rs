//! `execution-provider serve` as a process: flag and template errors exit 1 before Kubernetes
//! is contacted; a failed preflight exits 1 naming the missing class and opens no port; with
//! the classes and the ledger present it becomes ready on `/ready` and drains on SIGTERM.
//! The cluster is the in-process API server, served over plain HTTP on loopback.

mod reconciler_support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use execution_provider::cli::state_dir::StateDir;
use reconciler_support::World;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_execution-provider"))
}

/// Serves `world`'s API server on loopback; answers a kubeconfig that points at it.
async fn serve_api(world: &World, dir: &Path) -> PathBuf {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = world.api.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api = api.clone();
            tokio::spawn(async move {
                let _ = api.serve_connection(stream).await;
            });
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: execution\n\
             current-context: test\n"
        ),
    )
    .unwrap();
    kubeconfig
}

fn serve_command(state: &StateDir, kubeconfig: &Path, health: &str) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("serve")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--namespace",
            "execution",
            "--executor-service-account",
            "execution-executor",
        ])
        .arg("--templates")
        .arg(state.templates_path())
        .arg("--security-policy-manifest")
        .arg(state.manifest_path())
        .arg("--tls-directory")
        .arg(state.security_dir())
        .args(["--listen", "127.0.0.1:0", "--health-listen", health])
        .env_remove("CI")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn a_legacy_templates_file_is_refused_before_kubernetes_is_contacted() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/templates");
    let output = Command::new(binary())
        .args([
            "serve",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--namespace",
            "execution",
        ])
        .args([
            "--executor-service-account",
            "execution-executor",
            "--templates",
        ])
        .arg(fixtures.join("legacy-profiles.yaml"))
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("decode execution templates"), "{stderr}");
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
}

#[tokio::test]
async fn a_shared_executor_account_is_refused_at_start() {
    let output = Command::new(binary())
        .args([
            "serve",
            "--namespace",
            "execution",
            "--executor-service-account",
            "default",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--executor-service-account must be a dedicated"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_missing_or_malformed_supervisor_key_is_refused_before_kubernetes_is_contacted() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open_or_init(&dir.path().join("state")).unwrap();
    let kubeconfig = Path::new("/nonexistent/kubeconfig");
    let named = dir.path().join("supervisor.key");
    // Named by the flag but absent; then present with a wrong length; then the security
    // directory's own file with a wrong length (used without the flag).
    let cases: [(Option<&[u8]>, bool); 3] = [
        (None, true),
        (Some(&[9; 31]), true),
        (Some(&[9; 33]), false),
    ];
    for (content, by_flag) in cases {
        let path = if by_flag {
            named.clone()
        } else {
            state.security_dir().join("supervisor.key")
        };
        if let Some(bytes) = content {
            std::fs::write(&path, bytes).unwrap();
        }
        let mut command = serve_command(&state, kubeconfig, "off");
        if by_flag {
            command.arg("--supervisor-key-file").arg(&named);
        }
        let output = command.output().await.unwrap();
        assert_eq!(output.status.code(), Some(1), "{content:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("cannot load the supervisor key") && stderr.contains("supervisor.key"),
            "{stderr}"
        );
        assert!(!stderr.contains("kubeconfig"), "{stderr}");
    }
}

#[tokio::test]
async fn a_failed_preflight_exits_non_zero_naming_the_missing_class() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open_or_init(&dir.path().join("state")).unwrap();
    let world = World::bare();
    let kubeconfig = serve_api(&world, dir.path()).await;
    let output = serve_command(&state, &kubeconfig, "off")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("profile preflight: RuntimeClass \"gvisor\" unavailable"),
        "{stderr}"
    );
    assert_eq!(world.api.resource_version(), 0, "preflight wrote nothing");
}

async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test]
async fn a_started_provider_becomes_ready_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open_or_init(&dir.path().join("state")).unwrap();
    let world = World::bare();
    world.add_runtime_class("gvisor", None).await;
    world.add_storage_class("standard").await;
    world.add_ledger(&[]).await;
    let kubeconfig = serve_api(&world, dir.path()).await;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let health = format!("127.0.0.1:{port}");
    let mut child = serve_command(&state, &kubeconfig, &health).spawn().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if http_status(&health, "/ready").await == Some(204) {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "serve exited early");
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve becomes ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http_status(&health, "/live").await, Some(204));
    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("serve stops after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
