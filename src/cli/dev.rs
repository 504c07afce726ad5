//! `execution-provider dev`: the whole provider on one machine with no cluster. An in-process
//! API server persisted to the state directory stands for Kubernetes, a node agent plays the
//! kubelet, and executors are local `execution-helper` processes on workspace directories.
//! kubectl can read (never write) the API server through `<state>/kubeconfig` (module
//! `dev_kubectl`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::dev_kubectl::{self, KubectlEndpoint};
use super::state_dir::StateDir;
use crate::cli::dev_network::TemplateNetworks;
use crate::executor::dev_executor::{self, DevExecutor};
use crate::executor::local::LocalTransport;
use crate::health;
use crate::kube::apiserver::ApiServer;
use crate::kube::node_agent::NodeAgent;
use crate::kube::seed::seed_cluster;
use crate::metrics::Metrics;
use crate::provider::{self, Dependencies, Settings, Shutdown, ShutdownTrigger};
use crate::runtime::Runtime;
use crate::runtime::net::{Net, TokioNet};
use crate::security::{self, Security, SecurityManager, SecuritySettings, manager};
use crate::server::ConnectionBounds;
use crate::server::limiter::LimiterBounds;
use crate::telemetry::TelemetryArgs;
use crate::telemetry::events::EventRecorder;
use crate::telemetry::traces::kube_api::KubeApiTraceLayer;
use crate::templates::TemplateRegistry;

/// The namespace `dev` keeps its environments in.
pub const DEV_NAMESPACE: &str = "execution";
/// The provisioner named by the StorageClasses `dev` creates (workspaces are directories).
pub const DEV_STORAGE_PROVISIONER: &str = "dev.execution.mecatl.dev/workspace-directory";
/// The executor service account `dev` renders into Pods.
pub const DEV_EXECUTOR_SERVICE_ACCOUNT: &str = "execution-executor";

/// Options of `dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// The state directory (created on first start, reused afterwards).
    #[arg(
        long,
        default_value = ".execution-provider",
        env = "EXECUTION_PROVIDER_STATE_DIR"
    )]
    pub state_dir: PathBuf,
    /// Where the gRPC server listens (mTLS).
    #[arg(long, default_value = "127.0.0.1:7443", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Where the read-only Kubernetes API for kubectl listens (mTLS, loopback only); its
    /// kubeconfig is written to `<state-dir>/kubeconfig` at every start.
    #[arg(long, default_value = "127.0.0.1:7444", value_parser = parse_listen)]
    pub kube_listen: SocketAddr,
    /// Where the plain-HTTP health endpoints (`/live`, `/ready`, `/metrics`) listen.
    #[arg(long, default_value = "127.0.0.1:7445", value_parser = parse_listen)]
    pub health_listen: SocketAddr,
    /// The `execution-helper` binary (default: the one beside this program).
    #[arg(long, env = "EXECUTION_HELPER")]
    pub helper: Option<PathBuf>,
    /// Bounds of the RPC limiter; they win over the manifest's `limits`.
    #[command(flatten)]
    pub limits: LimiterBounds,
    /// Bounds on connections and TLS handshakes of the gRPC port.
    #[command(flatten)]
    pub connections: ConnectionBounds,
    /// Log format (and traces).
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Run commands and file operations without any isolation: as this process's user, with
    /// the whole host's files (the state directory's keys included), network and processes
    /// in reach. Without it `dev` refuses to start where it cannot isolate environments.
    #[arg(long)]
    pub unsafe_no_isolation: bool,
}

/// What `dev` prints on every start without isolation.
pub const UNISOLATED_WARNING: &str = "WARNING: --unsafe-no-isolation: commands and file operations run as this process's user, \
with the host's file system, network and processes in reach; anything a command runs can read the state directory's keys";

fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not an address: use IP:PORT such as 127.0.0.1:7443"))
}

/// A running `dev` provider.
pub struct DevProvider {
    /// The address the gRPC server listens on.
    pub addr: SocketAddr,
    /// The state directory.
    pub state: StateDir,
    /// The live security state.
    pub security: Security,
    /// Its manager (tests trigger reloads through it instead of waiting for the interval).
    pub security_manager: SecurityManager,
    /// A client of the embedded API server.
    pub kube: kube::Client,
    /// The read-only API endpoint for kubectl and its kubeconfig.
    pub kubectl: KubectlEndpoint,
    /// The address of the health endpoints (`/live`, `/ready`, `/metrics`).
    pub health_addr: SocketAddr,
    trigger: ShutdownTrigger,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl DevProvider {
    /// Stops the provider gracefully and waits for it.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.trigger.trigger();
        self.task.await?
    }

    /// Starts the shutdown without waiting.
    pub fn trigger_stop(&self) {
        self.trigger.trigger();
    }
}

/// Starts the `dev` provider and returns once it listens.
pub async fn start(args: &DevArgs) -> anyhow::Result<DevProvider> {
    start_with_runtime(args, Runtime::system()).await
}

/// Starts the `dev` provider reading time and randomness through `runtime` (tests inject a
/// clock that they can move, to judge certificates and grants at chosen instants).
pub async fn start_with_runtime(args: &DevArgs, runtime: Runtime) -> anyhow::Result<DevProvider> {
    use anyhow::Context as _;
    let state = StateDir::open_or_init(&args.state_dir)?;
    let api = ApiServer::open(
        &state.apiserver_dir(),
        runtime.clock.clone(),
        runtime.ids.clone(),
    )?;
    let loaded = security::load_directory(&state.manifest_path(), &state.security_dir())?;
    let security = Security::new(&loaded, runtime.clock.clone())?
        .with_ids(runtime.ids.clone())
        .with_limit_flags(args.limits)?;
    let metrics = Metrics::new(security.limiter_rejections(), runtime.clock.clone());
    let kube = kube::Client::new(
        tower::ServiceBuilder::new()
            .layer(KubeApiTraceLayer)
            .layer(metrics.kube_api().layer())
            .service(api.clone()),
        DEV_NAMESPACE,
    );
    let templates = Arc::new(TemplateRegistry::load(state.templates_path())?);
    seed_cluster(&kube, DEV_NAMESPACE, &templates, DEV_STORAGE_PROVISIONER).await?;
    let security_manager = SecurityManager::new(
        security.clone(),
        kube.clone(),
        SecuritySettings {
            manifest_path: state.manifest_path(),
            tls_dir: state.security_dir(),
            namespace: DEV_NAMESPACE.to_owned(),
            configmap: manager::DEFAULT_AUTHORITY_CONFIGMAP.to_owned(),
            reload_interval: manager::DEFAULT_RELOAD_INTERVAL,
            staleness: manager::DEFAULT_STALENESS,
        },
    )
    .with_metrics(metrics.security().clone());
    security_manager
        .reload()
        .await
        .context("the security directory is not authoritative")?;
    let helper = match &args.helper {
        Some(path) => path.clone(),
        None => LocalTransport::helper_beside_current_exe()
            .context("cannot find execution-helper beside this program; pass --helper PATH")?,
    };
    let key_path = state.security_dir().join(dev_executor::SUPERVISOR_KEY_FILE);
    let supervisor_key = dev_executor::load_or_create_key(&key_path, runtime.ids.as_ref())
        .with_context(|| format!("cannot read or create {}", key_path.display()))?;
    let sockets = state.root().join(dev_executor::SUPERVISOR_SOCKETS_DIR);
    let executor = if args.unsafe_no_isolation {
        eprintln!("{UNISOLATED_WARNING}");
        tracing::warn!("{UNISOLATED_WARNING}");
        let helper = LocalTransport::unisolated(helper, state.workspaces_dir());
        DevExecutor::new(helper, sockets, supervisor_key)
    } else {
        let helper = LocalTransport::new(helper, state.workspaces_dir());
        let isolated = DevExecutor::new(helper, sockets, supervisor_key);
        isolated.check_isolation().await.map_err(|e| {
            anyhow::anyhow!(
                "dev cannot isolate environments on this machine ({e}); see docs/sandbox.md for what it needs, \
or pass --unsafe-no-isolation to run commands with no isolation at all"
            )
        })?;
        isolated
    };
    let processes = executor
        .processes()
        .context("dev's executor has no supervisors")?;
    let executor = Arc::new(executor);
    let sandboxes = executor.clone();
    let listener = TokioNet
        .bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = TokioNet::local_addr(&listener)?;
    let (trigger, shutdown) = Shutdown::new();
    let kubectl = dev_kubectl::start(
        &api,
        args.kube_listen,
        state.root(),
        DEV_NAMESPACE,
        runtime.clock.clone(),
        shutdown.clone().wait(),
    )
    .await?;
    let agent = NodeAgent::new(
        kube.clone(),
        DEV_NAMESPACE,
        state.workspaces_dir(),
        runtime.clock.clone(),
        processes,
    );
    tokio::spawn(agent.run(shutdown.clone().wait()));
    // The security authority outlives the shutdown signal: in-flight calls are judged by it
    // until they drain (docs/operating.md §3), so it stops only once the server has stopped.
    let (stop_security, security_stopped) = Shutdown::new();
    tokio::spawn(security_manager.clone().run(security_stopped.wait()));
    let deps_kube = kube.clone();
    let deps = Dependencies {
        runtime,
        kube,
        executor,
        templates,
        security: security.clone(),
        metrics: metrics.clone(),
    };
    let settings = Settings {
        namespace: DEV_NAMESPACE.to_owned(),
        executor_service_account: DEV_EXECUTOR_SERVICE_ACCOUNT.to_owned(),
        connections: args.connections,
    };
    let reconciler = provider::reconciler(&deps, &settings);
    reconciler.record_events(EventRecorder::new(deps.kube.clone(), DEV_NAMESPACE, None));
    let health_listener = TokioNet
        .bind(args.health_listen)
        .await
        .with_context(|| format!("cannot listen on {} for health", args.health_listen))?;
    let health_addr = TokioNet::local_addr(&health_listener)?;
    // A template with `network: outbound` gives its sandboxes the host's network, never these.
    sandboxes.choose_networks_with(Arc::new(TemplateNetworks::new(
        deps.kube.clone(),
        DEV_NAMESPACE,
        deps.templates.clone(),
        vec![addr.port(), kubectl.addr.port(), health_addr.port()],
    )));
    let endpoints = health::Endpoints {
        readiness: health::provider_readiness(reconciler.clone(), security.clone()),
        metrics,
    };
    tokio::spawn(health::serve::<TokioNet>(
        health_listener,
        endpoints,
        shutdown.clone().wait(),
    ));
    let task = tokio::spawn(async move {
        let served =
            provider::run_with::<TokioNet>(deps, settings, reconciler, listener, shutdown).await;
        stop_security.trigger();
        served?;
        Ok(())
    });
    Ok(DevProvider {
        addr,
        state,
        security,
        security_manager,
        kube: deps_kube,
        kubectl,
        health_addr,
        trigger,
        task,
    })
}

/// Runs `dev` in the foreground until Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let DevProvider {
        addr,
        state,
        kubectl,
        health_addr,
        trigger,
        mut task,
        ..
    } = start(&args).await?;
    print_banner(addr, &state.root().display().to_string(), &kubectl);
    eprintln!("health and metrics on http://{health_addr}/ready and http://{health_addr}/metrics");
    tokio::select! {
        result = &mut task => result?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("shutting down");
            trigger.trigger();
            task.await?
        }
    }
}

/// Tells the user where the provider listens. Standard output may be closed (a supervisor or
/// test that read the first line); that must not stop the provider.
fn print_banner(addr: SocketAddr, state: &str, kubectl: &KubectlEndpoint) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "execution-provider dev is listening on {addr} (mTLS)");
    let _ = writeln!(out, "state directory: {state}");
    let _ = writeln!(
        out,
        "read-only Kubernetes API on {} (mTLS): kubectl --kubeconfig {} get executionenvironments -o wide",
        kubectl.addr,
        kubectl.kubeconfig.display()
    );
    let _ = writeln!(out, "try:");
    let _ = writeln!(
        out,
        "  cargo run --release -- client --state-dir {state} --address {addr} exec --binding demo -- 'echo hello > hello.txt && cat hello.txt'"
    );
    let _ = out.flush();
}
