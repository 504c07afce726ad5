//! `client exec` (streamed, or `--detach`), `logs`, `attach CMD`, `kill` and `ps`: the
//! commands that outlive one call (docs/commands.md §6, §11); `shell` is in [`super::shell`].
//!
//! A foreground `exec` starts its command detached and follows its output, printing each chunk
//! as it arrives; it renews the claim it took while it follows and releases it at the end, and
//! cancels the command on ^C. An executor without a supervisor answers the detached start
//! UNIMPLEMENTED, and `exec` then runs today's one-shot command. `exec --detach` leaves its
//! claim held and saves it for the binding ([`SavedClaims`]), so the other commands find it.

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tonic::Code;

use super::client::{ClaimArgs, Target};
use super::saved_claim::SavedClaims;
use super::session::{Claim, Session};
use crate::api::pb;
use crate::runtime::{Clock as _, SystemClock};

/// How often a dropped follow is attached again before `exec`/`logs` give up.
pub(super) const REATTACH_ATTEMPTS: u32 = 5;
/// The pause before attaching again.
pub(super) const REATTACH_PAUSE: Duration = Duration::from_millis(250);
/// The most output a `--json` foreground `exec` collects per stream.
const JSON_OUTPUT_BOUND: usize = 1024 * 1024;
/// The largest stdin chunk one `WriteCommandStdin` carries.
const STDIN_CHUNK: usize = 64 * 1024;

/// A signal `client kill --signal` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SignalName {
    /// SIGINT.
    Int,
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hup,
}

impl SignalName {
    fn wire(self) -> pb::CommandSignal {
        match self {
            Self::Int => pb::CommandSignal::Int,
            Self::Term => pb::CommandSignal::Term,
            Self::Kill => pb::CommandSignal::Kill,
            Self::Hup => pb::CommandSignal::Hup,
        }
    }
}

/// Options of `client exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// Command timeout (0: the template's maximum).
    #[arg(long, default_value = "0s", value_parser = super::client::parse_duration)]
    pub timeout: Duration,
    /// Start the command in the background: print the claim and the command id and leave the
    /// claim held (saved for the binding; `run renew` keeps it, `run release` ends it).
    #[arg(long)]
    pub detach: bool,
    /// Give a detached command a stdin pipe, for `client attach`.
    #[arg(long, requires = "detach")]
    pub stdin: bool,
    /// A variable for the command only, `NAME=VALUE` (repeatable); it reaches the command and
    /// is never stored, listed or logged.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env_var)]
    pub env: Vec<EnvVar>,
    /// The command's working directory, relative to the workspace root.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// An id for this start (1 to 128 of `A-Za-z0-9._:-`): the same `exec` run again with it
    /// under the same claim answers the command it started instead of starting another, so a
    /// start whose answer was lost can be retried safely.
    #[arg(long)]
    pub operation_id: Option<String>,
    /// Lifetime of a claim `exec` takes (30s to 5m); a foreground `exec` renews it as it runs.
    #[arg(long, default_value = "60s", value_parser = super::client::parse_duration)]
    pub ttl: Duration,
    /// The shell command.
    #[arg(required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// A command variable from `--env NAME=VALUE`; debug output shows its name and size only.
#[derive(Clone)]
pub struct EnvVar {
    name: String,
    value: String,
}

impl std::fmt::Debug for EnvVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=<{} bytes>", self.name, self.value.len())
    }
}

fn parse_env_var(text: &str) -> Result<EnvVar, String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok(EnvVar {
            name: name.to_owned(),
            value: value.to_owned(),
        }),
        _ => Err("use NAME=VALUE".to_owned()),
    }
}

impl ExecArgs {
    /// Whether the start asks for what only a supervisor can do (a one-shot command cannot
    /// honour it).
    fn needs_supervisor(&self) -> bool {
        self.operation_id.is_some() || !self.env.is_empty() || self.workdir.is_some()
    }
}

/// Options of `client logs`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// Keep printing output as it is produced until the command ends (then exit with its code).
    #[arg(long)]
    pub follow: bool,
    /// The output offset to start at (`next_offset` of an earlier read).
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// The command id.
    pub command_id: String,
}

/// Options of `client kill`.
#[derive(Debug, clap::Args)]
pub struct KillArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// Send this signal instead of cancelling (a cancel: SIGTERM, the grace, SIGKILL, the end
    /// proven and recorded).
    #[arg(long, value_enum, ignore_case = true)]
    pub signal: Option<SignalName>,
    /// How long a cancel waits after SIGTERM (0: 10s; at most 60s).
    #[arg(long, default_value = "0s", value_parser = super::client::parse_duration, conflicts_with = "signal")]
    pub grace: Duration,
    /// The command id.
    pub command_id: String,
}

/// Options of `client ps`.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub claim: ClaimArgs,
}

/// The claim a command runs under, and where it came from.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) claim: Claim,
    /// Saved for the binding by `exec --detach`.
    saved: bool,
    /// Taken by this call: a foreground `exec` renews it while it runs and releases it.
    pub(super) own: bool,
}

/// The claim flags, else the binding's saved claim; `None` when neither names one.
fn named_claim(session: &Session, args: &ClaimArgs, saved: &SavedClaims) -> Option<Held> {
    if let Some(claim) = args.claim() {
        return Some(Held {
            claim,
            saved: false,
            own: false,
        });
    }
    let now = SystemClock.wall();
    saved
        .load_current(session.binding(), session.environment_id(), now)
        .map(|claim| Held {
            claim,
            saved: true,
            own: false,
        })
}

/// The claim flags, else the binding's saved claim while it has not expired: what `file`
/// commands use before taking a claim of their own.
pub fn reusable_claim(session: &Session, args: &ClaimArgs, saved: &SavedClaims) -> Option<Claim> {
    named_claim(session, args, saved).map(|h| h.claim)
}

/// The claim of a command that needs an existing one (`logs`, `attach`, `kill`, `ps`).
pub fn existing_claim(
    session: &Session,
    args: &ClaimArgs,
    saved: &SavedClaims,
) -> anyhow::Result<Claim> {
    named_claim(session, args, saved).map(|h| h.claim).with_context(|| {
        format!(
            "no claim for binding {}: pass --run-id, --claim-id, --epoch, --generation and --grant \
             (as `exec --detach --json` printed them), or start the command with `exec --detach`",
            session.binding()
        )
    })
}

/// The named claim, or a fresh one taken for this call.
pub(super) async fn claim_for(
    session: &Session,
    args: &ClaimArgs,
    saved: &SavedClaims,
    ttl: Duration,
) -> anyhow::Result<Held> {
    if let Some(held) = named_claim(session, args, saved) {
        return Ok(held);
    }
    Ok(Held {
        claim: session.acquire(None, ttl).await?,
        saved: false,
        own: true,
    })
}

/// `client exec`: foreground (streamed) or `--detach`; answers the exit code.
pub async fn exec(
    session: &Session,
    args: ExecArgs,
    saved: &SavedClaims,
    json: bool,
) -> anyhow::Result<i32> {
    let text = args.command.join(" ");
    let mut held = claim_for(session, &args.claim, saved, args.ttl).await?;
    if args.detach {
        return detach(session, &held, saved, text, &args, json).await;
    }
    let result = foreground(session, &mut held, text, &args, json).await;
    if held.own {
        let released = session.release(&held.claim).await;
        let code = result?;
        released.context("the command ran, but its run claim could not be released")?;
        return Ok(code);
    }
    result
}

/// A detached start.
async fn start(
    session: &Session,
    claim: &Claim,
    command: String,
    (timeout, stdin): (Duration, bool),
    args: &ExecArgs,
) -> Result<pb::CommandStartResponse, tonic::Status> {
    let request = pb::CommandStartRequest {
        context: Some(session.context(claim)),
        command,
        timeout_millis: i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
        detach: true,
        open_stdin: stdin,
        operation_id: args.operation_id.clone().unwrap_or_default(),
        env: args
            .env
            .iter()
            .map(|v| pb::CommandEnvVar {
                name: v.name.clone(),
                value: v.value.clone(),
            })
            .collect(),
        working_directory: args.workdir.clone().unwrap_or_default(),
        ..Default::default()
    };
    Ok(session.rpc().start_command(request).await?.into_inner())
}

async fn detach(
    session: &Session,
    held: &Held,
    saved: &SavedClaims,
    text: String,
    args: &ExecArgs,
    json: bool,
) -> anyhow::Result<i32> {
    let started = start(session, &held.claim, text, (args.timeout, args.stdin), args).await;
    let started = match started {
        Ok(started) => started,
        Err(status) => {
            if held.own {
                let _ = session.release(&held.claim).await;
            }
            return Err(status.into());
        }
    };
    if !held.saved && args.claim.claim().is_none() {
        saved.save(session.binding(), session.environment_id(), &held.claim)?;
    }
    let c = &held.claim;
    if json {
        println!(
            "{}",
            json!({"commandId": started.command_id, "runId": c.run_id, "claimId": c.claim_id,
                   "epoch": c.epoch, "grantGeneration": c.grant_generation, "grant": c.grant,
                   "expiresAtUnixMillis": c.expires_unix_millis})
        );
    } else {
        println!("{}", started.command_id);
        eprintln!(
            "command {} runs in the background under run {} claim {} (epoch {}, generation {}); \
             the claim stays held: keep it with `client run renew --binding {b}`, end it with \
             `client run release --binding {b}`",
            started.command_id,
            c.run_id,
            c.claim_id,
            c.epoch,
            c.grant_generation,
            b = session.binding()
        );
    }
    Ok(0)
}

async fn foreground(
    session: &Session,
    held: &mut Held,
    text: String,
    args: &ExecArgs,
    json: bool,
) -> anyhow::Result<i32> {
    let timeout = if args.timeout.is_zero() {
        session.max_command_duration().await?
    } else {
        args.timeout
    };
    let started = match start(session, &held.claim, text.clone(), (timeout, false), args).await {
        Ok(started) => started,
        Err(status) if status.code() == Code::Unimplemented && !args.needs_supervisor() => {
            // No supervisor on this executor: today's one-shot command (which takes no
            // variables or directory and cannot be replayed, so not when those are asked).
            let result = session.exec(&held.claim, text, args.timeout).await?;
            return Output { json }.one_shot(&result);
        }
        Err(status) => return Err(status.into()),
    };
    let id = started.command_id;
    let mut printer = Printer::new(json);
    let renew_every = (args.ttl / 3).max(Duration::from_secs(5));
    let mut renewals =
        tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
    let mut cancelled = false;
    let (claims_tx, claims_rx) = tokio::sync::watch::channel(held.claim.clone());
    let end = {
        let follow = follow_to_end(session, claims_rx, &id, 0, &mut printer);
        tokio::pin!(follow);
        loop {
            tokio::select! {
                end = &mut follow => break end?,
                _ = renewals.tick(), if held.own => {
                    match session.renew(&held.claim, args.ttl).await {
                        Ok(renewed) => {
                            held.claim = renewed;
                            let _ = claims_tx.send(held.claim.clone());
                        }
                        Err(error) => eprintln!("warning: the run claim could not be renewed: {}", super::describe(&error)),
                    }
                }
                _ = tokio::signal::ctrl_c(), if !cancelled => {
                    cancelled = true;
                    eprintln!("cancelling command {id}");
                    let (s, claim, id) = (session.clone(), held.claim.clone(), id.clone());
                    tokio::spawn(async move { cancel(&s, &claim, &id, Duration::ZERO).await });
                }
            }
        }
    };
    if !held.own {
        // The claim stays held: record how the command ended now (a cancel of an ended
        // command records its own end), so it no longer counts among the claim's open ones.
        if let Err(error) = cancel(session, &held.claim, &id, Duration::ZERO).await {
            eprintln!(
                "warning: the command's end could not be recorded: {}",
                super::describe(&error)
            );
        }
    }
    printer.finish(&end)
}

/// Follows `id` from `offset` to its end, printing every chunk as it arrives; a dropped
/// stream is attached again at the next offset (the claim as last renewed).
async fn follow_to_end(
    session: &Session,
    claims: tokio::sync::watch::Receiver<Claim>,
    id: &str,
    mut offset: u64,
    printer: &mut Printer,
) -> anyhow::Result<pb::CommandStatusResponse> {
    let mut attempts = 0;
    loop {
        let claim = claims.borrow().clone();
        let request = query(session, &claim, id, offset);
        let broken = match session.rpc().follow_command(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(event)) => {
                            attempts = 0;
                            if let Some(end) = printer.event(event, &mut offset)? {
                                return Ok(end);
                            }
                        }
                        Ok(None) => break tonic::Status::unavailable("the follow ended early"),
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        attempts += 1;
        if !reattachable(&broken) || attempts > REATTACH_ATTEMPTS {
            return Err(broken.into());
        }
        eprintln!(
            "(the output stream broke: {}; attaching again at offset {offset})",
            broken.message()
        );
        tokio::time::sleep(REATTACH_PAUSE).await;
    }
}

pub(super) fn reattachable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal
    )
}

pub(super) fn query(
    session: &Session,
    claim: &Claim,
    id: &str,
    offset: u64,
) -> pb::CommandQueryRequest {
    pb::CommandQueryRequest {
        context: Some(session.context(claim)),
        command_id: id.to_owned(),
        offset: i64::try_from(offset).unwrap_or(i64::MAX),
        ..Default::default()
    }
}

pub(super) async fn cancel(
    session: &Session,
    claim: &Claim,
    id: &str,
    grace: Duration,
) -> anyhow::Result<pb::CommandStatusResponse> {
    let mut request = query(session, claim, id, 0);
    request.grace_millis = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
    Ok(session.rpc().cancel_command(request).await?.into_inner())
}

/// `client logs`: the retained output from `--from`, or followed to the end with `--follow`.
pub async fn logs(
    session: &Session,
    claim: &Claim,
    args: &LogsArgs,
    json: bool,
) -> anyhow::Result<i32> {
    let mut printer = Printer::new(json);
    if args.follow {
        let (_tx, claims) = tokio::sync::watch::channel(claim.clone());
        let end = follow_to_end(session, claims, &args.command_id, args.from, &mut printer).await?;
        return printer.finish(&end);
    }
    let mut offset = args.from;
    loop {
        let request = query(session, claim, &args.command_id, offset);
        let status = session.rpc().command_status(request).await?.into_inner();
        if status.dropped_bytes > 0 {
            printer.dropped(status.dropped_bytes)?;
        }
        for chunk in &status.chunks {
            printer.chunk(chunk)?;
        }
        let next = u64::try_from(status.next_offset).unwrap_or(offset);
        if status.chunks.is_empty() || next <= offset {
            printer.status_line(&status);
            return Ok(0);
        }
        offset = next;
    }
}

/// `client attach CMD`: local stdin to the command's stdin (end of input closes it), its
/// output followed to its end; exits with its exit code.
pub async fn attach(session: &Session, claim: &Claim, id: &str, json: bool) -> anyhow::Result<i32> {
    let mut printer = Printer::new(json);
    let (_tx, claims) = tokio::sync::watch::channel(claim.clone());
    let input = pump_stdin(session.clone(), claim.clone(), id.to_owned());
    tokio::pin!(input);
    let mut input_done = false;
    let end = {
        let follow = follow_to_end(session, claims, id, 0, &mut printer);
        tokio::pin!(follow);
        loop {
            tokio::select! {
                end = &mut follow => break end?,
                result = &mut input, if !input_done => {
                    input_done = true;
                    if let Err(error) = result {
                        eprintln!("(stdin not forwarded: {})", super::describe(&error));
                    }
                }
            }
        }
    };
    printer.finish(&end)
}

/// Copies local stdin to the command in chunks of at most 64 KiB; closes it at end of input.
/// Standard input is read on a blocking thread (the process exits without waiting for it).
async fn pump_stdin(session: Session, claim: Claim, id: String) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    std::thread::spawn(move || read_stdin(&tx));
    loop {
        let data = rx.recv().await.unwrap_or(Ok(Vec::new()))?;
        let close = data.is_empty();
        let request = pb::CommandStdinRequest {
            context: Some(session.context(&claim)),
            command_id: id.clone(),
            data,
            close,
        };
        session.rpc().write_command_stdin(request).await?;
        if close {
            return Ok(());
        }
    }
}

/// Sends stdin's chunks to `tx`, then an empty chunk at end of input.
pub(super) fn read_stdin(tx: &tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>) {
    use std::io::Read as _;
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; STDIN_CHUNK];
    loop {
        let read = stdin.read(&mut buffer).map(|n| buffer[..n].to_vec());
        let end = read.as_ref().map_or(true, Vec::is_empty);
        if tx.blocking_send(read).is_err() || end {
            return;
        }
    }
}

/// `client kill`: a signal, or (without `--signal`) a cancel whose proven end and receipt it
/// prints.
pub async fn kill(
    session: &Session,
    claim: &Claim,
    args: &KillArgs,
    json: bool,
) -> anyhow::Result<i32> {
    let status = match args.signal {
        Some(signal) => {
            let request = pb::CommandSignalRequest {
                context: Some(session.context(claim)),
                command_id: args.command_id.clone(),
                signal: signal.wire() as i32,
            };
            session.rpc().signal_command(request).await?.into_inner()
        }
        None => cancel(session, claim, &args.command_id, args.grace).await?,
    };
    Printer::new(json).status_line(&status);
    Ok(0)
}

/// `client ps`: the claim's commands, one line each.
pub async fn ps(session: &Session, claim: &Claim, json: bool) -> anyhow::Result<i32> {
    let request = pb::ListCommandsRequest {
        context: Some(session.context(claim)),
        limit: 0,
    };
    let listed = session.rpc().list_commands(request).await?.into_inner();
    if json {
        let items: Vec<_> = listed.commands.iter().map(status_json).collect();
        println!("{}", json!({"commands": items}));
        return Ok(0);
    }
    println!("COMMAND\tSTATE\tEXIT\tOUTPUT\tDETACHED");
    for c in &listed.commands {
        println!(
            "{}\t{}\t{}\t{}\t{}",
            c.command_id,
            state_word(c.state),
            if c.state == pb::CommandState::Running as i32 {
                "-".to_owned()
            } else {
                c.exit_code.to_string()
            },
            c.next_offset,
            c.detached
        );
    }
    Ok(0)
}

fn state_word(state: i32) -> &'static str {
    match pb::CommandState::try_from(state).unwrap_or(pb::CommandState::Unspecified) {
        pb::CommandState::Running => "running",
        pb::CommandState::Succeeded => "succeeded",
        pb::CommandState::Failed => "failed",
        pb::CommandState::Cancelled => "cancelled",
        pb::CommandState::FenceUnknown => "fence_unknown",
        pb::CommandState::Unspecified => "unknown",
    }
}

fn status_json(s: &pb::CommandStatusResponse) -> serde_json::Value {
    json!({
        "commandId": s.command_id,
        "state": state_word(s.state),
        "exitCode": s.exit_code,
        "nextOffset": s.next_offset,
        "droppedBytes": s.dropped_bytes,
        "stdinOpen": s.stdin_open,
        "detached": s.detached,
        "terminalReceipt": s.terminal_receipt,
        "startedAtUnixMillis": s.started_at_unix_millis,
        "endedAtUnixMillis": s.ended_at_unix_millis,
    })
}

/// The exit code `exec` and `logs --follow` answer for a command's end.
pub fn exit_code(state: i32, exit_code: i32) -> i32 {
    match pb::CommandState::try_from(state).unwrap_or(pb::CommandState::Unspecified) {
        pb::CommandState::Succeeded => 0,
        pb::CommandState::Cancelled => 124,
        _ if (1..=255).contains(&exit_code) => exit_code,
        _ => 1,
    }
}

/// Prints followed output as it arrives: stdout chunks (and a terminal's) to stdout, stderr
/// chunks to stderr, each flushed at once; with `--json`, one line per event, except for a
/// foreground `exec`, which keeps its one-object answer.
struct Printer {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Printer {
    fn new(json: bool) -> Self {
        Self {
            json,
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
        }
    }

    /// One follow event; answers the end when it is the command's end.
    fn event(
        &mut self,
        event: pb::CommandOutputEvent,
        offset: &mut u64,
    ) -> anyhow::Result<Option<pb::CommandStatusResponse>> {
        use pb::command_output_event::Event;
        match event.event {
            Some(Event::Chunk(chunk)) => {
                let start = u64::try_from(chunk.offset).unwrap_or(*offset);
                *offset = start + chunk.data.len() as u64;
                self.chunk(&chunk)?;
            }
            Some(Event::DroppedBytes(n)) => {
                *offset += n;
                self.dropped(n)?;
            }
            Some(Event::End(end)) => return Ok(Some(end)),
            None => {}
        }
        Ok(None)
    }

    fn chunk(&mut self, chunk: &pb::OutputChunk) -> anyhow::Result<()> {
        let stderr = chunk.stream == pb::OutputStream::Stderr as i32;
        if self.json {
            let kept = if stderr {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            let room = JSON_OUTPUT_BOUND.saturating_sub(kept.len());
            self.truncated |= chunk.data.len() > room;
            kept.extend_from_slice(&chunk.data[..chunk.data.len().min(room)]);
            return Ok(());
        }
        if stderr {
            let mut err = std::io::stderr().lock();
            err.write_all(&chunk.data)?;
            err.flush()?;
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(&chunk.data)?;
            out.flush()?;
        }
        Ok(())
    }

    fn dropped(&mut self, n: u64) -> anyhow::Result<()> {
        self.truncated = true;
        if !self.json {
            eprintln!("({n} bytes of output fell out of the retained window)");
        }
        Ok(())
    }

    fn status_line(&self, s: &pb::CommandStatusResponse) {
        if self.json {
            println!("{}", status_json(s));
            return;
        }
        let receipt = if s.terminal_receipt.is_empty() {
            String::new()
        } else {
            format!(", receipt {}", s.terminal_receipt)
        };
        let exit = if s.state == pb::CommandState::Running as i32 {
            String::new()
        } else {
            format!(", exit {}", s.exit_code)
        };
        eprintln!(
            "command {} {}{exit}, output to offset {}{receipt}",
            s.command_id,
            state_word(s.state),
            s.next_offset
        );
    }

    /// The command's end: `--json` prints the collected answer; answers the exit code.
    fn finish(&self, end: &pb::CommandStatusResponse) -> anyhow::Result<i32> {
        if self.json {
            println!(
                "{}",
                json!({
                    "commandId": end.command_id,
                    "state": pb::CommandState::try_from(end.state).unwrap_or(pb::CommandState::Unspecified).as_str_name(),
                    "exitCode": end.exit_code,
                    "stdout": String::from_utf8_lossy(&self.stdout),
                    "stderr": String::from_utf8_lossy(&self.stderr),
                    "truncated": self.truncated,
                    "terminalReceipt": end.terminal_receipt,
                    "nextOffset": end.next_offset,
                })
            );
        } else if end.terminal_receipt.is_empty() {
            eprintln!(
                "(the command's end is not proven: {})",
                state_word(end.state)
            );
        }
        Ok(exit_code(end.state, end.exit_code))
    }
}

/// Today's one-shot answer (an executor without a supervisor).
struct Output {
    json: bool,
}

impl Output {
    fn one_shot(&self, r: &pb::CommandStartResponse) -> anyhow::Result<i32> {
        let result = r.result.clone().unwrap_or_default();
        if self.json {
            println!(
                "{}",
                json!({
                    "commandId": r.command_id,
                    "state": pb::CommandState::try_from(result.state).unwrap_or(pb::CommandState::Unspecified).as_str_name(),
                    "exitCode": result.exit_code,
                    "stdout": String::from_utf8_lossy(&result.stdout),
                    "stderr": String::from_utf8_lossy(&result.stderr),
                    "truncated": result.truncated,
                    "terminalReceipt": result.terminal_receipt,
                })
            );
        } else {
            std::io::stdout().write_all(&result.stdout)?;
            std::io::stderr().write_all(&result.stderr)?;
            if result.truncated {
                eprintln!("(output truncated)");
            }
        }
        Ok(exit_code(result.state, result.exit_code))
    }
}
