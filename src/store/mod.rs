//! The durable authorization and fencing state machine.
//!
//! Every piece of authority (reference records, the run claim, epochs, the grant generation,
//! the in-flight operation) lives in the `ExecutionEnvironment` status and changes only by
//! compare-and-swap on `resourceVersion` ([`cas`]), so any replica may crash between any two
//! steps without losing or repeating anything acknowledged.
//!
//! Operations: [`Store::ensure_template`] (allocation), [`Store::commit_reference`],
//! [`Store::attach`], run claims ([`Store::acquire_run`], [`Store::renew_run`],
//! [`Store::release_run`], [`Store::validate_run_claim_under`]) and the claimed, fenced
//! dispatch of file operations and commands ([`Store::execute_validated`]), which re-asks the
//! caller's client policy ([`policy::PolicyCheck`]) for as long as the operation runs.

pub mod admin;
pub mod cas;
pub mod claims;
pub mod command_authority;
mod command_exits;
mod command_foreground;
pub mod command_invariants;
pub mod command_leases;
pub mod command_reads;
pub mod command_terminal;
pub mod commands;
pub mod describe;
pub mod dispatch;
pub mod ensure;
pub mod error;
pub mod expiry;
pub mod intents;
pub mod invariants;
pub mod lease;
pub mod ledger;
pub mod lifecycle;
pub mod naming;
pub mod policy;
pub mod predicates;
pub mod references;
pub mod revoke;
pub mod validate;

use std::sync::Arc;
use std::time::SystemTime;

use kube::api::Api;

use crate::executor::transport::ExecutorTransport;
use crate::kube::crd::ExecutionEnvironment;
use crate::metrics::LifecycleMetrics;
use crate::runtime::Runtime;
use crate::templates::TemplateRegistry;
pub use error::StoreError;

/// Bounds of the run-claim TTL.
pub const MIN_RUN_TTL: std::time::Duration = std::time::Duration::from_secs(30);
/// Upper bound of the run-claim TTL.
pub const MAX_RUN_TTL: std::time::Duration = std::time::Duration::from_secs(300);
/// The lease an in-flight operation holds.
pub const OPERATION_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// An exact environment reference: the resource name and its random incarnation revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRef {
    /// The resource name (`exec-` + 40 hex).
    pub id: String,
    /// `spec.revision`.
    pub revision: String,
}

/// The caller of a store operation: the creator client and the attested owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The canonical client URI.
    pub client: String,
    /// The owner hash.
    pub owner_hash: String,
}

/// The result of an allocation or attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The exact environment.
    pub env: EnvRef,
    /// The current execution epoch.
    pub epoch: u64,
    /// The current grant generation.
    pub grant_generation: u64,
    /// The binding.
    pub binding_id: String,
    /// Ready and healthy.
    pub ready: bool,
}

/// A run claim: the fencing token (claim id, epoch, grant generation) and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunClaim {
    /// The environment.
    pub env: EnvRef,
    /// The binding.
    pub binding_id: String,
    /// The client's run id.
    pub run_id: String,
    /// The provider-random claim id.
    pub claim_id: String,
    /// The claim's epoch.
    pub epoch: u64,
    /// The grant generation the claim was taken under.
    pub grant_generation: u64,
    /// When the claim lapses.
    pub expires_at: SystemTime,
}

/// The exact authorization tuple a data-plane call presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimContext {
    /// The environment.
    pub env: EnvRef,
    /// The binding.
    pub binding_id: String,
    /// The run.
    pub run_id: String,
    /// The claim.
    pub claim_id: String,
    /// The epoch.
    pub epoch: u64,
    /// The grant generation.
    pub grant_generation: u64,
}

/// The store: the environments of one namespace, the template registry, the executor and the
/// runtime seams.
#[derive(Clone)]
pub struct Store {
    api: Api<ExecutionEnvironment>,
    templates: Arc<TemplateRegistry>,
    executor: Arc<dyn ExecutorTransport>,
    runtime: Runtime,
    namespace: String,
    holder_id: String,
    ledger: ledger::Ledger,
    kube: kube::Client,
    metrics: LifecycleMetrics,
    events: crate::telemetry::events::EventRecorder,
}

impl Store {
    /// A store over the environments of `namespace`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        templates: Arc<TemplateRegistry>,
        executor: Arc<dyn ExecutorTransport>,
        runtime: Runtime,
    ) -> Self {
        let holder_id = runtime.ids.hex(16);
        let api = Api::namespaced(client.clone(), namespace);
        Self {
            ledger: ledger::Ledger::new(Api::namespaced(client.clone(), namespace), api.clone()),
            kube: client,
            api,
            templates,
            executor,
            runtime,
            namespace: namespace.to_owned(),
            holder_id,
            metrics: LifecycleMetrics::default(),
            events: Default::default(),
        }
    }

    /// The clock this store reads time through.
    pub fn clock(&self) -> Arc<dyn crate::runtime::clock::Clock> {
        self.runtime.clock.clone()
    }

    /// This store, recording claims, lease renewals, fences and recoveries in `metrics`.
    pub fn with_metrics(mut self, metrics: LifecycleMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// This store, publishing Events (its fences, administrators' recoveries) through `events`.
    pub fn with_events(mut self, events: crate::telemetry::events::EventRecorder) -> Self {
        self.events = events;
        self
    }

    fn seconds_since(&self, started: tokio::time::Instant) -> f64 {
        self.runtime
            .clock
            .monotonic()
            .duration_since(started)
            .as_secs_f64()
    }

    /// The template registry this store allocates from.
    pub fn templates(&self) -> &TemplateRegistry {
        &self.templates
    }

    /// The capacity ledger.
    pub fn ledger(&self) -> &ledger::Ledger {
        &self.ledger
    }

    /// This replica's operation-lease holder id (fresh per store instance).
    pub fn holder_id(&self) -> &str {
        &self.holder_id
    }

    /// A fresh command id.
    pub fn new_command_id(&self) -> String {
        self.runtime.ids.hex(16)
    }

    fn now(&self) -> SystemTime {
        self.runtime.clock.wall()
    }
}
