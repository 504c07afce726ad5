//! [`Security`]: the authority in force now (allowlist, client CA pool, grant keys, server
//! TLS config) and the checks every RPC runs against it.
//!
//! The authority can be withdrawn: then the replica is not ready, every RPC is UNAVAILABLE
//! `not_ready` (retryable) and new handshakes fail. When a [`super::SecurityManager`] runs,
//! each RPC also requires a fresh observation of the durable ledger (at most the configured
//! staleness old) that names exactly this authority's generation and digest.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use rustls::pki_types::CertificateDer;

use super::ledger::LedgerState;
use super::{LoadedSecurity, SecurityError, grant, identity, keys};
use crate::errors::{ErrorCode, WireError};
use crate::runtime::tls::{self, ClientChainVerifier, ReloadableServerTls};
use crate::runtime::{Clock, IdSource, OsIds};
use crate::security::{Client, SecuritySnapshot};
use crate::server::limiter::{LimiterBounds, RpcLimiter};

/// What every RPC is judged against: one load of the security directory.
pub(super) struct Authority {
    snapshot: SecuritySnapshot,
    chains: ClientChainVerifier,
    keyring: keys::Keyring,
    /// The generation and digest this authority was published under.
    pub(super) state: LedgerState,
    /// The server certificate's notAfter: the authority is not ready from then on.
    valid_until: SystemTime,
    /// The limiter bounds the manifest asks for.
    limits: LimiterBounds,
}

/// Where the limiter's bounds come from: the flags (which win) and what was applied last.
struct LimitConfig {
    flags: LimiterBounds,
    applied: (usize, usize),
}

/// The latest observation of the durable ledger, when a manager checks it.
#[derive(Default)]
struct LedgerCheck {
    /// How old an observation may be.
    staleness: Option<Duration>,
    observed: Option<(LedgerState, tokio::time::Instant)>,
}

/// The live security state shared by the server and its handlers.
#[derive(Clone)]
pub struct Security {
    authority: Arc<ArcSwapOption<Authority>>,
    check: Arc<Mutex<LedgerCheck>>,
    tls: ReloadableServerTls,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
    limiter: Arc<arc_swap::ArcSwap<RpcLimiter>>,
    limits: Arc<Mutex<LimitConfig>>,
    rejections: prometheus_client::metrics::counter::Counter,
}

fn not_ready() -> WireError {
    WireError::retryable(ErrorCode::NotReady)
}

impl Security {
    /// Builds the state from a loaded directory.
    pub fn new(loaded: &LoadedSecurity, clock: Arc<dyn Clock>) -> Result<Self, SecurityError> {
        let config = tls::server_config(&loaded.server, clock.clone())?;
        let authority = Self::authority(loaded, clock.clone())?;
        let bounds = authority.limits.resolve()?;
        let limiter = RpcLimiter::new(bounds.0, bounds.1)?;
        Ok(Self {
            authority: Arc::new(ArcSwapOption::from_pointee(authority)),
            check: Arc::default(),
            tls: ReloadableServerTls::new(config),
            clock,
            ids: Arc::new(OsIds),
            limiter: Arc::new(arc_swap::ArcSwap::from_pointee(limiter)),
            limits: Arc::new(Mutex::new(LimitConfig {
                flags: LimiterBounds::default(),
                applied: bounds,
            })),
            rejections: Default::default(),
        })
    }

    /// Applies the limiter bounds given by flags; they win over the manifest's.
    pub fn with_limit_flags(self, flags: LimiterBounds) -> Result<Self, SecurityError> {
        let manifest = self
            .authority
            .load()
            .as_ref()
            .map_or_else(LimiterBounds::default, |a| a.limits);
        let bounds = flags.or(manifest).resolve()?;
        self.limits.lock().expect("limits lock").flags = flags;
        self.apply_limits(bounds)?;
        Ok(self)
    }

    /// Replaces the limiter when `bounds` differ from the ones applied last. RPCs in flight
    /// keep the slots of the old limiter.
    fn apply_limits(&self, bounds: (usize, usize)) -> Result<(), SecurityError> {
        let mut limits = self.limits.lock().expect("limits lock");
        if limits.applied != bounds {
            self.limiter
                .store(Arc::new(RpcLimiter::new(bounds.0, bounds.1)?));
            limits.applied = bounds;
        }
        Ok(())
    }

    /// Draws grant nonces from `ids` instead of the operating system (tests, simulator).
    #[must_use]
    pub fn with_ids(mut self, ids: Arc<dyn IdSource>) -> Self {
        self.ids = ids;
        self
    }

    fn authority(
        loaded: &LoadedSecurity,
        clock: Arc<dyn Clock>,
    ) -> Result<Authority, SecurityError> {
        Ok(Authority {
            snapshot: loaded.manifest.snapshot(),
            chains: ClientChainVerifier::new(&loaded.client_cas, clock)?,
            keyring: loaded.keyring.clone(),
            state: LedgerState {
                generation: loaded.manifest.generation,
                digest: super::digest::authority_digest(&loaded.manifest),
            },
            valid_until: leaf_not_after(&loaded.server.chain[0]),
            limits: loaded.manifest.limits.unwrap_or_default(),
        })
    }

    /// Refuses loaded TLS material that `security check` refuses, judged at this state's
    /// clock: an expired or not-yet-valid server leaf, one without serverAuth, and a client
    /// CA bundle entry that is not a CA.
    pub fn check_material(&self, loaded: &LoadedSecurity) -> Result<(), SecurityError> {
        let problems = super::check::loaded_problems(loaded, self.clock.as_ref());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SecurityError::Refused(problems))
        }
    }

    /// Installs a newly loaded directory: later handshakes and RPCs, including RPCs on
    /// connections that are already open, use it.
    pub fn install(&self, loaded: &LoadedSecurity) -> Result<(), SecurityError> {
        let config = tls::server_config(&loaded.server, self.clock.clone())?;
        let authority = Self::authority(loaded, self.clock.clone())?;
        let flags = self.limits.lock().expect("limits lock").flags;
        let bounds = flags.or(authority.limits).resolve()?;
        self.apply_limits(bounds)?;
        self.tls.replace(config);
        self.authority.store(Some(Arc::new(authority)));
        Ok(())
    }

    /// Replaces the RPC limiter directly (tests); a reload replaces it again only when the
    /// configured bounds change. RPCs in flight keep the slots of the old one.
    pub fn set_limiter(&self, limiter: RpcLimiter) {
        self.limiter.store(Arc::new(limiter));
    }

    /// The count of RPCs the limiter refused (shared with the metrics registry).
    pub fn limiter_rejections(&self) -> prometheus_client::metrics::counter::Counter {
        self.rejections.clone()
    }

    /// The RPC limiter in force.
    pub fn limiter(&self) -> RpcLimiter {
        RpcLimiter::clone(&self.limiter.load())
    }

    /// Withdraws the authority: not ready, RPCs UNAVAILABLE, handshakes refused.
    pub fn clear(&self) {
        self.tls.clear();
        self.authority.store(None);
    }

    /// Withdraws the authority only if it is still the one published as `state` (a stale
    /// failure must not clear a newer authority).
    pub(super) fn clear_if(&self, state: Option<&LedgerState>) {
        if self.published().as_ref() == state {
            self.clear();
        }
    }

    /// The generation and digest of the authority in force, if any.
    pub fn published(&self) -> Option<LedgerState> {
        self.authority.load().as_ref().map(|a| a.state.clone())
    }

    /// Requires every RPC to hold a ledger observation at most `staleness` old that names
    /// the authority in force.
    pub(super) fn require_ledger(&self, staleness: Duration) {
        self.check.lock().expect("ledger check lock").staleness = Some(staleness);
    }

    /// Records what the ledger holds now.
    pub(super) fn observe(&self, state: LedgerState) {
        let now = self.clock.monotonic();
        self.check.lock().expect("ledger check lock").observed = Some((state, now));
    }

    /// The server TLS config handle for the accept loop.
    pub fn server_tls(&self) -> ReloadableServerTls {
        self.tls.clone()
    }

    /// Whether the replica may serve: an authority is in force, its server certificate has
    /// not expired, its active grant key may sign now, and (under a manager) a fresh ledger
    /// observation confirms it.
    pub fn ready(&self) -> bool {
        self.current().is_ok()
    }

    /// The authority in force now, or `not_ready`.
    fn current(&self) -> Result<Arc<Authority>, WireError> {
        let authority = self.authority.load_full().ok_or_else(not_ready)?;
        let now = self.clock.wall();
        // Era A readiness (§6.5): the server certificate is valid and the active grant key
        // may sign now, so a key expiring between reload ticks makes the replica unready.
        if now >= authority.valid_until || authority.keyring.signer(now).is_none() {
            return Err(not_ready());
        }
        let check = self.check.lock().expect("ledger check lock");
        if let Some(staleness) = check.staleness {
            let fresh = check.observed.as_ref().is_some_and(|(state, at)| {
                *state == authority.state
                    && self.clock.monotonic().saturating_duration_since(*at) <= staleness
            });
            if !fresh {
                return Err(not_ready());
            }
        }
        Ok(authority)
    }

    /// Authenticates the peer of an RPC against the authority in force now (§2.2): it must
    /// be ready, the chain must verify against the client CA pool at the injected clock's
    /// time, and the leaf must name an admitted client. The returned policy is this
    /// snapshot's, for the whole request. Then reserves the RPC's limiter slot (§7), held
    /// by the returned client: RESOURCE_EXHAUSTED at once when a bound is reached.
    pub fn admit(
        &self,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Client, WireError> {
        let mut client = self.authenticate(peer_certs)?;
        let slot = self
            .limiter
            .load()
            .try_acquire(&client.uri)
            .ok_or_else(|| {
                self.rejections.inc();
                WireError::fatal(ErrorCode::ResourceExhausted)
            })?;
        client.slot = Some(Arc::new(slot));
        Ok(client)
    }

    /// Authentication alone (§2.2 steps 1-6), without a limiter slot.
    pub fn authenticate(
        &self,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Client, WireError> {
        let unauthenticated = WireError::fatal(ErrorCode::Unauthenticated);
        let chain = peer_certs
            .filter(|c| !c.is_empty())
            .ok_or(unauthenticated)?;
        let authority = self.current()?;
        if !authority.chains.verify(chain) {
            return Err(unauthenticated);
        }
        let uri = identity::client_identity(&chain[0]).map_err(|_| unauthenticated)?;
        authority.snapshot.admit(&uri).ok_or(unauthenticated)
    }

    /// Whether the client whose canonical URI hashes to `client_hash` is admitted by the
    /// allowlist in force now and may use `template_id` (`None` when no authority is in force
    /// here): the standing policy of a detached command's claim, which no call re-presents.
    pub fn client_allows_template(&self, client_hash: &str, template_id: &str) -> Option<bool> {
        let authority = self.current().ok()?;
        Some(authority.snapshot.clients.iter().any(|(uri, policy)| {
            crate::store::naming::client_hash(uri) == client_hash
                && policy.may_use_template(template_id)
        }))
    }

    /// Mints a grant for `binding` with the active key of the authority in force now;
    /// returns the token and its expiry.
    pub fn sign_grant(
        &self,
        binding: grant::GrantBinding,
    ) -> Result<(String, SystemTime), WireError> {
        let authority = self.current()?;
        grant::sign(
            &authority.keyring,
            binding,
            self.ids.hex(16),
            self.clock.wall(),
        )
        .map_err(grant::GrantError::wire)
    }

    /// Verifies that `token` allows `operation` on exactly `expected`, against the keys of
    /// the authority in force now.
    pub fn verify_grant(
        &self,
        token: &str,
        expected: &grant::GrantBinding,
        operation: &str,
    ) -> Result<(), WireError> {
        let authority = self.current()?;
        grant::verify(
            &authority.keyring,
            token,
            expected,
            operation,
            self.clock.wall(),
        )
        .map(drop)
        .map_err(grant::GrantError::wire)
    }
}

/// The notAfter of a certificate (the epoch when it does not parse: never valid).
fn leaf_not_after(der: &CertificateDer<'_>) -> SystemTime {
    use x509_parser::prelude::{FromDer, X509Certificate};
    X509Certificate::from_der(der)
        .ok()
        .and_then(|(_, cert)| u64::try_from(cert.validity().not_after.timestamp()).ok())
        .map_or(SystemTime::UNIX_EPOCH, |secs| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
        })
}

impl crate::store::policy::StandingPolicy for Security {
    fn allows(&self, client_hash: &str, template_id: &str) -> Option<bool> {
        self.client_allows_template(client_hash, template_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::state_dir::StateDir;
    use crate::runtime::SystemClock;

    fn security(dir: &std::path::Path) -> Security {
        let state = StateDir::open_or_init(dir).unwrap();
        let loaded = super::super::load_directory(&state.manifest_path(), &state.security_dir());
        Security::new(&loaded.unwrap(), Arc::new(SystemClock)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_ledger_observation_older_than_the_staleness_bound_makes_the_replica_unready() {
        let tmp = tempfile::tempdir().unwrap();
        let security = security(tmp.path());
        assert!(security.ready(), "without a manager no ledger is required");
        security.require_ledger(Duration::from_millis(1000));
        assert!(!security.ready(), "no observation yet");
        let published = security.published().unwrap();
        security.observe(published.clone());
        assert!(security.ready());
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(security.ready(), "exactly at the bound is still fresh");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!security.ready());
        security.observe(published.clone());
        assert!(security.ready());
        security.observe(LedgerState {
            generation: published.generation + 1,
            digest: published.digest.clone(),
        });
        assert!(!security.ready(), "the ledger names another authority");
        let refused = security.authenticate(Some(&[])).unwrap_err();
        assert_eq!(
            refused.code,
            ErrorCode::Unauthenticated,
            "no certificate first"
        );
    }

    #[test]
    fn a_reload_mid_request_keeps_the_admitted_policy_for_that_request_only() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open_or_init(tmp.path()).unwrap();
        let security = security(tmp.path());
        let ca = crate::cli::pki::DevCa::load(
            crate::cli::pki::DEV_CA_NAME,
            &std::fs::read_to_string(state.pki_dir().join("ca.pem")).unwrap(),
            &std::fs::read_to_string(state.pki_dir().join("ca.key")).unwrap(),
        )
        .unwrap();
        let leaf = ca.client("spiffe://dev.local/ns/default/client").unwrap();
        let chain = tls::certificates_from_pem(leaf.cert.as_bytes(), "leaf").unwrap();
        let admitted = security.authenticate(Some(&chain)).unwrap();
        assert!(admitted.policy.administrator);

        let mut loaded =
            super::super::load_directory(&state.manifest_path(), &state.security_dir()).unwrap();
        loaded.manifest.generation += 1;
        loaded.manifest.clients[0].administrator = false;
        security.install(&loaded).unwrap();
        assert!(
            admitted.policy.administrator,
            "the request keeps what admitted it"
        );
        let next = security.authenticate(Some(&chain)).unwrap();
        assert!(
            !next.policy.administrator,
            "the next request sees the new policy"
        );
    }

    #[test]
    fn a_stale_reload_failure_does_not_clear_a_newer_authority() {
        let tmp = tempfile::tempdir().unwrap();
        let security = security(tmp.path());
        let observed_at_start = security.published();
        let mut newer = observed_at_start.clone().unwrap();
        newer.generation += 1;
        security.clear_if(Some(&newer));
        assert!(
            security.ready(),
            "a failure that began under another state clears nothing"
        );
        security.clear_if(observed_at_start.as_ref());
        assert!(
            !security.ready(),
            "a failure under the state in force clears it"
        );
    }

    #[test]
    fn a_withdrawn_authority_refuses_rpcs_retryably_and_handshakes() {
        let tmp = tempfile::tempdir().unwrap();
        let security = security(tmp.path());
        let before = security.published();
        security.clear_if(None);
        assert!(
            security.ready(),
            "a stale failure does not clear a newer authority"
        );
        security.clear_if(before.as_ref());
        assert!(!security.ready());
        assert!(security.server_tls().acceptor().is_none());
        let chain = [CertificateDer::from(vec![0u8])];
        assert_eq!(security.authenticate(Some(&chain)), Err(not_ready()));
    }
}
