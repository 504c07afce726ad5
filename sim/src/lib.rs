//! The deterministic simulator of execution-provider: several replicas of the real provider
//! (gRPC server, store, reconciler, security) on turmoil hosts, the in-process API server as a
//! turmoil host reached by `kube::Client` over turmoil TCP, an in-memory executor, and client
//! hosts issuing random valid and invalid calls over mTLS, under faults drawn per seed and
//! checked against the store invariants. See sim/README.md.
// Unsafe code is denied everywhere but in `entropy`, which interposes `getrandom(2)`.
#![deny(unsafe_code)]

pub mod apifaults;
pub mod authority;
pub mod clock;
pub mod cluster;
mod driver;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod entropy;
pub mod executor;
pub mod faults;
pub mod invariants;
pub mod liveness;
mod material;
pub mod memfs;
pub mod net;
pub mod node;
pub mod operator;
pub mod peer;
pub mod pki;
pub mod replay;
mod replica;
pub mod scenario;
pub mod script;
pub mod supervision;
pub mod trace;
pub mod workload;
pub mod world;
pub mod writes;

pub use scenario::Scenario;
pub use world::{Config, Report};

/// How much stack a run's thread gets (the main thread's usual 8 MiB, with room to spare).
const RUN_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Runs one seed of `config` and reports what the checker found.
///
/// Each run has a thread of its own, so that the per-thread state a run leaves behind (the
/// standard library's hash-map key counter, see [`entropy`](crate::entropy)) cannot reach the
/// next run in the same process.
pub fn run(config: &Config) -> Report {
    on_a_fresh_thread(|| world::run(config))
}

/// [`run`] with hand-driven actions applied at fixed times on top of the drawn faults.
pub fn run_scripted(config: &Config, script: &[script::Scripted]) -> Report {
    on_a_fresh_thread(|| world::run_scripted(config, script))
}

/// Runs `work` on a new thread and returns its result (re-raising its panic, if it panics).
fn on_a_fresh_thread<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let run = std::thread::Builder::new()
            .name("sim-run".to_owned())
            .stack_size(RUN_STACK_BYTES)
            .spawn_scoped(scope, work)
            .expect("a thread for the run");
        run.join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The commit this simulator was built from (`unknown` outside a git checkout).
pub const COMMIT: &str = env!("SIM_GIT_COMMIT");

/// The command that replays `config` exactly.
pub fn replay_command(config: &Config) -> String {
    format!(
        "cargo run -p sim --profile sim -- --scenario {} --seed {} --replicas {} --duration {}",
        config.scenario, config.seed, config.replicas, config.duration_secs
    )
}
