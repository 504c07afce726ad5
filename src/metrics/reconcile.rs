//! The reconciler's metrics: `execution_provider_reconcile_duration_seconds`,
//! `execution_provider_reconcile_errors_total{code}`,
//! `execution_provider_ensure_to_ready_seconds` (an environment's creation to its first
//! Ready) and the gauge `execution_provider_environments{phase}`.
//!
//! The phase gauge is counted at each scrape from the reconciler's watch cache (memory the
//! controller keeps anyway), never by a list request; until the reconciler runs it is absent.
//! Every phase is reported, zero included, so a dashboard's series do not come and go.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::latency_histogram;
use crate::errors::ErrorCode;

/// A stable error code label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The stable code, e.g. `conflict`.
    pub code: String,
}

/// A phase label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase word of `DescribeEnvironment`, e.g. `Ready`.
    pub phase: String,
}

/// How many environments the cache holds in each phase, every phase listed.
pub type PhaseCounts = Arc<dyn Fn() -> Vec<(&'static str, i64)> + Send + Sync>;

/// The collector of `environments{phase}`; empty until a source is installed.
#[derive(Clone, Default)]
pub struct EnvironmentPhases(Arc<Mutex<Option<PhaseCounts>>>);

impl std::fmt::Debug for EnvironmentPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvironmentPhases")
    }
}

impl EnvironmentPhases {
    /// Counts from `source` from now on (the reconciler installs its cache once it runs).
    pub fn install(&self, source: PhaseCounts) {
        *self.0.lock().expect("phase source lock") = Some(source);
    }
}

impl Collector for EnvironmentPhases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let source = self.0.lock().expect("phase source lock").clone();
        let Some(source) = source else {
            return Ok(());
        };
        let mut metric = encoder.encode_descriptor(
            "environments",
            "Environments in the reconciler's cache by phase",
            None,
            MetricType::Gauge,
        )?;
        for (phase, count) in source() {
            let labels = PhaseLabels {
                phase: phase.to_owned(),
            };
            ConstGauge::new(count).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Buckets of ensure-to-ready: 50 ms to about 14 minutes.
fn readiness_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 15))
}

/// The reconciler's metrics (cheap to clone); the default records into no registry.
#[derive(Clone)]
pub struct ReconcileMetrics {
    duration: Histogram,
    errors: Family<CodeLabels, Counter>,
    ensure_to_ready: Histogram,
    phases: EnvironmentPhases,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            duration: latency_histogram(),
            errors: Family::default(),
            ensure_to_ready: readiness_histogram(),
            phases: EnvironmentPhases::default(),
        }
    }
}

impl ReconcileMetrics {
    /// Registers these metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile of one environment",
            metrics.duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed (and are retried with backoff), by stable code",
            metrics.errors.clone(),
        );
        registry.register(
            "ensure_to_ready_seconds",
            "From an environment's creation to the reconcile that first records it Ready",
            metrics.ensure_to_ready.clone(),
        );
        registry.register_collector(Box::new(metrics.phases.clone()));
        for code in crate::errors::ALL_CODES {
            let _ = metrics.errors.get_or_create(&CodeLabels {
                code: code.as_str().to_owned(),
            });
        }
        metrics
    }

    /// One reconcile that took `seconds` and failed with `error`, if it did.
    pub fn reconciled(&self, seconds: f64, error: Option<ErrorCode>) {
        self.duration.observe(seconds);
        if let Some(code) = error {
            self.errors
                .get_or_create(&CodeLabels {
                    code: code.as_str().to_owned(),
                })
                .inc();
        }
    }

    /// An environment first recorded Ready `seconds` after its creation.
    pub fn first_ready(&self, seconds: f64) {
        self.ensure_to_ready.observe(seconds);
    }

    /// The phase gauge's collector.
    pub fn phases(&self) -> &EnvironmentPhases {
        &self.phases
    }
}
