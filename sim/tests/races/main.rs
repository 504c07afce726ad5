//! Hand-driven races from the store, security and reconciler catalogues (spec/store.md §12,
//! the DS entries, api-security.md §9): turmoil's hold/release and partition controls, replica
//! crashes, clock steps and security manifest changes at fixed times or when an operation is
//! live, on top of a scenario, judged by every invariant and the liveness phase, and each by
//! the outcome its race must produce (refusal codes in the trace, the state in a snapshot).

mod cancel;
mod commands;
mod fencing;
mod identity;
mod ledger;
mod network;
mod revocation;
mod security;
mod support;
mod templates;
