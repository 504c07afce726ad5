//! The reconciler (k8s-executor §2): turns each `ExecutionEnvironment` into a retained
//! workspace PVC and a hardened executor Pod, records their identities in the status by
//! guarded compare-and-swap, reports readiness, and drives the admin lifecycle phases.
//!
//! Every replica reconciles every environment: there is no leader election; safety comes from
//! optimistic concurrency, delete preconditions on UID and the runtime-observation guard of
//! every status write. Start-up ([`Reconciler::initialize`]) only reads: the preflight of the
//! RuntimeClasses and StorageClasses the templates name, and the capacity ledger's presence.
//! A missing or exited executor fences the environment (DECISIONS 15), and a fenced environment
//! is recovered by proving its exact executor's end ([`recovery`]); failures and waiting
//! Pods are retried with exponential backoff, never in a fixed hot loop. Watch events enqueue an
//! environment by the rules of §2.2 ([`enqueue`]): the reconciler's own status writes never
//! wake it again.

pub mod conditions;
pub mod enqueue;
pub mod error;
mod flow;
mod late;
mod ledger;
mod lifecycle;
mod phases;
pub mod pod;
pub mod preflight;
pub mod pvc;
pub mod recovery;
mod removal;
pub mod render;
mod retained;
mod revoke;
pub mod status;
pub mod upgrade;
pub mod validate_pod;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::OnceCell;

pub use error::{InitError, ReconcileError};

use crate::kube::crd::{ExecutionEnvironment, LABEL_ENVIRONMENT, LEDGER_SHARDS, ledger_shard_name};
use crate::metrics::{LifecycleMetrics, ReconcileMetrics};
use crate::runtime::Runtime;
use crate::telemetry::events::{EnvironmentEvent, EventRecorder};
use crate::templates::TemplateRegistry;

/// First wait after a failed reconcile; doubles with every further failure.
const FAILURE_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest wait before a failed reconcile is retried.
const FAILURE_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// First wait while the executor Pod is not Ready; doubles while it stays so.
const NOT_READY_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest wait while the executor Pod is not Ready.
const NOT_READY_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How long a lifecycle phase that waits for Kubernetes looks again without an event.
const WAITING_REQUEUE: Duration = Duration::from_secs(5);

/// How often start-up looks whether the caches have filled.
const SYNC_POLL: Duration = Duration::from_millis(100);

/// How long start-up waits for the environment, Pod and PVC caches to fill before it gives up
/// (the process then exits non-zero instead of staying unready forever).
pub const DEFAULT_CACHE_SYNC_DEADLINE: Duration = Duration::from_secs(120);

/// What the reconciler needs.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    /// The provider namespace.
    pub namespace: String,
    /// The service account executor Pods run as (dedicated, never `default`).
    pub executor_service_account: String,
    /// How long the caches may take to fill at start-up ([`DEFAULT_CACHE_SYNC_DEADLINE`]).
    pub cache_sync_deadline: Duration,
}

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the environment, its Pod or its PVC changes.
    Wait,
    /// Look again after this long (an operation lease deadline, a waiting phase).
    After(Duration),
    /// The executor Pod exists but is not Ready: look again with a growing backoff.
    PodNotReady,
}

impl Next {
    /// This, but no later than `deadline`.
    pub fn at_most(self, deadline: Duration) -> Self {
        match self {
            Self::After(d) if d <= deadline => self,
            _ => Self::After(deadline),
        }
    }
}

/// What reconciles share.
pub struct Context {
    client: kube::Client,
    config: ReconcilerConfig,
    templates: Arc<TemplateRegistry>,
    runtime: Runtime,
    lifecycle: LifecycleMetrics,
    metrics: ReconcileMetrics,
    /// Ends supervised commands whose claim lapsed (docs/commands.md §5.5), and asks the
    /// supervisor about an expired operation before fencing (through its store); none: this
    /// reconciler runs without a store (tests, tools), no command is judged and an expired
    /// operation is fenced.
    commands: std::sync::OnceLock<crate::store::command_authority::CommandWarden>,
    /// Publishes Events on environments; none: no events (tests, tools, the simulator).
    events: std::sync::OnceLock<EventRecorder>,
}

impl Context {
    /// Records `event` about `env`, best effort (never waits, never fails the reconcile).
    pub(crate) fn record_event(&self, env: &ExecutionEnvironment, event: EnvironmentEvent<'_>) {
        if let Some(events) = self.events.get() {
            events.record(env, event);
        }
    }
}

/// One reconciler per provider process.
pub struct Reconciler {
    ctx: Context,
    init: OnceCell<Result<(), InitError>>,
    synced: std::sync::atomic::AtomicBool,
    cache_failure: std::sync::OnceLock<InitError>,
    queued: std::sync::atomic::AtomicU64,
    failures: Mutex<BTreeMap<String, u32>>,
    waiting: Mutex<BTreeMap<String, u32>>,
}

impl Reconciler {
    /// A reconciler over `config.namespace`.
    pub fn new(
        client: kube::Client,
        config: ReconcilerConfig,
        templates: Arc<TemplateRegistry>,
        runtime: Runtime,
    ) -> Arc<Self> {
        Self::metered(
            client,
            config,
            templates,
            runtime,
            LifecycleMetrics::default(),
            ReconcileMetrics::default(),
        )
    }

    /// [`Reconciler::new`] recording fences in `lifecycle` and its reconciles, readiness and
    /// the phases of its cache in `metrics`.
    pub fn metered(
        client: kube::Client,
        config: ReconcilerConfig,
        templates: Arc<TemplateRegistry>,
        runtime: Runtime,
        lifecycle: LifecycleMetrics,
        metrics: ReconcileMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            ctx: Context {
                client,
                config,
                templates,
                runtime,
                lifecycle,
                metrics,
                commands: std::sync::OnceLock::new(),
                events: std::sync::OnceLock::new(),
            },
            init: OnceCell::new(),
            synced: Default::default(),
            cache_failure: Default::default(),
            queued: Default::default(),
            failures: Default::default(),
            waiting: Default::default(),
        })
    }

    /// The start-up checks, run once; later calls answer the first result. Never mutates.
    pub async fn initialize(&self) -> Result<(), InitError> {
        self.init
            .get_or_init(|| async {
                preflight::preflight(&self.ctx.client, &self.ctx.templates).await?;
                let ledgers = Api::<ConfigMap>::namespaced(
                    self.ctx.client.clone(),
                    &self.ctx.config.namespace,
                );
                for index in 0..LEDGER_SHARDS {
                    let name = ledger_shard_name(index);
                    match ledgers.get_opt(&name).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            return Err(InitError::Ledger(format!(
                                "capacity ledger ConfigMap {name:?} is missing (the Helm chart creates it)"
                            )));
                        }
                        Err(e) => {
                            return Err(InitError::Ledger(format!(
                                "capacity ledger ConfigMap {name:?} unavailable: {e}"
                            )));
                        }
                    }
                }
                Ok(())
            })
            .await
            .clone()
    }

    /// `ready`, `profile-resource-unavailable`, `capacity-ledger-unavailable`,
    /// `controller-cache-unavailable` or `controller-starting`.
    pub fn readiness_reason(&self) -> &'static str {
        if let Some(failure) = self.cache_failure.get() {
            return failure.readiness_reason();
        }
        match self.init.get() {
            Some(Err(e)) => e.readiness_reason(),
            Some(Ok(())) if self.synced.load(std::sync::atomic::Ordering::SeqCst) => "ready",
            _ => "controller-starting",
        }
    }

    /// Whether the reconciler is initialised and its caches are filled.
    pub fn is_ready(&self) -> bool {
        self.readiness_reason() == "ready"
    }

    /// How many reconciles the work queue has started so far (every enqueue that reached the
    /// worker, whether from a watch event or a requeue).
    pub fn queued_reconciles(&self) -> u64 {
        self.queued.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What reconciles share (for the status writers of [`status`]).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// From now on every pass of an environment with open command leases ends the commands
    /// whose claim lapsed, through `warden` (the provider sets it once its store exists; a
    /// second call changes nothing).
    pub fn watch_commands(&self, warden: crate::store::command_authority::CommandWarden) {
        let _ = self.ctx.commands.set(warden);
    }

    /// Publishes Events on environments through `events` (fences, recoveries, lifecycle
    /// steps); set once, before the reconciler runs.
    pub fn record_events(&self, events: EventRecorder) {
        let _ = self.ctx.events.set(events);
    }

    /// The Events publisher set by [`Reconciler::record_events`] (disabled without one).
    pub fn events(&self) -> EventRecorder {
        self.ctx.events.get().cloned().unwrap_or_default()
    }

    /// Reconciles one environment by name (what the work queue calls).
    pub async fn reconcile(&self, name: &str) -> Result<Next, ReconcileError> {
        // Boxed: the whole flow's state lives on the heap, not on the caller's stack (a debug
        // build's reconcile future is large).
        Box::pin(flow::reconcile(&self.ctx, name)).await
    }

    /// Initialises, then reconciles until `shutdown` completes. Fails when a cache (of
    /// environments, executor Pods or workspace PVCs) does not fill within the configured
    /// deadline: readiness then reports `controller-cache-unavailable`.
    pub async fn run(
        self: Arc<Self>,
        shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ) -> Result<(), InitError> {
        self.initialize().await?;
        let ns = self.ctx.config.namespace.clone();
        let client = self.ctx.client.clone();
        let envs = Api::<ExecutionEnvironment>::namespaced(client.clone(), &ns);
        let pods = Api::<Pod>::namespaced(client.clone(), &ns);
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(client, &ns);
        let labelled = || watcher::Config::default().labels(LABEL_ENVIRONMENT);
        let (pod_ns, pvc_ns) = (ns.clone(), ns.clone());
        // §2.2: an environment event passes only when a field a decision depends on changed.
        let (reader, writer) = reflector::store();
        let triggers = watcher(envs, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .applied_objects()
            .predicate_filter(
                |env: &ExecutionEnvironment| Some(enqueue::trigger_fingerprint(env)),
                Default::default(),
            );
        let (pod_cache, pod_writer) = reflector::store();
        let pod_events = watcher(pods, labelled())
            .default_backoff()
            .reflect(pod_writer)
            .touched_objects();
        let (pvc_cache, pvc_writer) = reflector::store();
        let pvc_events = watcher(pvcs, labelled())
            .default_backoff()
            .reflect(pvc_writer)
            .touched_objects();
        let controller = Controller::for_stream(triggers, reader)
            .watches_stream(pod_events, move |pod: Pod| {
                by_label(pod.metadata.labels.as_ref(), &pod_ns)
            })
            .watches_stream(pvc_events, move |pvc: PersistentVolumeClaim| {
                by_label(pvc.metadata.labels.as_ref(), &pvc_ns)
            });
        let env_cache = controller.store();
        let census = env_cache.clone();
        self.ctx.metrics.phases().install(Arc::new(move || {
            phases::count(census.state().iter().map(|env| env.as_ref()))
        }));
        let deadline = self.ctx.config.cache_sync_deadline;
        let syncing = self
            .clone()
            .mark_synced(deadline, env_cache, pod_cache, pvc_cache);
        let last_error = Arc::new(Mutex::new(String::new()));
        let seen_error = last_error.clone();
        let reconciling = controller
            .graceful_shutdown_on(shutdown)
            .run(reconcile_object, error_policy, self.clone())
            .for_each(move |result| {
                if let Err(error) = result {
                    tracing::debug!(%error, "reconcile failed");
                    *seen_error.lock().expect("error lock") = error.to_string();
                }
                async {}
            });
        tokio::pin!(reconciling, syncing);
        let synced = tokio::select! {
            () = &mut reconciling => return Ok(()),
            synced = &mut syncing => synced,
        };
        if synced {
            reconciling.await;
            return Ok(());
        }
        let last = last_error.lock().expect("error lock").clone();
        let failure = InitError::Cache(format!(
            "the environment, Pod and PVC caches did not fill within {deadline:?}{}{last}",
            if last.is_empty() {
                ""
            } else {
                "; last error: "
            }
        ));
        let _ = self.cache_failure.set(failure.clone());
        Err(failure)
    }

    /// Waits until all three caches are filled, then marks the reconciler synced; `false`
    /// when `deadline` passed first. A cache dropped before it filled (the controller is
    /// shutting down) never answers.
    async fn mark_synced(
        self: Arc<Self>,
        deadline: Duration,
        envs: reflector::Store<ExecutionEnvironment>,
        pods: reflector::Store<Pod>,
        pvcs: reflector::Store<PersistentVolumeClaim>,
    ) -> bool {
        let all_filled = async {
            // A waiter registered before a cache fills is not always woken, so look again on a
            // short period until every first listing is in.
            loop {
                let filled = async {
                    envs.wait_until_ready().await?;
                    pods.wait_until_ready().await?;
                    pvcs.wait_until_ready().await
                };
                match tokio::time::timeout(SYNC_POLL, filled).await {
                    Ok(Ok(())) => return true,
                    Ok(Err(_)) => std::future::pending::<()>().await,
                    Err(_) => {}
                }
            }
        };
        let filled = tokio::time::timeout(deadline, all_filled)
            .await
            .unwrap_or(false);
        if filled {
            self.synced.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        filled
    }

    fn next_action(&self, name: &str, next: Next) -> Action {
        self.failures.lock().expect("backoff lock").remove(name);
        let mut waiting = self.waiting.lock().expect("backoff lock");
        match next {
            Next::Wait => {
                waiting.remove(name);
                Action::await_change()
            }
            Next::After(d) => {
                waiting.remove(name);
                Action::requeue(d)
            }
            Next::PodNotReady => {
                let count = waiting.entry(name.to_owned()).or_insert(0);
                let delay = backoff(NOT_READY_BACKOFF_BASE, NOT_READY_BACKOFF_MAX, *count);
                *count = count.saturating_add(1);
                Action::requeue(delay)
            }
        }
    }

    fn failure_action(&self, name: &str) -> Action {
        let mut failures = self.failures.lock().expect("backoff lock");
        let count = failures.entry(name.to_owned()).or_insert(0);
        let delay = backoff(FAILURE_BACKOFF_BASE, FAILURE_BACKOFF_MAX, *count);
        *count = count.saturating_add(1);
        Action::requeue(delay)
    }
}

/// `base · 2^attempt`, capped at `max`.
pub fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1u32 << attempt.min(20)).min(max)
}

fn by_label(
    labels: Option<&BTreeMap<String, String>>,
    ns: &str,
) -> Option<ObjectRef<ExecutionEnvironment>> {
    enqueue::environment_of(labels).map(|v| ObjectRef::<ExecutionEnvironment>::new(v).within(ns))
}

async fn reconcile_object(
    env: Arc<ExecutionEnvironment>,
    reconciler: Arc<Reconciler>,
) -> Result<Action, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    reconciler
        .queued
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let clock = &reconciler.ctx.runtime.clock;
    let started = clock.monotonic();
    let result = reconciler.reconcile(&name).await;
    let seconds = clock.monotonic().duration_since(started).as_secs_f64();
    reconciler
        .ctx
        .metrics
        .reconciled(seconds, result.as_ref().err().map(ReconcileError::code));
    Ok(reconciler.next_action(&name, result?))
}

fn error_policy(
    env: Arc<ExecutionEnvironment>,
    error: &ReconcileError,
    reconciler: Arc<Reconciler>,
) -> Action {
    let name = env.metadata.name.clone().unwrap_or_default();
    tracing::warn!(env = %name, %error, code = error.code().as_str(), "reconcile failed; retrying with backoff");
    reconciler.failure_action(&name)
}

/// Runs a reconciler until `shutdown` (the provider's entry point; fails on start-up errors).
pub async fn run(
    client: kube::Client,
    config: ReconcilerConfig,
    templates: Arc<TemplateRegistry>,
    runtime: Runtime,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), InitError> {
    Reconciler::new(client, config, templates, runtime)
        .run(shutdown)
        .await
}

#[cfg(test)]
mod tests;
