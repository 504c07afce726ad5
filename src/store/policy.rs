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
