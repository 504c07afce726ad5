//! The security authority's metrics, recorded by the security manager:
//! `execution_provider_security_reloads_total{outcome}` and the gauge
//! `execution_provider_security_authority_generation` (the generation in force; 0 while
//! none is).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How a reload ended: a bounded vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The authority was published, confirmed and installed.
    Installed,
    /// The directory did not load or failed a check.
    LoadFailed,
    /// The ledger refused the record or was unreachable.
    LedgerFailed,
    /// The ledger names another authority after publishing.
    NotAuthoritative,
    /// A newer authority is already installed.
    Older,
}

impl ReloadOutcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [ReloadOutcome; 5] = [
        Self::Installed,
        Self::LoadFailed,
        Self::LedgerFailed,
        Self::NotAuthoritative,
        Self::Older,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Installed => "installed",
            Self::LoadFailed => "load_failed",
            Self::LedgerFailed => "ledger_failed",
            Self::NotAuthoritative => "not_authoritative",
            Self::Older => "older",
        }
    }
}

/// An outcome label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// A [`ReloadOutcome`].
    pub outcome: String,
}

/// Reloads and the generation in force (cheap to clone); the default records into no registry.
#[derive(Clone, Default)]
pub struct SecurityMetrics {
    reloads: Family<OutcomeLabels, Counter>,
    generation: Gauge,
}

impl SecurityMetrics {
    /// Registers these metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "security_reloads",
            "Reloads of the security directory and authority, by outcome",
            metrics.reloads.clone(),
        );
        registry.register(
            "security_authority_generation",
            "The generation of the security authority in force (0 while none is)",
            metrics.generation.clone(),
        );
        for outcome in ReloadOutcome::ALL {
            let _ = metrics.reloads.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().to_owned(),
            });
        }
        metrics
    }

    /// One reload ended with `outcome`.
    pub fn reloaded(&self, outcome: ReloadOutcome) {
        self.reloads
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
    }

    /// The generation in force now (`None`: withdrawn).
    pub fn in_force(&self, generation: Option<u64>) {
        let value = generation.map_or(0, |g| i64::try_from(g).unwrap_or(i64::MAX));
        self.generation.set(value);
    }
}
