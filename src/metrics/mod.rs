//! The provider's Prometheus metrics (issue 17): one registry built once per process by
//! `serve` or `dev`, carried in [`crate::provider::Dependencies`], and encoded in the text
//! exposition format for `GET /metrics` on the health listener.
//!
//! Every label has a bounded set of values (a method of the service, a gRPC code): no label
//! carries an environment, owner or binding.

pub mod executor;
pub mod kube_api;
pub mod lifecycle;
pub mod reconcile;
pub mod rpc;
pub mod security;

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::runtime::clock::Clock;
#[cfg(doc)]
use crate::security::Security;
pub use executor::ExecutorMetrics;
pub use kube_api::{KubeApiLayer, KubeApiMetrics};
pub use lifecycle::{FenceReason, LifecycleMetrics};
pub use reconcile::ReconcileMetrics;
pub use rpc::{RpcMetrics, RpcMetricsLayer};
pub use security::{ReloadOutcome, SecurityMetrics};

/// The prefix of every metric name.
pub const PREFIX: &str = "execution_provider";

/// The registry and the metrics the provider records into it (cheap to clone).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    rpc: RpcMetrics,
    kube_api: KubeApiMetrics,
    executor: ExecutorMetrics,
    lifecycle: LifecycleMetrics,
    reconcile: ReconcileMetrics,
    security: SecurityMetrics,
}

/// Latency buckets from 0.5 ms to about 16 s.
pub(crate) fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    /// Registers every metric. `limiter_rejections` is the counter the security state
    /// increments ([`Security::limiter_rejections`]); latencies are read from `clock`.
    pub fn new(limiter_rejections: Counter, clock: Arc<dyn Clock>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let rpc = RpcMetrics::register(&mut registry, clock.clone());
        registry.register(
            "limiter_rejections",
            "RPCs refused with RESOURCE_EXHAUSTED because a limiter bound was reached",
            limiter_rejections,
        );
        let kube_api = KubeApiMetrics::register(&mut registry, clock.clone());
        let executor = ExecutorMetrics::register(&mut registry, clock);
        let lifecycle = LifecycleMetrics::register(&mut registry);
        let reconcile = ReconcileMetrics::register(&mut registry);
        let security = SecurityMetrics::register(&mut registry);
        Self {
            registry: Arc::new(registry),
            rpc,
            kube_api,
            executor,
            lifecycle,
            reconcile,
            security,
        }
    }

    /// The RPC metrics (for the server's layer).
    pub fn rpc(&self) -> &RpcMetrics {
        &self.rpc
    }

    /// The Kubernetes API request metrics (for the client's transport).
    pub fn kube_api(&self) -> &KubeApiMetrics {
        &self.kube_api
    }

    /// The executor call metrics (for the executor transport).
    pub fn executor(&self) -> &ExecutorMetrics {
        &self.executor
    }

    /// Claims, leases, fences and recoveries (for the store and the reconciler).
    pub fn lifecycle(&self) -> &LifecycleMetrics {
        &self.lifecycle
    }

    /// The reconciler's own metrics.
    pub fn reconcile(&self) -> &ReconcileMetrics {
        &self.reconcile
    }

    /// Reloads and the authority generation (for the security manager).
    pub fn security(&self) -> &SecurityMetrics {
        &self.security
    }

    /// The current values in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
