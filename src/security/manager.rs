//! The SecurityManager (api-security §6.5): reloads the security directory on an interval,
//! publishes each authority to the durable ledger by compare-and-swap, and keeps a fresh
//! observation of the ledger so every RPC can be checked against it without an API call.
//!
//! Reload: load and validate the directory (every rule of `security check`, and a read that
//! saw a projected-volume swap is read again once), publish its generation, digest and key
//! fingerprints to the ledger (which refuses rollback, drift, key reuse and key version
//! rollback), re-read it and require it to name exactly this generation and digest and to
//! record every key, then install. Any failure withdraws the
//! authority (fail closed) unless a newer authority was installed meanwhile. A rollback or
//! same-generation drift therefore stops the replica until a valid higher generation (or the
//! identical content) is loaded.
//!
//! Refresh: read the ledger every `staleness / 2`; an RPC is refused when the latest
//! observation is older than `staleness` or names another authority (a peer advanced the
//! generation, or the ledger was forged), and a mismatch also withdraws the authority so new
//! handshakes fail. An RPC costs no Kubernetes API request of its own.

use std::path::PathBuf;
use std::time::Duration;

use super::ledger::{AuthorityLedger, LedgerError, LedgerRecord, LedgerState};
use super::{Security, SecurityError, load_directory};
use crate::metrics::{ReloadOutcome, SecurityMetrics};

/// Default interval between reloads.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(2);
/// Default bound on the age of the ledger observation an RPC relies on.
pub const DEFAULT_STALENESS: Duration = Duration::from_secs(1);
/// Default name of the ledger ConfigMap.
pub const DEFAULT_AUTHORITY_CONFIGMAP: &str = "execution-provider-security-authority";

/// Where the security directory is and how the manager runs.
#[derive(Debug, Clone)]
pub struct SecuritySettings {
    /// The manifest file.
    pub manifest_path: PathBuf,
    /// The directory of the TLS and key files.
    pub tls_dir: PathBuf,
    /// The namespace of the ledger ConfigMap.
    pub namespace: String,
    /// The ledger ConfigMap's name.
    pub configmap: String,
    /// How often to reload (1 ms..1 min).
    pub reload_interval: Duration,
    /// How old a ledger observation may be when an RPC relies on it.
    pub staleness: Duration,
}

/// Why a reload failed.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The directory did not load.
    #[error(transparent)]
    Load(#[from] SecurityError),
    /// The ledger refused or was unreachable.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The ledger names another authority after publishing.
    #[error("the authority ledger does not confirm generation {0}")]
    NotAuthoritative(u64),
    /// A newer authority is already installed.
    #[error("generation {0} is older than the one in force")]
    Older(u64),
}

/// Reloads, publishes and checks the security authority.
#[derive(Clone)]
pub struct SecurityManager {
    security: Security,
    ledger: AuthorityLedger,
    settings: SecuritySettings,
    /// One reload at a time: a slower reload that read older files must not install them over
    /// a later reload's (the interval and an operator-triggered reload can overlap).
    reloading: std::sync::Arc<tokio::sync::Mutex<()>>,
    metrics: SecurityMetrics,
}

impl SecurityManager {
    /// A manager of `security` publishing to the ledger in `settings`.
    pub fn new(security: Security, kube: kube::Client, settings: SecuritySettings) -> Self {
        let ledger = AuthorityLedger::new(kube, &settings.namespace, &settings.configmap);
        security.require_ledger(settings.staleness);
        Self {
            security,
            ledger,
            settings,
            reloading: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            metrics: SecurityMetrics::default(),
        }
    }

    /// This manager, recording its reloads and the generation in force in `metrics`.
    pub fn with_metrics(mut self, metrics: SecurityMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn record_generation(&self) {
        self.metrics
            .in_force(self.security.published().map(|state| state.generation));
    }

    /// The security state this manager keeps current.
    pub fn security(&self) -> Security {
        self.security.clone()
    }

    /// Reloads once; on failure the authority is withdrawn (unless a newer one was
    /// installed meanwhile) and the cause returned.
    pub async fn reload(&self) -> Result<LedgerState, ReloadError> {
        let _one_at_a_time = self.reloading.lock().await;
        let before = self.security.published();
        let result = self.try_reload().await;
        if result.is_err() {
            self.security.clear_if(before.as_ref());
        }
        self.metrics.reloaded(match &result {
            Ok(_) => ReloadOutcome::Installed,
            Err(ReloadError::Load(_)) => ReloadOutcome::LoadFailed,
            Err(ReloadError::Ledger(_)) => ReloadOutcome::LedgerFailed,
            Err(ReloadError::NotAuthoritative(_)) => ReloadOutcome::NotAuthoritative,
            Err(ReloadError::Older(_)) => ReloadOutcome::Older,
        });
        self.record_generation();
        result
    }

    async fn try_reload(&self) -> Result<LedgerState, ReloadError> {
        let s = &self.settings;
        let loaded = load_directory(&s.manifest_path, &s.tls_dir)?;
        self.security.check_material(&loaded)?;
        let record = LedgerRecord::of(&loaded.manifest);
        self.ledger.publish(&record).await?;
        let confirmed = self.ledger.read_record().await?.is_some_and(|stored| {
            stored.state == record.state
                && record
                    .fingerprints
                    .iter()
                    .all(|(key, print)| stored.fingerprints.get(key) == Some(print))
        });
        let candidate = record.state;
        if !confirmed {
            return Err(ReloadError::NotAuthoritative(candidate.generation));
        }
        if let Some(current) = self.security.published()
            && current.generation > candidate.generation
        {
            return Err(ReloadError::Older(candidate.generation));
        }
        self.security.install(&loaded)?;
        self.security.observe(candidate.clone());
        Ok(candidate)
    }

    /// Reads the ledger once and records it; withdraws the authority when the ledger names
    /// another one or is corrupt. An unreachable ledger records nothing, so RPCs stop once
    /// the last observation is older than the staleness bound.
    pub async fn refresh(&self) {
        let started_under = self.security.published();
        let read = self.ledger.read().await;
        // Decided under the reload lock: a reload installs only while holding it, so no
        // install can land between the checks below and the withdrawal they decide (which
        // would withdraw the authority just installed). A reload stuck longer than the
        // staleness bound leaves this read unrecorded, as an unreachable ledger does.
        let locked = tokio::time::timeout(self.settings.staleness, self.reloading.lock()).await;
        if let Ok(_no_reload) = locked {
            self.record_refresh(started_under.as_ref(), read);
        }
    }

    /// What [`Self::refresh`] does with a ledger `read` it started while `started_under` was the
    /// authority in force. A reload that installed another authority while the read was in
    /// flight makes the read decide nothing: it may predate that authority's publication, and
    /// taken as the truth it would withdraw the authority just installed (the replica unready
    /// until the next reload).
    pub fn record_refresh(
        &self,
        started_under: Option<&LedgerState>,
        read: Result<Option<LedgerState>, LedgerError>,
    ) {
        if self.security.published().as_ref() != started_under {
            return;
        }
        match read {
            Ok(Some(state)) => {
                if self.security.published().is_some_and(|p| p != state) {
                    tracing::warn!(
                        generation = state.generation,
                        "the authority ledger names another authority: not ready"
                    );
                    self.security.clear();
                }
                self.security.observe(state);
            }
            Ok(None) | Err(LedgerError::Corrupt) => {
                tracing::warn!("the authority ledger is empty or corrupt: not ready");
                self.security.clear();
            }
            Err(error) => tracing::warn!(%error, "cannot read the authority ledger"),
        }
        self.record_generation();
    }

    /// Reloads every interval and refreshes every `staleness / 2` until `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut reload = tokio::time::interval(self.settings.reload_interval);
        let mut refresh = tokio::time::interval(self.settings.staleness / 2);
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = reload.tick() => {
                    if let Err(error) = self.reload().await {
                        tracing::error!(%error, "security reload failed: not ready");
                    }
                }
                _ = refresh.tick() => self.refresh().await,
            }
        }
    }
}
