//! `execution-provider serve`: the production entry point (k8s-executor §5.4). It validates
//! its flags, loads the templates, the security directory and the supervisor key
//! ([`crate::security::supervisor_key`]), connects to the cluster (a kubeconfig file, or
//! in-cluster / inferred configuration), runs the reconciler's start-up checks (exiting
//! non-zero with a clear message when a RuntimeClass, StorageClass or the capacity ledger is
//! missing), then serves gRPC, the reconciler and the health endpoints together until SIGTERM
//! or Ctrl-C, and shuts down gracefully.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};

use crate::executor::PodExecutor;
use crate::health;
use crate::metrics::{KubeApiMetrics, Metrics};
use crate::provider::{self, Dependencies, Settings, Shutdown};
use crate::runtime::Runtime;
use crate::runtime::net::{Net, TokioNet};
use crate::security::{self, Security, SecurityManager, SecuritySettings, manager, supervisor_key};
use crate::server::ConnectionBounds;
use crate::server::limiter::LimiterBounds;
use crate::telemetry::TelemetryArgs;
use crate::telemetry::events::EventRecorder;
use crate::telemetry::traces::kube_api::KubeApiTraceLayer;
use crate::templates::TemplateRegistry;

/// Flags of `serve`; each also reads an `EXECUTION_PROVIDER_*` environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// A kubeconfig file; without it the in-cluster (or otherwise inferred) configuration.
    #[arg(long, env = "EXECUTION_PROVIDER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of environments, executor Pods and workspace PVCs.
    #[arg(long, env = "EXECUTION_PROVIDER_NAMESPACE")]
    pub namespace: String,
    /// The dedicated service account executor Pods run as (never `default`).
    #[arg(long, env = "EXECUTION_PROVIDER_EXECUTOR_SERVICE_ACCOUNT")]
    pub executor_service_account: String,
    /// The templates file (k8s-executor §3.1).
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_TEMPLATES",
        default_value = "/etc/execution-provider/templates.yaml"
    )]
    pub templates: PathBuf,
    /// The security manifest.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_SECURITY_MANIFEST",
        default_value = "/etc/execution-provider/security/manifest.json"
    )]
    pub security_policy_manifest: PathBuf,
    /// The directory holding the TLS and key files the manifest names.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_TLS_DIRECTORY",
        default_value = "/etc/execution-provider/security"
    )]
    pub tls_directory: PathBuf,
    /// The supervisor key `K_sup` (32 bytes): required when given. Without the flag, the
    /// security directory's `supervisor.key` when present, else no supervisor sessions
    /// (detached commands answer UNIMPLEMENTED). Read once, at start (docs/commands.md §4.2).
    #[arg(long, env = "EXECUTION_PROVIDER_SUPERVISOR_KEY_FILE")]
    pub supervisor_key_file: Option<PathBuf>,
    /// The mTLS gRPC address.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_LISTEN",
        default_value = "0.0.0.0:8443"
    )]
    pub listen: SocketAddr,
    /// The ConfigMap holding the durable high-water mark of the security authority.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_SECURITY_AUTHORITY_CONFIGMAP",
        default_value = manager::DEFAULT_AUTHORITY_CONFIGMAP
    )]
    pub security_authority_configmap: String,
    /// How often the security directory is reloaded (1ms to 1m), e.g. `2s`.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_SECURITY_RELOAD_INTERVAL",
        default_value = "2s",
        value_parser = parse_reload_interval
    )]
    pub security_reload_interval: std::time::Duration,
    /// The plain-HTTP health address (`/live`, `/ready`, `/metrics`); `off` disables it.
    #[arg(
        long,
        env = "EXECUTION_PROVIDER_HEALTH_LISTEN",
        default_value = "0.0.0.0:8081"
    )]
    pub health_listen: String,
    /// Bounds of the RPC limiter; they win over the manifest's `limits`.
    #[command(flatten)]
    pub limits: LimiterBounds,
    /// Bounds on connections and TLS handshakes of the gRPC port.
    #[command(flatten)]
    pub connections: ConnectionBounds,
    /// Log format (and traces).
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

fn parse_reload_interval(text: &str) -> Result<std::time::Duration, String> {
    let interval = super::client::parse_duration(text)?;
    if interval.is_zero() || interval > std::time::Duration::from_secs(60) {
        return Err(format!("`{text}` must be more than 0 and at most 1m"));
    }
    Ok(interval)
}

/// Checks the flags that have rules beyond their type.
pub fn validate(args: &ServeArgs) -> anyhow::Result<Option<SocketAddr>> {
    if !is_dns_label(&args.namespace) {
        bail!(
            "--namespace must be a DNS-1123 label, got {:?}",
            args.namespace
        );
    }
    let account = &args.executor_service_account;
    if !is_dns_label(account) || account == "default" {
        bail!(
            "--executor-service-account must be a dedicated DNS-1123 label (not `default`), got {account:?}"
        );
    }
    match args.health_listen.as_str() {
        "off" | "" => Ok(None),
        text => text
            .parse()
            .map(Some)
            .with_context(|| format!("--health-listen: {text:?} is not an address or `off`")),
    }
}

fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// The Kubernetes client: from `kubeconfig` when given, otherwise inferred (in-cluster first);
/// every request is recorded in `metrics` and traced inside a traced call.
pub async fn kube_client(
    kubeconfig: Option<&Path>,
    metrics: &KubeApiMetrics,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster configuration and no usable kubeconfig")?,
    };
    let builder = kube::client::ClientBuilder::try_from(config)
        .context("cannot build the Kubernetes client")?;
    Ok(builder
        .with_layer(&metrics.layer())
        .with_layer(&KubeApiTraceLayer)
        .build())
}

/// Runs `serve` until a shutdown signal.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let health_addr = validate(&args)?;
    let templates = TemplateRegistry::load(&args.templates)
        .with_context(|| format!("decode execution templates {}", args.templates.display()))?;
    let runtime = Runtime::system();
    let loaded = security::load_directory(&args.security_policy_manifest, &args.tls_directory)
        .context("cannot load the security directory")?;
    let security = Security::new(&loaded, runtime.clock.clone())
        .context("the security directory is not usable")?
        .with_ids(runtime.ids.clone())
        .with_limit_flags(args.limits)
        .context("the RPC limiter bounds are not usable")?;
    let supervisor_key =
        supervisor_key::load(args.supervisor_key_file.as_deref(), &args.tls_directory)
            .context("cannot load the supervisor key")?;
    let metrics = Metrics::new(security.limiter_rejections(), runtime.clock.clone());
    let kube = kube_client(args.kubeconfig.as_deref(), metrics.kube_api()).await?;
    let executor = match supervisor_key {
        Some(key) => {
            tracing::info!("supervisor key loaded: detached commands are served");
            PodExecutor::new(kube.clone()).with_supervisor_key(key)
        }
        None => {
            tracing::warn!(
                "no {} in {} and no --supervisor-key-file: detached commands answer UNIMPLEMENTED",
                supervisor_key::SUPERVISOR_KEY_FILE,
                args.tls_directory.display()
            );
            PodExecutor::new(kube.clone())
        }
    };
    let security_manager = SecurityManager::new(
        security.clone(),
        kube.clone(),
        SecuritySettings {
            manifest_path: args.security_policy_manifest.clone(),
            tls_dir: args.tls_directory.clone(),
            namespace: args.namespace.clone(),
            configmap: args.security_authority_configmap.clone(),
            reload_interval: args.security_reload_interval,
            staleness: manager::DEFAULT_STALENESS,
        },
    )
    .with_metrics(metrics.security().clone());
    let deps = Dependencies {
        metrics: metrics.clone(),
        runtime,
        executor: Arc::new(executor),
        kube,
        templates: Arc::new(templates),
        security,
    };
    let settings = Settings {
        namespace: args.namespace.clone(),
        executor_service_account: args.executor_service_account.clone(),
        connections: args.connections,
    };
    let reconciler = provider::reconciler(&deps, &settings);
    // The replica's Pod name (HOSTNAME in a Pod) reports its Events.
    let instance = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty());
    reconciler.record_events(EventRecorder::new(
        deps.kube.clone(),
        &settings.namespace,
        instance,
    ));
    // Preflight before anything listens: a failure ends the process with its reason.
    reconciler.initialize().await.context("cannot start")?;
    // Then the first reload, which must succeed: it publishes this authority to the durable
    // ledger (preflight itself writes nothing).
    security_manager
        .reload()
        .await
        .context("the security directory is not authoritative")?;
    let listener = TokioNet
        .bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let (trigger, shutdown) = Shutdown::new();
    if let Some(addr) = health_addr {
        let health = TokioNet
            .bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for health"))?;
        let endpoints = health::Endpoints {
            readiness: health::provider_readiness(reconciler.clone(), security_manager.security()),
            metrics,
        };
        tokio::spawn(health::serve::<TokioNet>(
            health,
            endpoints,
            shutdown.clone().wait(),
        ));
    }
    // The security authority outlives the shutdown signal: in-flight calls are judged by it
    // until they drain (docs/operating.md §3), so it stops only once the server has stopped.
    let (stop_security, security_stopped) = Shutdown::new();
    tokio::spawn(security_manager.clone().run(security_stopped.wait()));
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        trigger.trigger();
    });
    tracing::info!(listen = %args.listen, namespace = %args.namespace, "serving");
    let served =
        provider::run_with::<TokioNet>(deps, settings, reconciler, listener, shutdown).await;
    stop_security.trigger();
    served?;
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parse(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["execution-provider", "serve", "--namespace", "execution"];
        argv.extend_from_slice(extra);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Serve(args) => *args,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn the_executor_account_must_be_dedicated() {
        for account in ["default", "Executor", "-x", ""] {
            let flag = format!("--executor-service-account={account}");
            let args = parse(&[&flag]);
            assert!(validate(&args).is_err(), "{account:?}");
        }
        let args = parse(&["--executor-service-account", "execution-executor"]);
        assert_eq!(
            validate(&args).unwrap(),
            Some("0.0.0.0:8081".parse().unwrap())
        );
    }

    #[test]
    fn the_health_server_can_be_turned_off_and_bad_addresses_are_refused() {
        let base = ["--executor-service-account", "execution-executor"];
        let off = parse(&[&base[..], &["--health-listen", "off"]].concat());
        assert_eq!(validate(&off).unwrap(), None);
        let bad = parse(&[&base[..], &["--health-listen", ":8081"]].concat());
        assert!(validate(&bad).is_err());
    }

    #[test]
    fn limiter_bounds_are_flags_in_range() {
        let base = ["--executor-service-account", "execution-executor"];
        assert_eq!(parse(&base).limits, LimiterBounds::default());
        let set = parse(
            &[
                &base[..],
                &[
                    "--max-concurrent-rpcs",
                    "256",
                    "--max-concurrent-rpcs-per-client",
                    "8",
                ],
            ]
            .concat(),
        );
        assert_eq!(
            (set.limits.global, set.limits.per_client),
            (Some(256), Some(8))
        );
        for bad in ["0", "4097", "many"] {
            let argv = [
                "execution-provider",
                "serve",
                "--namespace",
                "execution",
                "--max-concurrent-rpcs",
                bad,
            ];
            assert!(crate::cli::Cli::try_parse_from(argv).is_err(), "{bad}");
        }
    }
}
