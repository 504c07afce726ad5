//! The provider's Prometheus metrics (issue 17): one registry built once per process by
//! `serve` or `dev`, carried in [`crate::provider::Dependencies`], and encoded in the text
//! exposition format for `GET /metrics` on the health listener.
//!
//! Every label has a bounded set of values (a method of the service, a gRPC code): no label
//! carries an environment, owner or binding.

pub mod rpc;

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::runtime::clock::Clock;
#[cfg(doc)]
use crate::security::Security;
pub use rpc::{RpcMetrics, RpcMetricsLayer};

/// The prefix of every metric name.
pub const PREFIX: &str = "execution_provider";

/// The registry and the metrics the provider records into it (cheap to clone).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    rpc: RpcMetrics,
}

impl Metrics {
    /// Registers every metric. `limiter_rejections` is the counter the security state
    /// increments ([`Security::limiter_rejections`]); latencies are read from `clock`.
    pub fn new(limiter_rejections: Counter, clock: Arc<dyn Clock>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let rpc = RpcMetrics::register(&mut registry, clock);
        registry.register(
            "limiter_rejections",
            "RPCs refused with RESOURCE_EXHAUSTED because a limiter bound was reached",
            limiter_rejections,
        );
        Self {
            registry: Arc::new(registry),
            rpc,
        }
    }

    /// The RPC metrics (for the server's layer).
    pub fn rpc(&self) -> &RpcMetrics {
        &self.rpc
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
