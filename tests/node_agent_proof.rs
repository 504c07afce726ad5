//! `dev`'s node agent reports a deleted executor Pod terminated only once every process of its
//! environment is gone (issue 14, item 2): the supervisor's holder, the supervisor and a
//! detached workload that double-forked away from its command. Sandboxed (the holder is the
//! sandbox's host stage, the supervisor its PID namespace's init) and with
//! `--unsafe-no-isolation` (the plain holder).

mod common;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::{DEV_NAMESPACE, DevProvider};
use execution_provider::kube::crd::pod_name;
use execution_provider::reconciler::pod::pod_terminal;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{WatchEvent, WatchParams};
use kube::{Api, ResourceExt};

/// The processes whose command line has `needle` as one of its arguments (or inside one).
fn processes_naming(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let named = cmdline
            .split(|b| *b == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(needle));
        if named {
            found.push(pid);
        }
    }
    found
}

/// The workload's `sleep`s (`sleep <mark>` exactly).
fn workload(mark: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for pid in processes_naming(mark) {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        if args.len() == 2 && args[0].ends_with(b"sleep") && args[1] == mark.as_bytes() {
            found.push(pid);
        }
    }
    found
}

/// Starts a detached command whose `sleep` double-forks out of its process group, deletes the
/// executor Pod through the API server, and checks that when the Pod's first terminal version
/// is seen (watched, so that a short-lived one is not missed) neither the workload nor any process naming the environment (its holder, its supervisor)
/// is left.
/// `mark` is the argument of the workload's `sleep`, unique to each test.
async fn a_deleted_pod_is_terminated_only_once_its_processes_are_gone(
    dev: DevProvider,
    dir: &std::path::Path,
    mark: &str,
) {
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let binding = format!("proof-{mark}");
    let env = ensure_ready(&mut client, &binding)
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, &binding, &env).await;
    let ctx = context(&binding, &claim);
    let command = format!("(setsid sleep {mark} &) ; exec sleep {mark}");
    client
        .start_command(pb::CommandStartRequest {
            context: Some(ctx.clone()),
            command,
            detach: true,
            ..Default::default()
        })
        .await
        .expect("a detached command starts");
    let before = eventually(Duration::from_secs(30), "both sleeps to run", || async {
        let running = workload(mark);
        (running.len() == 2).then_some(running)
    })
    .await;
    let holders = processes_naming(&env.id);
    assert!(!holders.is_empty(), "the environment's holder runs");

    let pods = Api::<Pod>::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let pod = pods.get(&pod_name(&env.id)).await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    // Every later version of the Pod, watched from the one read: the terminal one may live
    // only a moment (the automatic recovery removes the Pod and starts its replacement).
    let version = pod.metadata.resource_version.clone().unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={}", pod.name_any()));
    let mut versions = pods.watch(&params, &version).await.unwrap().boxed();
    pods.delete(&pod.name_any(), &Default::default())
        .await
        .unwrap();
    let first_terminal = async {
        while let Some(event) = versions.try_next().await.unwrap() {
            if let WatchEvent::Modified(seen) | WatchEvent::Deleted(seen) = event
                && seen.metadata.uid.as_deref() == Some(uid.as_str())
                && pod_terminal(&seen)
            {
                return;
            }
        }
        panic!("the Pod watch ended before the Pod was reported terminated");
    };
    tokio::time::timeout(Duration::from_secs(30), first_terminal)
        .await
        .expect("the Pod is reported terminated within 30 s");
    for pid in &before {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "workload {pid} outlived its terminated Pod"
        );
    }
    // A later supervisor (the replacement's) may name the environment too: these are the
    // ones that ran before.
    for pid in &holders {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} of the environment outlived its terminated Pod"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxed_a_deleted_pod_is_terminated_only_once_its_processes_are_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    a_deleted_pod_is_terminated_only_once_its_processes_are_gone(dev, tmp.path(), "86417").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unisolated_a_deleted_pod_is_terminated_only_once_its_processes_are_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    a_deleted_pod_is_terminated_only_once_its_processes_are_gone(dev, tmp.path(), "86418").await;
}
