//! Benchmark: the latency of one `command.start` of `true` through the local transport, the
//! executor half of `StartCommand("true")` in `dev`, in three set-ups: a sandbox built for the
//! call (the former `dev`), the environment's one sandbox reached through its supervisor (what
//! `dev` does now; the first call, which starts the sandbox, is reported apart), and no
//! isolation. Figures go to docs/sandbox.md. Run with
//! `cargo bench --bench sandbox_calls [-- --calls 50]`.

// A benchmark measures the host's wall time, which the runtime clock seam does not model.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use execution_provider::executor::local::LocalTransport;
use execution_provider::executor::local_supervisor::LocalSupervisors;
use execution_provider::executor::protocol::{ExecutorRequest, Operation};
use execution_provider::executor::transport::{CancelSignal, ExecutorTarget, ExecutorTransport};

fn calls() -> usize {
    let mut args = std::env::args().skip(1);
    let mut calls = 50;
    while let Some(arg) = args.next() {
        if arg == "--calls" {
            calls = args.next().expect("--calls N").parse().expect("a count");
        }
    }
    calls
}

fn target() -> ExecutorTarget {
    ExecutorTarget {
        namespace: "dev".into(),
        pod_name: "executor-bench".into(),
        environment: "exec-bench".into(),
    }
}

async fn start_true(transport: &LocalTransport) -> Duration {
    let mut request = ExecutorRequest::new(Operation::CommandStart);
    request.command = "true".into();
    request.command_id = "bench".into();
    request.timeout_ms = 10_000;
    let began = Instant::now();
    let envelope = transport
        .execute(&target(), request, CancelSignal::never())
        .await
        .expect("the call succeeds");
    let took = began.elapsed();
    assert!(envelope.response.is_some(), "{envelope:?}");
    took
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<40} n={:<4} median {:>7.1} ms  p90 {:>7.1} ms  min {:>7.1} ms",
        samples.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3
    );
}

async fn series(transport: &LocalTransport, calls: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        samples.push(start_true(transport).await);
    }
    samples
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let calls = calls();
    let helper = env!("CARGO_BIN_EXE_execution-helper");
    let dir = tempfile::tempdir().unwrap();
    let workspaces = dir.path().join("workspaces");

    let per_call = LocalTransport::new(helper, &workspaces);
    report("sandbox per call", series(&per_call, calls).await);

    let policy = per_call.sandbox_policy().cloned().unwrap();
    let supervisors = Arc::new(LocalSupervisors::sandboxed(
        helper,
        &workspaces,
        dir.path().join("supervisors"),
        b"bench key".to_vec(),
        policy,
    ));
    let through = LocalTransport::new(helper, &workspaces).through_supervisors(supervisors.clone());
    let first = start_true(&through).await;
    report("environment sandbox, first call", vec![first]);
    report(
        "environment sandbox (supervisor)",
        series(&through, calls).await,
    );
    supervisors.stop("exec-bench").await;

    let bare = LocalTransport::unisolated(helper, &workspaces);
    report("no isolation", series(&bare, calls).await);
}
