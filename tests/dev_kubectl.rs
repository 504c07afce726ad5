//! kubectl against `dev`, with a real kubectl: through `<state>/kubeconfig` it gets, lists and
//! watches ExecutionEnvironments with their printer columns and status, and every write verb
//! is answered 403 Forbidden and changes nothing; without the kubeconfig's client certificate
//! the endpoint refuses the connection.
//!
//! The test is compiled as ignored when no kubectl was found at build time (see build.rs):
//! it never passes without having run kubectl.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::ListParams;
use tokio::io::{AsyncBufReadExt, BufReader};

const TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(has_kubectl)]
fn kubectl_binary() -> PathBuf {
    let path = PathBuf::from(env!("EXECUTION_PROVIDER_TEST_KUBECTL"));
    assert!(path.is_file(), "{} is gone", path.display());
    path
}

#[cfg(not(has_kubectl))]
fn kubectl_binary() -> PathBuf {
    panic!("no kubectl was found when this test was built: set KUBECTL and rebuild")
}

struct Output {
    stdout: String,
    stderr: String,
    success: bool,
}

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let output = tokio::time::timeout(
        TIMEOUT,
        tokio::process::Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("kubectl finishes")
    .expect("kubectl runs");
    Output {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        success: output.status.success(),
    }
}

async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, args).await;
    assert!(
        out.success,
        "kubectl {args:?} failed: {}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

#[cfg_attr(
    not(has_kubectl),
    ignore = "no kubectl was found when this test was built: set KUBECTL (or put one on PATH) and rebuild"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_dev_through_its_kubeconfig_and_every_write_is_forbidden() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let dev = start_dev(&state).await;
    let config = dev.kubectl.kubeconfig.clone();
    assert_eq!(config, state.join("kubeconfig"));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&config).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the kubeconfig holds a key: owner only");
    let mut client = connect(dev.addr, &state, Some(&dev_identity(&state))).await;
    let first = ensure_ready(&mut client, "kubectl-first").await;
    let name = first.environment.unwrap().id;

    // get and list, with the printer columns of -o wide.
    let wide = kubectl_ok(&config, &["get", "executionenvironments", "-o", "wide"]).await;
    let mut lines = wide.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "PHASE", "READY", "EPOCH", "AGE"], "{wide}");
    let row = lines
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} is listed: {wide}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[2], "True", "{row}");
    assert_eq!(cells[3], first.epoch.to_string(), "{row}");
    let short = kubectl_ok(&config, &["get", "execenv", "-o", "name"]).await;
    assert!(
        short.contains(&format!("executionenvironment.execution.mecatl.dev/{name}")),
        "{short}"
    );
    // The status, as JSON.
    let json = kubectl_ok(
        &config,
        &["get", "executionenvironment", &name, "-o", "json"],
    )
    .await;
    let object: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(object["status"]["epoch"], first.epoch);
    let epoch = kubectl_ok(
        &config,
        &[
            "get",
            "executionenvironment",
            &name,
            "-o",
            "jsonpath={.status.epoch}",
        ],
    )
    .await;
    assert_eq!(epoch, first.epoch.to_string());

    // watch (printed as Tables, as a user sees it): an environment created while kubectl
    // watches shows up.
    let mut watch = tokio::process::Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(&config)
        .args(["get", "executionenvironments", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl watch starts");
    let mut watched = BufReader::new(watch.stdout.take().unwrap()).lines();
    let next_name = async |lines: &mut tokio::io::Lines<_>| -> String {
        loop {
            let line = tokio::time::timeout(TIMEOUT, lines.next_line())
                .await
                .expect("the watch prints")
                .expect("read")
                .expect("the watch runs");
            let first = line.split_whitespace().next().unwrap_or("").to_string();
            if first != "NAME" {
                return first;
            }
        }
    };
    let initial = next_name(&mut watched).await;
    assert_eq!(initial, name);
    let second = ensure(&mut client, "kubectl-second").await;
    let second_name = second.environment.unwrap().id;
    let mut seen = Vec::new();
    loop {
        let line = next_name(&mut watched).await;
        if line == second_name {
            break;
        }
        seen.push(line);
        assert!(seen.len() < 100, "{second_name} never came: {seen:?}");
    }
    watch.kill().await.unwrap();

    // Every write verb is refused, and nothing changed.
    let status_patch = r#"{"status":{"epoch":99}}"#;
    let writes: Vec<Vec<&str>> = vec![
        vec!["delete", "executionenvironment", &name],
        vec!["annotate", "executionenvironment", &name, "x=y"],
        vec!["label", "executionenvironment", &name, "x=y"],
        vec![
            "patch",
            "executionenvironment",
            &name,
            "--type=merge",
            "--subresource=status",
            "-p",
            status_patch,
        ],
        vec![
            "patch",
            "executionenvironment",
            &name,
            "--type=merge",
            "-p",
            r#"{"spec":{"bindingID":"stolen"}}"#,
        ],
        vec!["create", "configmap", "planted", "--from-literal=a=b"],
        vec!["delete", "pods", "--all"],
        vec!["delete", "executionenvironments", "--all"],
    ];
    for args in &writes {
        let out = kubectl(&config, args).await;
        assert!(!out.success, "kubectl {args:?} succeeded: {}", out.stdout);
        assert!(
            out.stderr.contains("Forbidden") || out.stderr.contains("forbidden"),
            "kubectl {args:?}: {}",
            out.stderr
        );
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(dev.kube.clone(), "execution");
    let pod = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("an executor pod");
    let pod_name = kube::ResourceExt::name_any(&pod);
    let exec = kubectl(&config, &["exec", &pod_name, "--", "true"]).await;
    assert!(!exec.success, "exec through the read-only view succeeded");
    assert!(
        exec.stderr.to_lowercase().contains("forbidden"),
        "{}",
        exec.stderr
    );
    let after = kubectl_ok(
        &config,
        &["get", "executionenvironment", &name, "-o", "json"],
    )
    .await;
    let after: serde_json::Value = serde_json::from_str(&after).expect("JSON");
    assert_eq!(
        after["metadata"]["resourceVersion"],
        object["metadata"]["resourceVersion"]
    );
    let planted = kubectl(&config, &["get", "configmap", "planted"]).await;
    assert!(
        planted.stderr.contains("NotFound") || planted.stderr.contains("not found"),
        "{}",
        planted.stderr
    );

    // Without the kubeconfig's client certificate the endpoint refuses the connection.
    let kubeconfig_text = std::fs::read_to_string(&config).unwrap();
    let anonymous: String = kubeconfig_text
        .lines()
        .filter(|l| !l.contains("client-certificate-data") && !l.contains("client-key-data"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(anonymous, kubeconfig_text);
    let anonymous_path = tmp.path().join("anonymous-kubeconfig");
    std::fs::write(&anonymous_path, anonymous).unwrap();
    let refused = kubectl(&anonymous_path, &["get", "executionenvironments"]).await;
    assert!(
        !refused.success,
        "an anonymous client read: {}",
        refused.stdout
    );
    dev.stop().await.unwrap();
}
