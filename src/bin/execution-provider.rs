//! The `execution-provider` binary: the provider (`dev`) and its command-line client.
#![forbid(unsafe_code)]

use clap::Parser;

// The simulator's canary features each remove one fencing or recovery mechanism, for its teeth
// tests only (`sim/canary.sh`); a binary that serves is never built with them.
#[cfg(any(
    feature = "sim-canary",
    feature = "sim-recovery-canary",
    feature = "sim-supervisor-canary"
))]
compile_error!("the sim-canary features are for the simulator's teeth tests only");

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = execution_provider::cli::Cli::parse();
    std::process::exit(execution_provider::cli::main(cli).await);
}
