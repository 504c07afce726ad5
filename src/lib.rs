//! execution-provider: isolated, persistent sandboxes on Kubernetes for AI-agent platforms.
//!
//! The provider and the reconciler are written once against three seams (Kubernetes, the
//! executor, and the runtime: clock, ids, network) so the same code runs in production, in the
//! embedded `dev` mode and in the deterministic simulator.
// The one exception, `sandbox::inherited`, takes ownership of a descriptor handed across execve.
#![deny(unsafe_code)]

pub mod api;
pub mod cli;
pub mod errors;
pub mod executor;
pub mod health;
pub mod helper;
pub mod kube;
pub mod metrics;
pub mod provider;
pub mod reconciler;
pub mod runtime;
pub mod sandbox;
pub mod security;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod templates;
