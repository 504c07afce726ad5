//! End-to-end tests against a real Kubernetes control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler and kwok on 127.0.0.1, built from Go modules by
//! `tests/e2e/bin/build-bins.sh` and started by `tests/e2e/bin/start-control-plane.sh`).
//!
//! Each test takes its own namespace. Without a started control plane every test is skipped
//! with a message, except under `CI`, where that is a failure. See docs/e2e.md.

mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod crd;
mod crd_admission;
mod fixtures;
mod flow;
mod kwok_exec;
mod lifecycle;
mod pod_exec;
mod provider;
