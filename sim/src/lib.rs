//! The deterministic simulator of execution-provider: several replicas of the real provider
//! (gRPC server, store, reconciler, security) on turmoil hosts, the in-process API server as a
//! turmoil host reached by `kube::Client` over turmoil TCP, an in-memory executor, and client
//! hosts issuing random valid and invalid calls over mTLS, under faults drawn per seed and
//! checked against the store invariants. See sim/README.md.
#![forbid(unsafe_code)]

pub mod apifaults;
pub mod authority;
pub mod clock;
pub mod cluster;
mod driver;
pub mod executor;
pub mod faults;
pub mod invariants;
pub mod memfs;
pub mod net;
pub mod node;
pub mod pki;
mod replica;
pub mod scenario;
pub mod script;
pub mod trace;
pub mod workload;
pub mod world;
pub mod writes;

pub use scenario::Scenario;
pub use world::{Config, Report, run, run_scripted};

/// The commit this simulator was built from (`unknown` outside a git checkout).
pub const COMMIT: &str = env!("SIM_GIT_COMMIT");

/// The command that replays `config` exactly.
pub fn replay_command(config: &Config) -> String {
    format!(
        "cargo run -p sim --profile sim -- --scenario {} --seed {} --replicas {} --duration {}",
        config.scenario, config.seed, config.replicas, config.duration_secs
    )
}
