//! The provider process: the store, the gRPC server and the reconciler wired together over
//! the seams. `serve` (production), `dev` and the simulator all call [`run`] with their own
//! [`Dependencies`].

use std::sync::Arc;

use tokio::sync::watch;

use crate::executor::transport::ExecutorTransport;
use crate::metrics::Metrics;
use crate::reconciler::{InitError, Reconciler, ReconcilerConfig};
use crate::runtime::Runtime;
use crate::runtime::net::Net;
use crate::security::Security;
use crate::server::{self, ProviderService, ServeError};
use crate::store::Store;
use crate::store::command_authority::CommandWarden;
use crate::templates::TemplateRegistry;

/// Everything the provider reads the world through.
#[derive(Clone)]
pub struct Dependencies {
    /// Clock and ids.
    pub runtime: Runtime,
    /// The Kubernetes API.
    pub kube: kube::Client,
    /// How helper requests reach executors.
    pub executor: Arc<dyn ExecutorTransport>,
    /// Profiles and templates.
    pub templates: Arc<TemplateRegistry>,
    /// TLS and client policy.
    pub security: Security,
    /// The Prometheus registry (served on the health listener).
    pub metrics: Metrics,
}

/// Where and as whom the provider runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The namespace of environments, Pods and PVCs.
    pub namespace: String,
    /// The dedicated service account of executor Pods.
    pub executor_service_account: String,
    /// Bounds on connections and TLS handshakes of the mTLS port.
    pub connections: server::ConnectionBounds,
}

/// A shutdown signal shared by the server and the reconciler.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// Triggers a [`Shutdown`].
pub struct ShutdownTrigger(watch::Sender<bool>);

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// Completes once shutdown was triggered (or the trigger dropped).
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

impl ShutdownTrigger {
    /// Starts the shutdown.
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }
}

/// Why the provider stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The reconciler's start-up checks failed (nothing was served).
    #[error(transparent)]
    Init(#[from] InitError),
    /// The gRPC server failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

impl ProviderError {
    /// The stable code.
    pub fn code(&self) -> crate::errors::ErrorCode {
        match self {
            Self::Init(e) => e.code(),
            Self::Serve(_) => crate::errors::ErrorCode::Internal,
        }
    }
}

/// The reconciler of these dependencies and settings (not started).
pub fn reconciler(deps: &Dependencies, settings: &Settings) -> Arc<Reconciler> {
    Reconciler::metered(
        deps.kube.clone(),
        ReconcilerConfig {
            namespace: settings.namespace.clone(),
            executor_service_account: settings.executor_service_account.clone(),
            cache_sync_deadline: crate::reconciler::DEFAULT_CACHE_SYNC_DEADLINE,
        },
        deps.templates.clone(),
        deps.runtime.clone(),
        deps.metrics.lifecycle().clone(),
        deps.metrics.reconcile().clone(),
    )
}

/// Runs the reconciler's start-up checks, then the gRPC server on `listener` and the
/// reconciler until `shutdown`, then stops both.
pub async fn run<N: Net>(
    deps: Dependencies,
    settings: Settings,
    listener: N::Listener,
    shutdown: Shutdown,
) -> Result<(), ProviderError> {
    let reconciler = reconciler(&deps, &settings);
    run_with::<N>(deps, settings, reconciler, listener, shutdown).await
}

/// [`run`] with a reconciler the caller also watches (for the health endpoints). Nothing is
/// served when its start-up checks fail; when the reconciler stops with an error (its caches
/// never filled), the server is shut down and that error returned.
pub async fn run_with<N: Net>(
    deps: Dependencies,
    settings: Settings,
    reconciler: Arc<Reconciler>,
    listener: N::Listener,
    shutdown: Shutdown,
) -> Result<(), ProviderError> {
    reconciler.initialize().await?;
    let store = Store::new(
        deps.kube.clone(),
        &settings.namespace,
        deps.templates.clone(),
        deps.metrics
            .executor()
            .wrap(crate::telemetry::traces::executor::traced(
                deps.executor.clone(),
            )),
        deps.runtime.clone(),
    )
    .with_metrics(deps.metrics.lifecycle().clone())
    .with_events(reconciler.events());
    // Detached commands whose claim lapses are ended by the reconciler's passes, judging the
    // claim's client by this replica's security state (docs/commands.md §5.5).
    reconciler.watch_commands(CommandWarden::new(
        store.clone(),
        Arc::new(deps.security.clone()),
    ));
    let (stop_serving, serving_stopped) = Shutdown::new();
    let stop_serving = Arc::new(stop_serving);
    let reconciling = tokio::spawn({
        let stop_serving = stop_serving.clone();
        let shutdown = shutdown.clone();
        async move {
            let result = reconciler.run(shutdown.wait()).await;
            stop_serving.trigger();
            result
        }
    });
    let forwarding = tokio::spawn(async move {
        shutdown.wait().await;
        stop_serving.trigger();
    });
    let service = ProviderService::new(store, deps.security.clone());
    let served = server::serve::<N>(
        listener,
        service,
        &deps.security,
        deps.metrics.rpc(),
        settings.connections,
        serving_stopped.wait(),
    )
    .await;
    forwarding.abort();
    match reconciling.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::error!(%error, "reconciler stopped");
            return Err(error.into());
        }
        Err(error) => tracing::error!(%error, "reconciler task failed"),
    }
    Ok(served?)
}
