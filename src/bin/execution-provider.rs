//! The `execution-provider` binary: the provider (`dev`) and its command-line client.
#![forbid(unsafe_code)]

use clap::Parser;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = execution_provider::cli::Cli::parse();
    std::process::exit(execution_provider::cli::main(cli).await);
}
