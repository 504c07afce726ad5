//! `execution-provider client`: a command-line client for everything the provider serves.
//! Human output by default, `--json` for scripts; a refusal prints the gRPC code and the
//! stable `ErrorDetail.code` and exits non-zero.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tonic::transport::Channel;

use super::connect::ConnectArgs;
use super::saved_claim::SavedClaims;
use super::session::{Claim, Session};
use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;

/// Options of `client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The end user the client attests: issuer.
    #[arg(long, default_value = "https://dev.local", global = true)]
    pub owner_issuer: String,
    /// The end user the client attests: subject.
    #[arg(long, default_value = "developer", global = true)]
    pub owner_subject: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ClientCommand,
}

/// Which environment a command works on.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The binding (the client's name for the environment).
    #[arg(long, value_parser = parse_binding)]
    pub binding: String,
    /// The template id.
    #[arg(long, default_value = "default")]
    pub template: String,
    /// The exact template revision (default: the template's default revision).
    #[arg(long)]
    pub revision: Option<String>,
    /// How long to wait for the environment to become ready.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub wait: Duration,
}

/// An existing run claim, when a command should use it instead of taking its own.
#[derive(Debug, Clone, clap::Args)]
pub struct ClaimArgs {
    /// Run id of an existing claim.
    #[arg(long, requires_all = ["claim_id", "epoch", "generation"])]
    pub run_id: Option<String>,
    /// Claim id of an existing claim.
    #[arg(long)]
    pub claim_id: Option<String>,
    /// Epoch of an existing claim.
    #[arg(long)]
    pub epoch: Option<u64>,
    /// Grant generation of an existing claim.
    #[arg(long)]
    pub generation: Option<u64>,
    /// The signed grant of an existing claim (as `run acquire --json` prints it).
    #[arg(long)]
    pub grant: Option<String>,
}

impl ClaimArgs {
    /// The claim the flags name, when they name all of it.
    pub fn claim(&self) -> Option<Claim> {
        Some(Claim {
            grant: self.grant.clone()?,
            ..self.claim_without_grant()?
        })
    }

    /// The claim as `run renew` and `run release` name it: those requests carry no grant.
    fn claim_without_grant(&self) -> Option<Claim> {
        Some(Claim {
            run_id: self.run_id.clone()?,
            claim_id: self.claim_id.clone()?,
            epoch: self.epoch?,
            grant_generation: self.generation?,
            grant: String::new(),
            expires_unix_millis: 0,
        })
    }
}

/// Client subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Lists the templates this client may use.
    #[command(after_help = crate::cli::examples::TEMPLATES)]
    Templates,
    /// Creates (or finds) the environment of a binding and waits until it is ready.
    #[command(after_help = crate::cli::examples::ENSURE)]
    Ensure(Target),
    /// Attaches to the ready environment of a binding; with a command id, attaches to that
    /// command instead: local stdin goes to its stdin, its output is followed to its end.
    #[command(after_help = crate::cli::examples::ATTACH)]
    Attach {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
        /// The command to attach to (as `exec --detach` printed it).
        command_id: Option<String>,
    },
    /// Run claims.
    #[command(subcommand)]
    Run(RunCommand),
    /// Runs a shell command in the environment, printing its output as it is produced, and
    /// exits with its exit code; `--detach` starts it in the background instead.
    #[command(after_help = crate::cli::examples::EXEC)]
    Exec(super::commands::ExecArgs),
    /// Prints a command's output (`--follow`: as it is produced, until the command ends).
    #[command(after_help = crate::cli::examples::LOGS)]
    Logs(super::commands::LogsArgs),
    /// Ends a command: a cancel with its end proven, or `--signal` INT, TERM, KILL or HUP.
    #[command(after_help = crate::cli::examples::KILL)]
    Kill(super::commands::KillArgs),
    /// Opens an interactive shell in the environment on a terminal (`/bin/sh -i` unless a
    /// program is given); exits with the shell's exit code.
    #[command(after_help = crate::cli::examples::SHELL)]
    Shell(super::shell::ShellArgs),
    /// Lists the commands of the claim.
    #[command(after_help = crate::cli::examples::PS)]
    Ps(super::commands::PsArgs),
    /// Files in the environment's workspace.
    #[command(subcommand)]
    File(FileCommand),
    /// Releases the binding's published reference to the environment.
    #[command(after_help = crate::cli::examples::RELEASE)]
    Release(Target),
    /// Binding-reference transactions and discovery.
    #[command(subcommand)]
    Refs(super::refs::RefsCommand),
    /// Administrator lifecycle of an exact environment.
    #[command(subcommand)]
    Admin(super::admin::AdminCommand),
    /// Revokes every claim and grant under the expected grant generation.
    #[command(after_help = crate::cli::examples::REVOKE)]
    Revoke(super::admin::RevokeArgs),
    /// Describes an environment: phase, fence, epoch, Pod and PVC, operation, run claim.
    #[command(after_help = crate::cli::examples::DESCRIBE)]
    Describe {
        #[command(flatten)]
        target: super::describe::DescribeArgs,
        #[command(flatten)]
        revision: super::describe::RevisionArg,
    },
    /// Summarises the current owner's environments: the bindings named and those with pending
    /// reference intents, one line each (phase, fence, epoch, run claim), and a count by phase.
    #[command(after_help = crate::cli::examples::STATUS)]
    Status(super::status::StatusArgs),
}

/// `client run ...`.
#[derive(Debug, clap::Subcommand)]
pub enum RunCommand {
    /// Takes the environment's run claim.
    #[command(after_help = crate::cli::examples::RUN_ACQUIRE)]
    Acquire {
        #[command(flatten)]
        target: Target,
        /// The run id (default: random).
        #[arg(long)]
        run_id: Option<String>,
        /// Claim lifetime (30s to 5m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Extends a claim.
    #[command(after_help = crate::cli::examples::RUN_RENEW)]
    Renew {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
        /// New lifetime from now (30s to 5m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Gives a claim back.
    #[command(after_help = crate::cli::examples::RUN_RELEASE)]
    Release {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
    },
}

/// `client file ...`.
#[derive(Debug, clap::Subcommand)]
pub enum FileCommand {
    /// Prints a file.
    #[command(after_help = crate::cli::examples::FILE_READ)]
    Read {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
        /// Path in the workspace.
        path: String,
    },
    /// Writes a file (created, or replaced by compare-and-swap on its current version).
    #[command(after_help = crate::cli::examples::FILE_WRITE)]
    Write {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
        /// Path in the workspace.
        path: String,
        /// Content (or use --from).
        #[arg(long, conflicts_with = "from")]
        data: Option<String>,
        /// Local file whose content to write.
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// Lists a directory.
    #[command(after_help = crate::cli::examples::FILE_LS)]
    Ls {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        claim: ClaimArgs,
        /// Directory in the workspace (default: the root).
        #[arg(default_value = "")]
        path: String,
    },
}

fn parse_binding(text: &str) -> Result<String, String> {
    if text.is_empty() || text.len() > 253 {
        return Err("a binding is 1 to 253 bytes".to_owned());
    }
    Ok(text.to_owned())
}

/// Parses `90s`, `5m`, `1500ms`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let err = || format!("`{text}` is not a duration: use e.g. 500ms, 30s, 5m or 1h");
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| err())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    };
    ms.map(Duration::from_millis).ok_or_else(err)
}

/// Runs a client command; returns the process exit code.
pub async fn run(args: ClientArgs) -> anyhow::Result<i32> {
    let client = args.connect.connect().await?;
    let owner = pb::Owner {
        issuer: args.owner_issuer.clone(),
        subject: args.owner_subject.clone(),
    };
    let out = Output { json: args.json };
    let saved = SavedClaims::new(&args.connect.state_dir);
    match args.command {
        ClientCommand::Templates => templates(client, &out).await,
        ClientCommand::Ensure(target) => {
            let session = Session::ensure(client, owner, &target, !args.json).await?;
            out.allocation(&session);
            Ok(0)
        }
        ClientCommand::Attach {
            target,
            claim,
            command_id: Some(id),
        } => {
            let session = Session::ensure(client, owner, &target, !args.json).await?;
            let claim = super::commands::existing_claim(&session, &claim, &saved)?;
            super::commands::attach(&session, &claim, &id, args.json).await
        }
        ClientCommand::Attach {
            target,
            command_id: None,
            ..
        } => {
            let session = Session::ensure(client, owner, &target, !args.json).await?;
            let attached = session.attach().await?;
            out.print(
                json!({"environment": attached.environment.map(|e| json!({"id": e.id, "revision": e.revision})), "epoch": attached.epoch, "ready": attached.ready, "grantGeneration": attached.grant_generation}),
                &format!("attached (epoch {}, ready {})", attached.epoch, attached.ready),
            );
            Ok(0)
        }
        ClientCommand::Run(command) => run_command(client, owner, command, &out, &saved).await,
        ClientCommand::Exec(exec) => {
            let session = Session::ensure(client, owner, &exec.target, !args.json).await?;
            super::commands::exec(&session, exec, &saved, args.json).await
        }
        ClientCommand::Logs(logs) => {
            let session = Session::ensure(client, owner, &logs.target, !args.json).await?;
            let claim = super::commands::existing_claim(&session, &logs.claim, &saved)?;
            super::commands::logs(&session, &claim, &logs, args.json).await
        }
        ClientCommand::Kill(kill) => {
            let session = Session::ensure(client, owner, &kill.target, !args.json).await?;
            let claim = super::commands::existing_claim(&session, &kill.claim, &saved)?;
            super::commands::kill(&session, &claim, &kill, args.json).await
        }
        ClientCommand::Shell(shell) => {
            let session = Session::ensure(client, owner, &shell.target, !args.json).await?;
            super::shell::shell(&session, shell, &saved).await
        }
        ClientCommand::Ps(ps) => {
            let session = Session::ensure(client, owner, &ps.target, !args.json).await?;
            let claim = super::commands::existing_claim(&session, &ps.claim, &saved)?;
            super::commands::ps(&session, &claim, args.json).await
        }
        ClientCommand::File(command) => {
            file_command(client, owner, command, &out, &saved, !args.json).await
        }
        ClientCommand::Release(target) => {
            let session = Session::ensure(client, owner, &target, !args.json).await?;
            session.release_reference().await?;
            out.print(json!({"released": true}), "released");
            Ok(0)
        }
        ClientCommand::Refs(command) => {
            let (value, text) = super::refs::run(client, owner, command).await?;
            out.print(value, &text);
            Ok(0)
        }
        ClientCommand::Admin(command) => {
            let (value, text) = super::admin::run(client, owner, command).await?;
            out.print(value, &text);
            Ok(0)
        }
        ClientCommand::Describe { target, revision } => {
            let mut client = client;
            let d =
                super::describe::fetch(&mut client, &owner, &target, revision.revision.as_deref())
                    .await?;
            let (value, text) = super::describe::render(&d);
            out.print(value, &text);
            Ok(0)
        }
        ClientCommand::Status(status) => {
            let rows = super::status::collect(client, &owner, &status).await?;
            let (value, text) = super::status::render(&rows);
            out.print(value, &text);
            Ok(0)
        }
        ClientCommand::Revoke(revoke) => {
            let (value, text) = super::admin::revoke(client, owner, revoke).await?;
            out.print(value, &text);
            Ok(0)
        }
    }
}

async fn templates(
    mut client: ExecutionProviderServiceClient<Channel>,
    out: &Output,
) -> anyhow::Result<i32> {
    let list = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await?
        .into_inner();
    let items: Vec<_> = list
        .items
        .iter()
        .map(|i| {
            let t = i.template.clone().unwrap_or_default();
            json!({"id": t.id, "revision": t.revision, "name": i.name, "description": i.description})
        })
        .collect();
    let text = list
        .items
        .iter()
        .map(|i| {
            let t = i.template.clone().unwrap_or_default();
            format!("{}\t{}\t{}", t.id, t.revision, i.name)
        })
        .collect::<Vec<_>>()
        .join("\n");
    out.print(
        json!({"items": items, "inventoryRevision": list.inventory_revision}),
        &text,
    );
    Ok(0)
}

async fn run_command(
    client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    command: RunCommand,
    out: &Output,
    saved: &SavedClaims,
) -> anyhow::Result<i32> {
    match command {
        RunCommand::Acquire {
            target,
            run_id,
            ttl,
        } => {
            let session = Session::ensure(client, owner, &target, !out.json).await?;
            let claim = session.acquire(run_id, ttl).await?;
            saved.save(session.binding(), session.environment_id(), &claim)?;
            out.claim(&claim);
        }
        RunCommand::Renew { target, claim, ttl } => {
            let session = Session::ensure(client, owner, &target, !out.json).await?;
            let (claim, from_saved) = claim_to_name(&session, &claim, saved)?;
            let renewed = session.renew(&claim, ttl).await?;
            if from_saved {
                saved.save(session.binding(), session.environment_id(), &renewed)?;
            }
            out.claim(&renewed);
        }
        RunCommand::Release { target, claim } => {
            let session = Session::ensure(client, owner, &target, !out.json).await?;
            let (claim, _) = claim_to_name(&session, &claim, saved)?;
            session.release(&claim).await?;
            saved.forget(session.binding(), &claim.claim_id);
            out.print(json!({"released": true}), "released");
        }
    }
    Ok(0)
}

/// The claim `run renew` and `run release` name: the flags, else the binding's saved claim
/// (whether it came from there).
fn claim_to_name(
    session: &Session,
    args: &ClaimArgs,
    saved: &SavedClaims,
) -> anyhow::Result<(Claim, bool)> {
    if let Some(claim) = args.claim_without_grant() {
        return Ok((claim, false));
    }
    saved
        .load(session.binding(), session.environment_id())
        .map(|c| (c, true))
        .context("--run-id, --claim-id, --epoch and --generation are required (no claim is saved for this binding)")
}

async fn file_command(
    client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    command: FileCommand,
    out: &Output,
    saved: &SavedClaims,
    spinner: bool,
) -> anyhow::Result<i32> {
    use super::commands::reusable_claim;
    match command {
        FileCommand::Read {
            target,
            claim,
            path,
        } => {
            let session = Session::ensure(client, owner, &target, spinner).await?;
            let response = session
                .with_claim(reusable_claim(&session, &claim, saved), |s, c| {
                    Box::pin(s.file(c, read_request(&path)))
                })
                .await?;
            out.file_data(&response);
        }
        FileCommand::Write {
            target,
            claim,
            path,
            data,
            from,
        } => {
            let content = match (data, from) {
                (Some(text), None) => text.into_bytes(),
                (None, Some(file)) => std::fs::read(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?,
                _ => anyhow::bail!("give the content with --data TEXT or --from FILE"),
            };
            let session = Session::ensure(client, owner, &target, spinner).await?;
            let version = session
                .with_claim(reusable_claim(&session, &claim, saved), |s, c| {
                    Box::pin(s.write_file(c, path.clone(), content.clone()))
                })
                .await?;
            out.print(
                json!({"path": path, "version": version}),
                &format!("wrote {path} ({version})"),
            );
        }
        FileCommand::Ls {
            target,
            claim,
            path,
        } => {
            let session = Session::ensure(client, owner, &target, spinner).await?;
            let request = pb::FileRequest {
                operation: pb::FileOperation::List as i32,
                path,
                ..pb::FileRequest::default()
            };
            let response = session
                .with_claim(reusable_claim(&session, &claim, saved), |s, c| {
                    Box::pin(s.file(c, request.clone()))
                })
                .await?;
            out.entries(&response);
        }
    }
    Ok(0)
}

fn read_request(path: &str) -> pb::FileRequest {
    pb::FileRequest {
        operation: pb::FileOperation::Read as i32,
        path: path.to_owned(),
        ..pb::FileRequest::default()
    }
}

/// Text or JSON output.
struct Output {
    json: bool,
}

impl Output {
    fn print(&self, value: serde_json::Value, text: &str) {
        if self.json {
            println!("{value}");
        } else if !text.is_empty() {
            println!("{text}");
        }
    }

    fn allocation(&self, s: &Session) {
        let a = s.allocation();
        let env = a.environment.clone().unwrap_or_default();
        self.print(
            json!({"environment": {"id": env.id, "revision": env.revision}, "epoch": a.epoch, "ready": a.ready, "grantGeneration": a.grant_generation}),
            &format!("environment {} (revision {}), epoch {}, ready {}", env.id, env.revision, a.epoch, a.ready),
        );
    }

    fn claim(&self, c: &Claim) {
        self.print(
            json!({"runId": c.run_id, "claimId": c.claim_id, "epoch": c.epoch, "grantGeneration": c.grant_generation, "grant": c.grant}),
            &format!(
                "run {} claim {} epoch {} generation {}",
                c.run_id, c.claim_id, c.epoch, c.grant_generation
            ),
        );
    }

    fn file_data(&self, r: &pb::FileResponse) {
        if self.json {
            println!(
                "{}",
                json!({"data": String::from_utf8_lossy(&r.data), "version": String::from_utf8_lossy(&r.version)})
            );
        } else {
            use std::io::Write;
            let _ = std::io::stdout().write_all(&r.data);
        }
    }

    fn entries(&self, r: &pb::FileResponse) {
        let items: Vec<_> = r
            .entries
            .iter()
            .map(|e| json!({"name": e.name, "size": e.size, "isDir": e.is_dir}))
            .collect();
        let text = r
            .entries
            .iter()
            .map(|e| format!("{}{}\t{}", e.name, if e.is_dir { "/" } else { "" }, e.size))
            .collect::<Vec<_>>()
            .join("\n");
        self.print(json!({"entries": items}), &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "5", "m", "1d", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
