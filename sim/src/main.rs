//! The deterministic simulator of execution-provider: several replicas of the real provider,
//! the in-process API server and in-memory executors on turmoil hosts, under faults drawn
//! per seed, checked against the store invariants.
//!
//! This crate is a scaffold: the simulator is built in its own issue. Until then the binary
//! refuses to pretend it ran anything.
#![forbid(unsafe_code)]

fn main() {
    eprintln!("sim: the simulator is not built yet; nothing was simulated");
    std::process::exit(2);
}
