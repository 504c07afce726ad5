//! The world of one seed: the API server host (the in-process API server behind the fault
//! layer, served over HTTP/1 on turmoil TCP, with the dev node agent as kubelet), R replica
//! hosts each running the production `provider::run` through the simulator's seams, and the
//! client hosts. [`run`] steps it, applies the seed's faults between steps, checks the
//! invariants whenever the stored state changed, then heals and checks liveness.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::cli::state_dir::{DEV_CLIENT_URI, StateDir};
use execution_provider::executor::ExecutorTransport;
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::node_agent::NodeAgent;
use execution_provider::runtime::SeededIds;
use execution_provider::runtime::tls::{self, Identity};
use execution_provider::templates::{TemplateError, TemplateRegistry};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::apifaults::{ApiRates, FaultyApi};
use crate::authority::SecurityFiles;
use crate::clock::{SkewedClock, sim_epoch};
use crate::driver::Driver;
use crate::executor::MemExecutor;
use crate::faults::FaultPlan;
use crate::invariants::Checker;
use crate::net::serve_http1;
use crate::node::{HostedExecutor, add_nodes};
use crate::pki::SimPki;
use crate::replica::{Replica, add_replica};
use crate::scenario::Scenario;
use crate::script::Scripted;
use crate::trace::Trace;
use crate::workload::{self, ClientSpec, Record};
use crate::writes::WriteLog;

/// The port replicas serve gRPC on.
pub const GRPC_PORT: u16 = 7443;
/// The port the API server host serves on.
pub const API_PORT: u16 = 6443;
/// The namespace of environments.
pub const NAMESPACE: &str = "execution";
/// The API server host.
pub const API_HOST: &str = "apiserver";
/// The capacity limit (`maxEnvironments`) of the simulator's template: low, so that
/// `capacity-race` reaches it.
pub const CAPACITY: u32 = 8;
/// Simulated seconds the liveness phase may take.
pub const LIVENESS_SECS: u64 = 60;
/// The executor node hosts (`node-0..`) serving the in-memory executor over turmoil TCP, so
/// replica-to-node partitions and node crashes are part of the fault draw. The one switch:
/// 0 puts the executor back in process, shared by the replicas (no node faults).
pub const EXECUTOR_NODES: u32 = 1;

/// The turmoil host name of replica `i`.
pub fn replica_host(i: u32) -> String {
    format!("replica-{i}")
}

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// The scenario.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// Replica count.
    pub replicas: u32,
    /// Simulated seconds of workload.
    pub duration_secs: u64,
}

/// What one run found.
#[derive(Debug)]
pub struct Report {
    /// Invariant and history violations.
    pub violations: Vec<String>,
    /// Why liveness failed, if it did.
    pub liveness: Option<String>,
    /// A host's software failed (the provider returned an error or panicked).
    pub host_error: Option<String>,
    /// The trace.
    pub trace: Trace,
    /// Simulated seconds covered.
    pub sim_secs: f64,
    /// Client calls plus object versions checked.
    pub operations_checked: u64,
}

impl Report {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.liveness.is_none() && self.host_error.is_none()
    }
}

/// Material every host of a run shares (built once, outside the simulation).
pub(crate) struct Material {
    pub(crate) state: StateDir,
    _dir: tempfile::TempDir,
    client: Identity,
    stranger: Identity,
    server_cas: Vec<rustls::pki_types::CertificateDer<'static>>,
    pub(crate) templates: Arc<TemplateRegistry>,
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn identity(pem: &crate::pki::Pem, what: &str) -> Identity {
    Identity::from_pem(pem.cert.as_bytes(), pem.key.as_bytes(), what)
        .unwrap_or_else(|e| panic!("the {what} identity: {e}"))
}

/// A dev state directory (manifest and templates as `dev` makes them) whose TLS files are
/// replaced by the deterministic simulation PKI.
fn material() -> Material {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let state = StateDir::open_or_init(&dir.path().join("state")).expect("a dev state directory");
    let manifest = read(state.manifest_path());
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).expect("a JSON manifest");
    let tls_file = |key: &str| {
        let name = manifest
            .pointer(&format!("/tls/{key}"))
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("the manifest names its {key}"));
        state.security_dir().join(name)
    };
    let pki = SimPki::new(DEV_CLIENT_URI);
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    };
    write(tls_file("certificateFile"), &pki.server.cert);
    write(tls_file("privateKeyFile"), &pki.server.key);
    write(tls_file("clientCAFile"), &pki.ca.cert);
    let server_cas =
        tls::certificates_from_pem(pki.ca.cert.as_bytes(), "sim CA").expect("the sim CA");
    let fixture = String::from_utf8(read(state.templates_path())).expect("UTF-8 templates");
    let limited = fixture.replace(
        "maxEnvironments: 100",
        &format!("maxEnvironments: {CAPACITY}"),
    );
    assert_ne!(
        limited, fixture,
        "the fixture template names its maxEnvironments"
    );
    // The revision id pins the execution definition, so the changed limit has its own.
    let limited = match TemplateRegistry::from_yaml_str(&limited, "sim templates") {
        Err(TemplateError::RevisionMismatch {
            revision, expected, ..
        }) => limited.replace(&revision, &expected),
        _ => limited,
    };
    write(state.templates_path(), &limited);
    let templates =
        Arc::new(TemplateRegistry::load(state.templates_path()).expect("the templates"));
    Material {
        state,
        _dir: dir,
        client: identity(&pki.client, "sim client"),
        stranger: identity(&pki.stranger, "stranger"),
        server_cas,
        templates,
    }
}

/// The material of this process (built once: key generation is the slow part).
fn shared_material() -> Arc<Material> {
    static MATERIAL: std::sync::OnceLock<Arc<Material>> = std::sync::OnceLock::new();
    MATERIAL.get_or_init(|| Arc::new(material())).clone()
}

/// Runs one seed of `config` and reports what the checker found.
pub fn run(config: &Config) -> Report {
    run_scripted(config, &[])
}

/// [`run`] with hand-driven actions applied at fixed times on top of the drawn faults.
pub fn run_scripted(config: &Config, script: &[Scripted]) -> Report {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plan = FaultPlan::draw(config.seed, config.scenario);
    let material = shared_material();
    let trace = Trace::default();
    trace.record_at(0, "world", format!("plan {plan:?}"));
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(
            config.duration_secs * 4 + LIVENESS_SECS + 60,
        ))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(plan.max_latency_ms))
        .epoch(sim_epoch())
        .rng_seed(config.seed)
        .build();
    let api = ApiServer::in_memory(
        Arc::new(SkewedClock::exact()),
        Arc::new(SeededIds::new(config.seed)),
    );
    let rates = Arc::new(Mutex::new(ApiRates {
        refuse: plan.api_error_rate,
        lose_answer: plan.api_ambiguous_rate,
    }));
    let executor = MemExecutor::new(
        config.seed ^ 0xe8ec,
        plan.executor_crash_rate,
        Duration::from_millis(5),
    );
    let writes = WriteLog::default();
    let faulty = FaultyApi::new(
        api.clone(),
        config.seed ^ 0xa91,
        rates.clone(),
        trace.clone(),
        writes.clone(),
    );
    let outage = faulty.outage();
    add_api_host(&mut sim, &api, faulty, &material);
    add_nodes(&mut sim, &executor, EXECUTOR_NODES);
    let security = (plan.security_per_sec > 0.0).then(|| {
        Arc::new(Mutex::new(SecurityFiles::copy(
            &material.state.manifest_path(),
            &material.state.security_dir(),
        )))
    });
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0xc10c);
    let clocks = (0..config.replicas)
        .map(|_| {
            let skew = draw_signed(&mut rng, plan.skew_ms);
            let drift = draw_signed(&mut rng, plan.drift_ppm);
            SkewedClock::new(skew, drift)
        })
        .collect();
    let steppers = add_replicas(
        &mut sim, clocks, config, &material, &executor, &security, &trace,
    );
    let record = Record {
        trace: trace.clone(),
        ..Record::default()
    };
    let clients = add_clients(&mut sim, config, &plan, &material, &record, &api);
    let limits = capacity_limits(&material.templates);
    let mut driver = Driver {
        sim,
        rng,
        plan,
        steppers,
        trace,
        api,
        replicas: config.replicas,
        nodes: EXECUTOR_NODES,
        clients,
        down: Vec::new(),
        nodes_down: Vec::new(),
        partitions: Vec::new(),
        checker: Checker::new(&limits),
        security,
        restore_at: None,
        script: {
            let mut script = script.to_vec();
            script.sort_by_key(|s| s.at);
            script
        },
        writes,
        last_rv: 0,
        executor: executor.clone(),
        outage,
        host_error: None,
    };
    driver.workload();
    driver.heal(&rates, &executor);
    let liveness = driver.liveness(&record.ensured);
    report(driver, liveness, &record, &executor)
}

/// Each template's capacity limit, by id.
fn capacity_limits(templates: &TemplateRegistry) -> std::collections::BTreeMap<String, u32> {
    templates
        .templates()
        .iter()
        .map(|(id, template)| (id.clone(), template.capacity()))
        .collect()
}

/// Adds the replica hosts, each with its own clock (drawn skew and drift); returns the
/// handles that step their clocks.
fn add_replicas(
    sim: &mut turmoil::Sim<'_>,
    clocks: Vec<SkewedClock>,
    config: &Config,
    material: &Arc<Material>,
    executor: &MemExecutor,
    security: &Option<Arc<Mutex<SecurityFiles>>>,
    trace: &Trace,
) -> Vec<Arc<AtomicI64>> {
    let mut steppers = Vec::new();
    for (i, clock) in (0..config.replicas).zip(clocks) {
        steppers.push(clock.stepper());
        let executor: Arc<dyn ExecutorTransport> = if EXECUTOR_NODES == 0 {
            Arc::new(executor.clone())
        } else {
            Arc::new(HostedExecutor::new(EXECUTOR_NODES))
        };
        let replica = Replica {
            index: i,
            clock,
            material: material.clone(),
            executor,
            seed: config.seed,
            security: security.clone(),
            trace: trace.clone(),
        };
        add_replica(sim, replica);
    }
    steppers
}

/// The end-of-run history checks and the report.
fn report(
    mut driver: Driver<'_>,
    liveness: Option<String>,
    record: &Record,
    executor: &MemExecutor,
) -> Report {
    let objects = driver.api.objects_of_kind("ExecutionEnvironment");
    driver.checker.finish(&record.history(), executor, &objects);
    let mut violations = driver.checker.violations().to_vec();
    violations.extend(record.violations.lock().expect("lock").iter().cloned());
    let end = driver.sim.elapsed().as_millis();
    for v in &violations {
        driver
            .trace
            .record_at(end, "checker", format!("VIOLATION {v}"));
    }
    let calls = *record.calls.lock().expect("lock");
    Report {
        violations,
        liveness,
        host_error: driver.host_error,
        sim_secs: driver.sim.elapsed().as_secs_f64(),
        operations_checked: calls + driver.checker.versions_checked,
        trace: driver.trace,
    }
}

fn draw_signed(rng: &mut StdRng, bound: i64) -> i64 {
    if bound <= 0 {
        0
    } else {
        rng.random_range(-bound..=bound)
    }
}

fn add_api_host(
    sim: &mut turmoil::Sim<'_>,
    api: &ApiServer,
    faulty: FaultyApi,
    material: &Arc<Material>,
) {
    let api = api.clone();
    let workspaces = material.state.workspaces_dir();
    let templates = material.templates.clone();
    sim.host(API_HOST, move || {
        let api = api.clone();
        let faulty = faulty.clone();
        let workspaces = workspaces.clone();
        let templates = templates.clone();
        async move {
            let kube = api.client(NAMESPACE);
            crate::cluster::seed(&kube, &templates).await?;
            let agent = NodeAgent::new(kube, NAMESPACE, workspaces, Arc::new(SkewedClock::exact()));
            tokio::spawn(agent.run(std::future::pending::<()>()));
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), API_PORT);
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            serve_http1(listener, faulty).await?;
            Ok(())
        }
    });
}

fn add_clients(
    sim: &mut turmoil::Sim<'_>,
    config: &Config,
    plan: &FaultPlan,
    material: &Arc<Material>,
    record: &Record,
    api: &ApiServer,
) -> Vec<String> {
    let owners = ["alice", "bob"];
    let count = match config.scenario {
        Scenario::CapacityRace | Scenario::Swarm => 4,
        _ => 3,
    };
    let bindings: Vec<String> = (0..config.scenario.bindings())
        .map(|b| format!("binding-{b}"))
        .collect();
    let mut hosts = Vec::new();
    for c in 0..count {
        let host = format!("client-{c}");
        let spec = ClientSpec {
            host: host.clone(),
            identity: material.client.clone(),
            stranger: material.stranger.clone(),
            server_cas: material.server_cas.clone(),
            owner: pb::Owner {
                issuer: "https://issuer.sim".into(),
                subject: owners[c % owners.len()].into(),
            },
            bindings: bindings.clone(),
            steps: u32::try_from(config.duration_secs * 3).unwrap_or(u32::MAX),
            seed: config.seed ^ (0xc1 << 8) ^ c as u64,
            replicas: config.replicas,
            mix: config.scenario.mix(),
            stale_claim_rate: plan.stale_claim_rate,
            invalid_rate: plan.invalid_rate,
            api: api.clone(),
        };
        sim.client(host.clone(), workload::run(spec, record.clone()));
        hosts.push(host);
    }
    hosts
}
