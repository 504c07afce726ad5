//! The `execution-provider` binary: the provider (`dev`) and its command-line client.
#![forbid(unsafe_code)]

use clap::Parser;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EXECUTION_PROVIDER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = execution_provider::cli::Cli::parse();
    std::process::exit(execution_provider::cli::main(cli).await);
}
