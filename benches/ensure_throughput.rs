//! Benchmark: allocation throughput and claim latency of the store as the number of
//! environments of one template grows, against the persisted in-process API server (what `dev`
//! runs). For each size it opens a fresh state directory, seeds the capacity-ledger shards,
//! fills the template (limit 10,000) up to `size - measured` environments with 8 concurrent
//! clients, then times `measured` more `EnsureTemplate` calls from 8 concurrent clients (each a
//! new environment: ledger reservation, create, status initialization) and, on environments
//! that are committed and Ready, a series of claim acquire + release pairs. Run with
//! `cargo bench --bench ensure_throughput [-- --sizes 100,10000 --measured 400 --claims 200]`.

// A benchmark measures the host's wall time, which the runtime clock seam does not model.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use execution_provider::executor::{
    BoxFuture, CancelSignal, ExecutorEnvelope, ExecutorRequest, ExecutorTarget, ExecutorTransport,
    TransportError,
};
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironment, ObjectIdentity, RfcTime,
};
use execution_provider::kube::seed::seed_cluster;
use execution_provider::runtime::{Runtime, SeededIds, SystemClock};
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::ensure::EnsureRequest;
use execution_provider::store::naming::owner_hash;
use execution_provider::store::{Caller, ClaimContext, EnvRef, Store};
use execution_provider::templates::{ProfileSpec, TemplateRegistry, canonical_template_revision};
use kube::api::{Api, PostParams};
use serde_json::json;

const NAMESPACE: &str = "execution";
const CLIENT: &str = "spiffe://bench.local/ns/agents/sa/gateway";
const ISSUER: &str = "https://issuer.bench";
const TEMPLATE: &str = "bench";
const CLIENTS: usize = 8;

struct Options {
    sizes: Vec<usize>,
    measured: usize,
    claims: usize,
}

fn options() -> Options {
    let mut options = Options {
        sizes: vec![100, 10_000],
        measured: 400,
        claims: 200,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> usize {
            args.next()
                .unwrap_or_else(|| panic!("{flag} N"))
                .parse()
                .expect("a count")
        };
        match arg.as_str() {
            "--sizes" => {
                options.sizes = args
                    .next()
                    .expect("--sizes N,N,...")
                    .split(',')
                    .map(|n| n.parse().expect("a size"))
                    .collect();
            }
            "--measured" => options.measured = number("--measured"),
            "--claims" => options.claims = number("--claims"),
            // `cargo bench` passes `--bench`; other harness flags do not apply.
            _ => {}
        }
    }
    options
}

/// No executor: the benchmark never dispatches.
struct NoExecutor;

impl ExecutorTransport for NoExecutor {
    fn execute<'a>(
        &'a self,
        _target: &'a ExecutorTarget,
        _request: ExecutorRequest,
        _cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(async { Err(TransportError::NoResult) })
    }
}

fn registry() -> TemplateRegistry {
    let execution = json!({
        "image": format!("registry.example/execution/executor@sha256:{}", "a".repeat(64)),
        "storageClass": "standard", "storageSize": "1Gi",
        "cpuRequest": "100m", "cpuLimit": "1", "memoryRequest": "128Mi", "memoryLimit": "512Mi",
        "ephemeralStorageRequest": "256Mi", "ephemeralStorageLimit": "1Gi", "tmpSizeLimit": "64Mi",
        "runtimeClassName": "gvisor", "maxFileBytes": 1024, "maxCommandBytes": 1024,
        "maxCommandDuration": "5m", "maxEnvironments": 10_000
    });
    let spec: ProfileSpec = serde_json::from_value(execution.clone()).expect("spec");
    let key = canonical_template_revision(&spec.validate().expect("valid"));
    let file = json!({"templates": {TEMPLATE: {"default": key, "revisions": {key.clone(): {"execution": execution}}}}});
    TemplateRegistry::from_yaml_str(&file.to_string(), "bench").expect("registry")
}

fn request(templates: &TemplateRegistry, i: usize) -> EnsureRequest {
    let subject = format!("user-{i:05}");
    EnsureRequest {
        caller: Caller {
            client: CLIENT.to_owned(),
            owner_hash: owner_hash(ISSUER, &subject),
        },
        owner_issuer: ISSUER.to_owned(),
        owner_subject: subject,
        binding_id: "binding".to_owned(),
        template_id: TEMPLATE.to_owned(),
        template_revision: templates
            .default_revision(TEMPLATE)
            .expect("default")
            .to_owned(),
        operation_id: format!("op-{i}"),
    }
}

/// Ensures environments `range` from [`CLIENTS`] concurrent clients; the wall time.
async fn ensure_all(
    store: &Arc<Store>,
    templates: &Arc<TemplateRegistry>,
    range: std::ops::Range<usize>,
) -> Duration {
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(range.start));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (store, templates, next) = (store.clone(), templates.clone(), next.clone());
        let end = range.end;
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= end {
                    break;
                }
                store
                    .ensure_template(&request(&templates, i))
                    .await
                    .expect("ensure");
            }
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    started.elapsed()
}

/// Plays the reconciler: records Pod and PVC identities and sets Ready=True.
async fn make_ready(api: &Api<ExecutionEnvironment>, name: &str) {
    let mut o = api.get(name).await.expect("environment");
    let status = o.status.get_or_insert_with(Default::default);
    status.pod = Some(ObjectIdentity {
        name: format!("executor-{name}"),
        uid: format!("pod-{name}"),
    });
    status.pvc = Some(ObjectIdentity {
        name: format!("workspace-{name}"),
        uid: format!("pvc-{name}"),
    });
    status.conditions.push(EnvironmentCondition {
        type_: "Ready".to_owned(),
        status: ConditionStatus::True,
        reason: "Reconciled".to_owned(),
        message: String::new(),
        observed_generation: 1,
        last_transition_time: RfcTime::from_system_time(std::time::SystemTime::now()),
    });
    api.replace_status(name, &PostParams::default(), &o)
        .await
        .expect("ready");
}

/// Acquire + release latencies on `count` committed, Ready environments.
async fn claim_latencies(
    store: &Store,
    templates: &TemplateRegistry,
    api: &Api<ExecutionEnvironment>,
    count: usize,
) -> Vec<Duration> {
    let mut ready: Vec<(EnsureRequest, EnvRef)> = Vec::new();
    for i in 0..count {
        let req = request(templates, i);
        let a = store.ensure_template(&req).await.expect("replay");
        store
            .commit_reference(&a.env, &req.caller, &req.binding_id, &req.operation_id)
            .await
            .expect("commit");
        make_ready(api, &a.env.id).await;
        ready.push((req, a.env));
    }
    let mut samples = Vec::with_capacity(count);
    for (n, (req, env)) in ready.iter().enumerate() {
        let started = Instant::now();
        let claim = store
            .acquire_run(&AcquireRequest {
                env: env.clone(),
                caller: req.caller.clone(),
                binding_id: req.binding_id.clone(),
                run_id: format!("run-{n}"),
                operation_id: format!("acquire-{n}"),
                ttl: Duration::from_secs(60),
            })
            .await
            .expect("acquire");
        let rc = ClaimContext {
            env: env.clone(),
            binding_id: req.binding_id.clone(),
            run_id: claim.run_id,
            claim_id: claim.claim_id,
            epoch: claim.epoch,
            grant_generation: claim.grant_generation,
        };
        store.release_run(&req.caller, &rc).await.expect("release");
        samples.push(started.elapsed());
    }
    samples.sort();
    samples
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn measure(size: usize, options: &Options) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ApiServer::open(
        dir.path(),
        Arc::new(SystemClock),
        Arc::new(SeededIds::new(1)),
    )
    .expect("opens");
    let client = server.client(NAMESPACE);
    let templates = Arc::new(registry());
    seed_cluster(
        &client,
        NAMESPACE,
        &templates,
        "bench.execution.mecatl.dev/none",
    )
    .await
    .expect("seed");
    let runtime = Runtime {
        clock: Arc::new(SystemClock),
        ids: Arc::new(SeededIds::new(size as u64)),
    };
    let store = Arc::new(Store::new(
        client.clone(),
        NAMESPACE,
        templates.clone(),
        Arc::new(NoExecutor),
        runtime,
    ));
    let measured = options.measured.min(size / 2).max(1);
    let fill = ensure_all(&store, &templates, 0..size - measured).await;
    let timed = ensure_all(&store, &templates, size - measured..size).await;
    let api: Api<ExecutionEnvironment> = Api::namespaced(client, NAMESPACE);
    let claims = claim_latencies(&store, &templates, &api, options.claims.min(size)).await;
    let at = |q: f64| claims[((claims.len() - 1) as f64 * q).round() as usize];
    println!(
        "{size:>8} {:>12.1} {:>14.1} {:>14.1} {:>10.2}ms {:>10.2}ms {:>10.2}ms",
        (size - measured) as f64 / fill.as_secs_f64().max(1e-9),
        measured as f64 / timed.as_secs_f64(),
        millis(timed) * CLIENTS as f64 / measured as f64,
        millis(at(0.5)),
        millis(at(0.9)),
        millis(at(0.99)),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let options = options();
    println!(
        "EnsureTemplate from {CLIENTS} concurrent clients ({} timed per size, each a new \
         environment) and claim acquire+release ({} pairs), one template of limit 10,000",
        options.measured, options.claims
    );
    println!(
        "{:>8} {:>12} {:>14} {:>14} {:>12} {:>12} {:>12}",
        "envs", "fill (/s)", "ensure (/s)", "ensure (ms)", "claim p50", "claim p90", "claim p99"
    );
    for &size in &options.sizes {
        measure(size, &options).await;
    }
}
