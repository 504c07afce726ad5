//! The store's hook to the caller's client policy (store §8.2 `policyCurrent`).
//!
//! A data-plane call is authorized when it starts, but it may run for minutes: while it runs
//! the caller's certificate may expire, its CA may be removed, the allowlist may be superseded
//! or the template withdrawn from its policy. The store asks a [`PolicyCheck`] at every
//! point the spec names (the claim validation, the confirmation after admission, each lease
//! renewal, the completion write); a `false` ends the dispatch exactly like any other loss of
//! authority: the executor is cancelled and the environment fenced. The store knows nothing
//! about certificates: the server layer implements the check against its security state.

use std::sync::Arc;

/// Whether the client that made a call is still allowed to make it.
pub trait PolicyCheck: Send + Sync {
    /// The caller's policy, as in force now, still admits the same client, lets it attest
    /// owners and allows `template_id` (the environment's template).
    fn current(&self, template_id: &str) -> bool;
}

/// The check of a store used without a security layer (tests, tools): always current,
/// as the spec says when no security manager is configured.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPolicyCheck;

impl PolicyCheck for NoPolicyCheck {
    fn current(&self, _template_id: &str) -> bool {
        true
    }
}

/// A shared policy check, held by a dispatch for as long as it runs: until its executor call
/// and its completion write have ended, even when the caller has gone away. The server's
/// check keeps the call's limiter slot, so the slot lasts exactly as long.
pub type SharedPolicyCheck = Arc<dyn PolicyCheck>;

/// The shared form of [`NoPolicyCheck`].
pub fn unchecked() -> SharedPolicyCheck {
    Arc::new(NoPolicyCheck)
}

/// The client policy in force now for a run claim that outlives every call made under it:
/// a detached command runs with no call of its caller in flight, so nothing holds a peer
/// chain to re-authenticate. The reconciler asks this instead (docs/commands.md §5.5): the
/// claim's client (by the hash its `activeRun` records) must still be admitted and still be
/// allowed the environment's template.
pub trait StandingPolicy: Send + Sync {
    /// `Some(true)`: a client whose canonical URI hashes to `client_hash` is admitted by the
    /// allowlist in force and may use `template_id`; `Some(false)`: it is not (withdrawn);
    /// `None`: no authority is in force on this replica now, so it cannot tell (and ends
    /// nothing: another replica, or the claim's own deadline, decides).
    fn allows(&self, client_hash: &str, template_id: &str) -> Option<bool>;
}

impl StandingPolicy for NoPolicyCheck {
    fn allows(&self, _client_hash: &str, _template_id: &str) -> Option<bool> {
        Some(true)
    }
}
