//! Benchmark: the cost of one acknowledged write of the persisted in-process API server as the
//! number of stored objects grows. For each size it fills a fresh state directory with that
//! many ConfigMaps (about 1 KiB each, every one a committed write), then times a series of
//! merge patches of one object through the production kube client, each acknowledged only
//! after its transaction is durable. Run with
//! `cargo bench --bench apiserver_writes [-- --sizes 100,1000,10000 --writes 300]`.

// A benchmark measures the host's wall time, which the runtime clock seam does not model.
#![allow(clippy::disallowed_methods)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use execution_provider::{
    kube::apiserver::ApiServer,
    runtime::{SeededIds, SystemClock},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

struct Options {
    sizes: Vec<usize>,
    writes: usize,
}

fn options() -> Options {
    let mut options = Options {
        sizes: vec![100, 1_000, 10_000],
        writes: 300,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--sizes" => {
                options.sizes = args
                    .next()
                    .expect("--sizes N,N,...")
                    .split(',')
                    .map(|n| n.parse().expect("a size"))
                    .collect();
            }
            "--writes" => {
                options.writes = args.next().expect("--writes N").parse().expect("a count")
            }
            // `cargo bench` passes `--bench`; other harness flags do not apply.
            _ => {}
        }
    }
    options
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "apiserver-writes"}},
        "data": {"payload": "x".repeat(900)},
    }))
    .expect("a ConfigMap")
}

struct Figures {
    fill: Duration,
    median: Duration,
    p90: Duration,
    p99: Duration,
    mean: Duration,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn measure(size: usize, writes: usize) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ApiServer::open(
        dir.path(),
        Arc::new(SystemClock),
        Arc::new(SeededIds::new(1)),
    )
    .expect("opens");
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let started = Instant::now();
    for i in 0..size {
        api.create(&PostParams::default(), &config_map(&format!("cm-{i:05}")))
            .await
            .expect("create");
    }
    let fill = started.elapsed();
    let mut samples = Vec::with_capacity(writes);
    for i in 0..writes {
        let name = format!("cm-{:05}", (i * 7919) % size);
        let patch = Patch::Merge(json!({"data": {"write": i.to_string()}}));
        let started = Instant::now();
        api.patch(&name, &PatchParams::default(), &patch)
            .await
            .expect("patch");
        samples.push(started.elapsed());
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let total: Duration = samples.iter().sum();
    Figures {
        fill,
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        mean: total / u32::try_from(samples.len()).expect("few samples"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let options = options();
    println!(
        "acknowledged write (merge patch of one ConfigMap), {} writes per size",
        options.writes
    );
    println!(
        "{:>8} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "objects", "fill (s)", "fill (ms/op)", "median", "p90", "p99", "mean"
    );
    for &size in &options.sizes {
        let figures = measure(size, options.writes).await;
        println!(
            "{size:>8} {:>12.1} {:>12.2} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms",
            figures.fill.as_secs_f64(),
            millis(figures.fill) / size as f64,
            millis(figures.median),
            millis(figures.p90),
            millis(figures.p99),
            millis(figures.mean),
        );
    }
}
