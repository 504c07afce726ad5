//! The world of one seed: the API server host (the in-process API server behind the fault
//! layer, served over HTTP/1 on turmoil TCP, with the dev node agent as kubelet), R replica
//! hosts each running the production `provider::run` through the simulator's seams, and the
//! client hosts. [`run`] steps it, applies the seed's faults between steps, checks the
//! invariants whenever the stored state changed, then heals and checks liveness.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::executor::ExecutorTransport;
use execution_provider::executor::environment_end::EnvironmentProcesses;
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::node_agent::NodeAgent;
use execution_provider::runtime::SeededIds;
use execution_provider::templates::TemplateRegistry;
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

use crate::apifaults::{ApiRates, FaultyApi};
use crate::authority::SecurityFiles;
use crate::clock::{SkewedClock, sim_epoch};
use crate::driver::Driver;
use crate::executor::MemExecutor;
use crate::faults::FaultPlan;
use crate::invariants::{Checker, CommandSlack};
pub(crate) use crate::material::{Material, shared_material};
use crate::net::serve_http1;
use crate::node::{HostedExecutor, add_nodes};
use crate::operator::{KubeletLink, RunTemplates};
use crate::replica::{Replica, add_replica};
use crate::scenario::Scenario;
use crate::script::Scripted;
use crate::trace::Trace;
use crate::workload::{self, AdminDesk, ClientSpec, Record};
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
/// The second template's id: every client may use it besides `default`.
pub const SECOND_TEMPLATE: &str = "compact";
/// The second template's capacity limit: lower than [`CAPACITY`], so that a ledger that
/// mixed up the two templates' slots would break one of the limits.
pub const SECOND_CAPACITY: u32 = 6;
/// The URI SAN of the second admitted platform client.
pub const PARTNER_CLIENT_URI: &str = "spiffe://sim.local/ns/partner/client";
/// The executor node hosts (`node-0..`) serving the in-memory executor over turmoil TCP, so
/// replica-to-node partitions and node crashes are part of the fault draw. The one switch:
/// 0 puts the executor back in process, shared by the replicas (no node faults).
pub const EXECUTOR_NODES: u32 = 1;
/// Simulated milliseconds per turmoil step. Every step runs every host's runtime once and
/// delivers the messages due; within a step each host's timers fire at their exact instants,
/// but messages move only at step boundaries (a latency is rounded up to a multiple of the
/// tick). A larger tick changes every trace; measured, 10 ms halves the CPU time of a release
/// run and saves a quarter in debug (docs/simulation.md, "Speed"). It divides the driver's
/// 100 ms fault tick.
pub const TICK_MS: u64 = 1;

/// The executor node host that serves `environment` (None: the executor is in process).
pub fn executor_node_of(environment: &str) -> Option<String> {
    (EXECUTOR_NODES > 0).then(|| HostedExecutor::new(EXECUTOR_NODES).node_for(environment))
}

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
    /// Every environment that recovered during the liveness phase, by name, with its time to
    /// recover.
    pub recoveries: Vec<crate::liveness::Recovered>,
    /// The per-seed time-to-recover line ([`crate::liveness::summary`]).
    pub recovery: String,
    /// A host's software failed (the provider returned an error or panicked).
    pub host_error: Option<String>,
    /// The trace.
    pub trace: Trace,
    /// Simulated seconds covered.
    pub sim_secs: f64,
    /// Client calls plus object versions checked.
    pub operations_checked: u64,
    /// Every command the executor node's supervisors started, with its life.
    pub commands: Vec<crate::supervision::CommandLife>,
}

impl Report {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.liveness.is_none() && self.host_error.is_none()
    }
}

/// Runs one seed of `config` and reports what the checker found.
pub(crate) fn run(config: &Config) -> Report {
    run_scripted(config, &[])
}

/// [`run`] with hand-driven actions applied at fixed times on top of the drawn faults.
pub(crate) fn run_scripted(config: &Config, script: &[Scripted]) -> Report {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plan = FaultPlan::draw(config.seed, config.scenario);
    let material = shared_material();
    let trace = Trace::default();
    trace.record_at(0, "world", format!("plan {plan:?}"));
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(
            config.duration_secs * 4 + crate::liveness::QUIET_PHASE_SECS + 60,
        ))
        .tick_duration(Duration::from_millis(TICK_MS))
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
    for step in script {
        if let crate::script::Action::CreatorChange(change) = &step.action {
            faulty.peer().arm(step.at, change.clone());
        }
    }
    let templates = RunTemplates::new(material.templates.clone(), &material.state.templates_path());
    let kubelet = KubeletLink::for_script(script);
    add_api_host(
        &mut sim,
        &api,
        faulty,
        &material,
        kubelet.as_ref(),
        &executor,
    );
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
        &mut sim, clocks, config, &material, &executor, &security, &trace, &templates,
    );
    let record = Record {
        trace: trace.clone(),
        ..Record::default()
    };
    let clients = add_clients(&mut sim, config, &plan, &material, &record, &api);
    add_scripted_clients(&mut sim, script, &material, &record);
    let limits = capacity_limits(&material.templates);
    let admin = AdminDesk::new(
        [DEV_CLIENT_URI, PARTNER_CLIENT_URI]
            .map(String::from)
            .into_iter()
            .zip(material.clients.iter().cloned())
            .collect(),
        material.server_cas.clone(),
        api.clone(),
        config.replicas,
        record.clone(),
    );
    let faults = plan.clone();
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
        templates,
        kubelet,
        admin,
        cut_nodes: std::collections::BTreeSet::new(),
        max_clock_steps_ms: 0,
    };
    driver.workload();
    driver.heal(&rates, &executor);
    let (liveness, phase) = driver.liveness(&record.ensured);
    let end = driver.sim.elapsed().as_millis();
    let slack = command_slack(&faults, &driver);
    driver
        .checker
        .judge_command_lives(&executor.commands().lives(), slack, end);
    report(driver, liveness, &phase, &record, &executor)
}

/// What the run adds to a claim's end before a command still running is a violation: how far
/// a replica's clock could stray (its drawn skew bound, its drift over the run, the steps it
/// accumulated) and how long the network could hold a message (a held link is released after
/// a partition's time; a call may meet two holds in a row).
fn command_slack(plan: &FaultPlan, driver: &Driver<'_>) -> CommandSlack {
    let elapsed = driver.sim.elapsed().as_millis() as u64;
    let drift = elapsed.saturating_mul(plan.drift_ppm.unsigned_abs()) / 1_000_000;
    let clock = plan.skew_ms.unsigned_abs() + drift + driver.max_clock_steps_ms.unsigned_abs();
    CommandSlack {
        clock: Duration::from_millis(clock),
        network: Duration::from_millis(2 * plan.partition_ms + 1_000),
    }
}

/// The key each replica's executor transport derives the supervisors' secrets from.
fn supervisor_key(seed: u64) -> [u8; 32] {
    let mut key = [0_u8; 32];
    StdRng::seed_from_u64(seed ^ 0x5afe).fill_bytes(&mut key);
    key
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
#[allow(clippy::too_many_arguments)] // what every replica host shares, one argument each
fn add_replicas(
    sim: &mut turmoil::Sim<'_>,
    clocks: Vec<SkewedClock>,
    config: &Config,
    material: &Arc<Material>,
    executor: &MemExecutor,
    security: &Option<Arc<Mutex<SecurityFiles>>>,
    trace: &Trace,
    templates: &RunTemplates,
) -> Vec<Arc<AtomicI64>> {
    let mut steppers = Vec::new();
    for (i, clock) in (0..config.replicas).zip(clocks) {
        steppers.push(clock.stepper());
        let executor: Arc<dyn ExecutorTransport> = if EXECUTOR_NODES == 0 {
            Arc::new(executor.clone())
        } else {
            Arc::new(
                HostedExecutor::new(EXECUTOR_NODES)
                    .with_supervisor_key(&supervisor_key(config.seed)),
            )
        };
        let replica = Replica {
            index: i,
            clock,
            material: material.clone(),
            templates: templates.clone(),
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
    phase: &crate::liveness::Liveness,
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
    let recoveries = phase.recoveries();
    Report {
        violations,
        liveness,
        recovery: crate::liveness::summary(&recoveries, phase.held_by_cut()),
        recoveries,
        host_error: driver.host_error,
        sim_secs: driver.sim.elapsed().as_secs_f64(),
        operations_checked: calls + driver.checker.versions_checked,
        trace: driver.trace,
        commands: executor.commands().lives(),
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
    kubelet: Option<&KubeletLink>,
    executor: &MemExecutor,
) {
    let api = api.clone();
    let kubelet = kubelet.cloned();
    let workspaces = material.state.workspaces_dir();
    let templates = material.templates.clone();
    let processes: Arc<dyn EnvironmentProcesses> = Arc::new(executor.clone());
    sim.host(API_HOST, move || {
        let processes = processes.clone();
        let api = api.clone();
        let faulty = faulty.clone();
        let workspaces = workspaces.clone();
        let templates = templates.clone();
        let kubelet = kubelet.clone();
        async move {
            let kube = api.client(NAMESPACE);
            crate::cluster::seed(&kube, &templates).await?;
            let kube = kubelet.map_or(kube, |link| link.client(&api, NAMESPACE));
            let agent = NodeAgent::new(
                kube,
                NAMESPACE,
                workspaces,
                Arc::new(SkewedClock::exact()),
                processes,
            );
            tokio::spawn(agent.run(std::future::pending::<()>()));
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), API_PORT);
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            serve_http1(listener, faulty).await?;
            Ok(())
        }
    });
}

/// The hosts of the script's client calls ([`crate::script::Action::Call`]), one per host
/// name, each making its calls at their times. Calls nested in waiting steps are refused:
/// their time is not known when the world is built.
fn add_scripted_clients(
    sim: &mut turmoil::Sim<'_>,
    script: &[Scripted],
    material: &Arc<Material>,
    record: &Record,
) {
    use crate::script::Action;
    use crate::workload::scripted;
    let mut hosts: std::collections::BTreeMap<String, Vec<(Duration, scripted::Call)>> =
        std::collections::BTreeMap::new();
    for step in script {
        match &step.action {
            Action::Call(call) => hosts
                .entry(call.host.clone())
                .or_default()
                .push((step.at, call.clone())),
            Action::WhenOperationLive(then)
            | Action::WhenCommandLive(then)
            | Action::WhenRetired(then) => assert!(
                !then
                    .iter()
                    .any(|(_, a)| matches!(a, Action::Call(_) | Action::CreatorChange(_))),
                "a scripted client call or creator change must be a top-level step (at a fixed time)"
            ),
            _ => {}
        }
    }
    for (host, calls) in hosts {
        let desk = scripted::Desk {
            identities: material.clients.clone(),
            server_cas: material.server_cas.clone(),
            record: record.clone(),
        };
        sim.client(host, scripted::run(desk, calls));
    }
}

/// Which platform (admitted client identity) client host `c` belongs to: `client-1` is the
/// second platform's, every other host the first's. So the first platform serves `alice`
/// from two hosts (their ensures collide, their workers share claims), `bob` is served by
/// both platforms when there are four hosts, and each platform's environments are the other
/// one's strangers (§10.5 probes across clients).
pub fn platform_of(c: usize) -> usize {
    usize::from(c == 1)
}

/// How often a client's ensure names the other template than its binding's usual one. Not
/// in `stale-epoch`: its workers share a single binding, whose claim races (what its canary
/// needs) a template race would only starve; elsewhere one ensure in five.
fn competing_template_rate(scenario: Scenario) -> f64 {
    match scenario {
        Scenario::StaleEpoch => 0.0,
        _ => 0.2,
    }
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
        let platform = platform_of(c);
        let spec = ClientSpec {
            host: host.clone(),
            platform,
            identity: material.clients[platform].clone(),
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
            competing_template_rate: competing_template_rate(config.scenario),
            stale_claim_rate: plan.stale_claim_rate,
            invalid_rate: plan.invalid_rate,
            api: api.clone(),
        };
        sim.client(host.clone(), workload::run(spec, record.clone()));
        hosts.push(host);
    }
    hosts
}
