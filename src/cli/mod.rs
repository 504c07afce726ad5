//! The command line: `serve` (production), `dev` (the embedded provider), `client` (a client
//! for every RPC that works), and the entry point that maps errors to messages and exit codes.

pub mod admin;
pub mod client;
pub mod commands;
pub mod connect;
pub mod describe;
pub mod dev;
pub mod dev_kubectl;
pub mod dev_network;
pub mod examples;
pub mod local_terminal;
pub mod pki;
pub mod refs;
pub mod saved_claim;
pub mod security;
pub mod serve;
pub mod session;
pub mod shell;
pub mod state_dir;
pub mod status;

use crate::server::status::error_detail;

/// `execution-provider`: isolated, persistent sandboxes for AI-agent platforms.
#[derive(Debug, clap::Parser)]
#[command(name = "execution-provider", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Runs the provider on this machine with an embedded API server (no cluster needed).
    Dev(dev::DevArgs),
    /// Runs the provider against a Kubernetes cluster (production).
    Serve(Box<serve::ServeArgs>),
    /// Talks to a provider.
    Client(Box<client::ClientArgs>),
    /// Operator tools for the security directory: keygen, digest, check.
    Security(security::SecurityArgs),
    /// Prints the ExecutionEnvironment CRD (the chart's copy must equal it).
    Crd {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
}

/// Runs the command line and returns the process exit code.
pub async fn main(cli: Cli) -> i32 {
    // Only the commands that serve export traces; they flush them when they stop.
    let (telemetry, traced) = match &cli.command {
        Command::Dev(args) => (&args.telemetry, true),
        Command::Serve(args) => (&args.telemetry, true),
        _ => (&crate::telemetry::TelemetryArgs::default(), false),
    };
    let telemetry = match crate::telemetry::install(telemetry, traced) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: {error:#}");
            return 1;
        }
    };
    let result = match cli.command {
        Command::Dev(args) => dev::run(args).await.map(|()| 0),
        Command::Serve(args) => serve::run(*args).await.map(|()| 0),
        Command::Client(args) => client::run(*args).await,
        Command::Security(args) => security::run(args, &crate::runtime::Runtime::system()),
        Command::Crd { output } => write_crd(output.as_deref()).map(|()| 0),
    };
    telemetry.shutdown().await;
    match result {
        Ok(code) => code,
        // A reader that went away (`logs --follow … | head`) ends the output quietly, with the
        // status a shell gives a program that SIGPIPE ended.
        Err(error) if closed_output(&error) => 141,
        Err(error) => {
            eprintln!("error: {}", describe(&error));
            1
        }
    }
}

/// Whether `error` is a write to an output whose reader has gone (EPIPE).
fn closed_output(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The chart's copy of the CRD, relative to the repository root.
pub const CHART_CRD_PATH: &str = "charts/execution-provider/crds/executionenvironment.yaml";

fn write_crd(output: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let yaml = crate::kube::crd::crd_yaml();
    match output {
        Some(path) => {
            std::fs::write(path, yaml).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            print!("{yaml}");
            Ok(())
        }
    }
}

/// A refusal as `<gRPC code> (<ErrorDetail.code>)`; anything else with its causes.
pub fn describe(error: &anyhow::Error) -> String {
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        let detail = error_detail(status)
            .map(|d| {
                format!(
                    " ({}{})",
                    d.code,
                    if d.retryable { ", retryable" } else { "" }
                )
            })
            .unwrap_or_default();
        return format!("{:?}{detail}: {}", status.code(), status.message());
    }
    format!("{error:#}")
}
