//! What happens to environments, recorded by the store and the reconciler:
//! `execution_provider_claim_duration_seconds{outcome}` (an acquire of the run claim),
//! `execution_provider_operation_lease_renewals_total{outcome}`,
//! `execution_provider_fences_total{reason}` and `execution_provider_recoveries_total{outcome}`.
//!
//! The default value records into metrics no registry holds (for tests and tools that build
//! a store or a reconciler without a scrape); [`LifecycleMetrics::register`] makes them
//! visible.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::latency_histogram;
use crate::errors::ErrorCode;

/// Why an environment was fenced (FenceUnknown written): a bounded vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceReason {
    /// An operation lease ran out (its holder crashed or stalled).
    LeaseExpired,
    /// A data-plane call ended without a structured answer, or lost its lease or authority.
    OutcomeUnknown,
    /// A lifecycle step (retire, replace, recover) found its recorded identity inconsistent.
    Lifecycle,
    /// The executor Pod is not the one the environment records, or it disappeared.
    ExecutorIdentity,
    /// The executor exited (it is never restarted).
    ExecutorExited,
    /// A retained workspace's recorded state or PVC does not match.
    Retained,
}

impl FenceReason {
    /// Every reason, in a fixed order.
    pub const ALL: [FenceReason; 6] = [
        Self::LeaseExpired,
        Self::OutcomeUnknown,
        Self::Lifecycle,
        Self::ExecutorIdentity,
        Self::ExecutorExited,
        Self::Retained,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeaseExpired => "lease_expired",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Lifecycle => "lifecycle",
            Self::ExecutorIdentity => "executor_identity",
            Self::ExecutorExited => "executor_exited",
            Self::Retained => "retained",
        }
    }
}

/// An outcome label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ok` or a stable error code.
    pub outcome: String,
}

/// A fence reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A [`FenceReason`].
    pub reason: String,
}

impl OutcomeLabels {
    /// `ok` without an error code, otherwise the code.
    pub fn of(error: Option<ErrorCode>) -> Self {
        Self {
            outcome: error.map_or("ok", ErrorCode::as_str).to_owned(),
        }
    }
}

/// Claims, operation leases, fences and recoveries (cheap to clone).
#[derive(Clone)]
pub struct LifecycleMetrics {
    claims: Family<OutcomeLabels, Histogram>,
    renewals: Family<OutcomeLabels, Counter>,
    fences: Family<ReasonLabels, Counter>,
    recoveries: Family<OutcomeLabels, Counter>,
}

impl Default for LifecycleMetrics {
    fn default() -> Self {
        Self {
            claims: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            renewals: Family::default(),
            fences: Family::default(),
            recoveries: Family::default(),
        }
    }
}

impl LifecycleMetrics {
    /// Registers these metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "claim_duration_seconds",
            "Latency of acquiring an environment's run claim in the store, by outcome",
            metrics.claims.clone(),
        );
        registry.register(
            "operation_lease_renewals",
            "Renewals of data-plane operation leases, by outcome",
            metrics.renewals.clone(),
        );
        registry.register(
            "fences",
            "Environments fenced (FenceUnknown written), by reason",
            metrics.fences.clone(),
        );
        registry.register(
            "recoveries",
            "RecoverEnvironment requests that reached the store, by outcome",
            metrics.recoveries.clone(),
        );
        // Zero series for what is known in advance, so rates and alerts see them from the start.
        for reason in FenceReason::ALL {
            let _ = metrics.fences.get_or_create(&ReasonLabels {
                reason: reason.as_str().to_owned(),
            });
        }
        let _ = metrics.renewals.get_or_create(&OutcomeLabels::of(None));
        let _ = metrics.recoveries.get_or_create(&OutcomeLabels::of(None));
        metrics
    }

    /// One acquire of a run claim that took `seconds`.
    pub fn claim(&self, outcome: OutcomeLabels, seconds: f64) {
        self.claims.get_or_create(&outcome).observe(seconds);
    }

    /// One renewal of an operation lease.
    pub fn renewal(&self, outcome: OutcomeLabels) {
        self.renewals.get_or_create(&outcome).inc();
    }

    /// One fence written.
    pub fn fence(&self, reason: FenceReason) {
        self.fences
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().to_owned(),
            })
            .inc();
    }

    /// One recovery request.
    pub fn recovery(&self, outcome: OutcomeLabels) {
        self.recoveries.get_or_create(&outcome).inc();
    }
}
