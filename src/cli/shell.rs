//! `client shell`: an interactive shell in the environment, on a terminal (docs/commands.md
//! §8.1, README "client").
//!
//! It takes or reuses a claim as `exec --detach` does, starts `/bin/sh -i` (or the given
//! program) detached on a terminal the size of the local one, and attaches to it with
//! `AttachCommand`: local standard input goes to the terminal (in raw mode when it is a
//! terminal, so ^C, ^D and ^Z are typed remotely), window size changes (SIGWINCH) become
//! resizes, output is written as it arrives. A claim it took is saved for the binding and
//! renewed while the shell runs, and released when the shell has ended. With piped input
//! the same runs without raw mode: end of input types end-of-file, and ^C sent to the client
//! is SIGINT to the shell's foreground job.

use std::io::Write as _;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

use super::client::{ClaimArgs, Target};
use super::commands::{
    Held, REATTACH_ATTEMPTS, REATTACH_PAUSE, cancel, claim_for, exit_code, query, read_stdin,
    reattachable,
};
use super::local_terminal::LocalTerminal;
use super::saved_claim::SavedClaims;
use super::session::Session;
use crate::api::pb;
use crate::api::pb::command_attach_input::Input;

/// What the terminal runs when no program is given: independent of the local `$SHELL`.
pub const DEFAULT_SHELL: &str = "/bin/sh -i";

/// Options of `client shell`.
#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// Lifetime of a claim `shell` takes (30s to 5m); it is renewed while the shell runs.
    #[arg(long, default_value = "60s", value_parser = super::client::parse_duration)]
    pub ttl: Duration,
    /// The program the terminal runs (default: `/bin/sh -i`).
    #[arg(num_args = 0.., trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// `client shell`: answers the shell's exit code once it has ended.
pub async fn shell(session: &Session, args: ShellArgs, saved: &SavedClaims) -> anyhow::Result<i32> {
    let text = if args.command.is_empty() {
        DEFAULT_SHELL.to_owned()
    } else {
        args.command.join(" ")
    };
    let mut held = claim_for(session, &args.claim, saved, args.ttl).await?;
    let (rows, cols) = LocalTerminal::size();
    let request = pb::CommandStartRequest {
        context: Some(session.context(&held.claim)),
        command: text,
        detach: true,
        open_stdin: true,
        pty: Some(pb::PtySize { rows, cols }),
        ..Default::default()
    };
    let started = match session.rpc().start_command(request).await {
        Ok(started) => started.into_inner(),
        Err(status) => {
            if held.own {
                let _ = session.release(&held.claim).await;
            }
            return Err(status.into());
        }
    };
    if held.own {
        // `attach`, `ps` and `kill` find the shell's claim while it runs.
        saved.save(session.binding(), session.environment_id(), &held.claim)?;
    }
    let id = started.command_id;
    let terminal = LocalTerminal::raw()?;
    terminal.note(&format!(
        "(shell {id} under run {} claim {}; `exit` or ^D ends it)",
        held.claim.run_id, held.claim.claim_id
    ));
    let attached = Attached {
        session,
        saved,
        id: &id,
        ttl: args.ttl,
        terminal: &terminal,
    };
    let ended = attached.run(&mut held).await;
    drop(terminal);
    let end = match ended {
        Ok(end) => end,
        Err(error) => {
            eprintln!(
                "(the shell {id} may still run under its claim until the claim ends: \
                 `client kill --binding {b} {id}` ends it)",
                b = session.binding()
            );
            return Err(error);
        }
    };
    // Record the end now (a cancel of an ended command records it), so it no longer counts
    // among the claim's open commands; then give back a claim taken for the shell.
    if let Err(error) = cancel(session, &held.claim, &id, Duration::ZERO).await {
        eprintln!(
            "warning: the shell's end could not be recorded: {}",
            super::describe(&error)
        );
    }
    if held.own {
        saved.forget(session.binding(), &held.claim.claim_id);
        if let Err(error) = session.release(&held.claim).await {
            eprintln!(
                "warning: the run claim could not be released: {}",
                super::describe(&error)
            );
        }
    }
    Ok(exit_code(end.state, end.exit_code))
}

/// One shell's attachment: the sessions it opens (again, after a break) until the shell ends.
struct Attached<'a> {
    session: &'a Session,
    saved: &'a SavedClaims,
    id: &'a str,
    ttl: Duration,
    terminal: &'a LocalTerminal,
}

/// The local events a session forwards.
struct LocalInput {
    stdin: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    stdin_open: bool,
    window_changes: Option<Signal>,
    /// SIGINT to the client, listened to only without raw mode (raw mode types ^C instead).
    interrupts: Option<Signal>,
}

impl Attached<'_> {
    /// Attaches (again at the last offset when a session breaks, as `exec` follows) until the
    /// shell's end.
    async fn run(&self, held: &mut Held) -> anyhow::Result<pb::CommandStatusResponse> {
        let (stdin_tx, stdin) = mpsc::channel(4);
        std::thread::spawn(move || read_stdin(&stdin_tx));
        let mut local = LocalInput {
            stdin,
            stdin_open: true,
            window_changes: signal(SignalKind::window_change()).ok(),
            interrupts: if self.terminal.is_raw() {
                None
            } else {
                signal(SignalKind::interrupt()).ok()
            },
        };
        let renew_every = (self.ttl / 3).max(Duration::from_secs(5));
        let mut renewals =
            tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        let mut offset = 0u64;
        let mut attempts = 0;
        loop {
            let broken = match self
                .session_once(held, &mut local, &mut renewals, &mut offset, &mut attempts)
                .await?
            {
                Ok(end) => return Ok(end),
                Err(broken) => broken,
            };
            attempts += 1;
            if !reattachable(&broken) || attempts > REATTACH_ATTEMPTS {
                return Err(broken.into());
            }
            self.terminal.note(&format!(
                "(the session broke: {}; attaching again at offset {offset})",
                broken.message()
            ));
            tokio::time::sleep(REATTACH_PAUSE).await;
        }
    }

    /// One `AttachCommand` session from `offset`: the shell's end, or why the session broke.
    async fn session_once(
        &self,
        held: &mut Held,
        local: &mut LocalInput,
        renewals: &mut tokio::time::Interval,
        offset: &mut u64,
        attempts: &mut u32,
    ) -> anyhow::Result<Result<pb::CommandStatusResponse, tonic::Status>> {
        let (tx, rx) = mpsc::channel::<pb::CommandAttachInput>(16);
        let open = query(self.session, &held.claim, self.id, *offset);
        let _ = tx.send(input(Input::Open(open))).await;
        let inputs = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut output = match self.session.rpc().attach_command(inputs).await {
            Ok(output) => output.into_inner(),
            Err(status) => return Ok(Err(status)),
        };
        loop {
            tokio::select! {
                event = output.message() => match event {
                    Ok(Some(event)) => {
                        *attempts = 0;
                        if let Some(end) = self.print(event, offset)? {
                            return Ok(Ok(end));
                        }
                    }
                    Ok(None) => return Ok(Err(tonic::Status::unavailable("the session ended early"))),
                    Err(status) => return Ok(Err(status)),
                },
                chunk = local.stdin.recv(), if local.stdin_open => {
                    let data = match chunk.unwrap_or(Ok(Vec::new())) {
                        Ok(data) => data,
                        Err(error) => {
                            self.terminal.note(&format!("(standard input failed: {error}; closing it)"));
                            Vec::new()
                        }
                    };
                    let next = if data.is_empty() {
                        local.stdin_open = false;
                        Input::CloseStdin(true)
                    } else {
                        Input::Stdin(data)
                    };
                    let _ = tx.send(input(next)).await;
                }
                Some(()) = next_signal(&mut local.window_changes) => {
                    let (rows, cols) = LocalTerminal::size();
                    let _ = tx.send(input(Input::Resize(pb::PtySize { rows, cols }))).await;
                }
                Some(()) = next_signal(&mut local.interrupts) => {
                    let _ = tx.send(input(Input::Signal(pb::CommandSignal::Int as i32))).await;
                }
                _ = renewals.tick(), if held.own => self.renew(held).await,
            }
        }
    }

    /// Writes one event's output; answers the shell's end when it is that.
    fn print(
        &self,
        event: pb::CommandOutputEvent,
        offset: &mut u64,
    ) -> anyhow::Result<Option<pb::CommandStatusResponse>> {
        use pb::command_output_event::Event;
        match event.event {
            Some(Event::Chunk(chunk)) => {
                let start = u64::try_from(chunk.offset).unwrap_or(*offset);
                *offset = start + chunk.data.len() as u64;
                if chunk.stream == pb::OutputStream::Stderr as i32 {
                    let mut err = std::io::stderr().lock();
                    err.write_all(&chunk.data)?;
                    err.flush()?;
                } else {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&chunk.data)?;
                    out.flush()?;
                }
            }
            Some(Event::DroppedBytes(n)) => {
                *offset += n;
                self.terminal.note(&format!(
                    "({n} bytes of output fell out of the retained window)"
                ));
            }
            Some(Event::End(end)) => return Ok(Some(end)),
            None => {}
        }
        Ok(None)
    }

    /// Renews the claim the shell took, and saves the renewed claim for the binding.
    async fn renew(&self, held: &mut Held) {
        match self.session.renew(&held.claim, self.ttl).await {
            Ok(renewed) => {
                held.claim = renewed;
                let saved = self.saved.save(
                    self.session.binding(),
                    self.session.environment_id(),
                    &held.claim,
                );
                if let Err(error) = saved {
                    self.terminal.note(&format!(
                        "warning: the renewed claim was not saved: {error}"
                    ));
                }
            }
            Err(error) => self.terminal.note(&format!(
                "warning: the run claim could not be renewed: {}",
                super::describe(&error)
            )),
        }
    }
}

fn input(input: Input) -> pb::CommandAttachInput {
    pb::CommandAttachInput { input: Some(input) }
}

/// The next delivery of `signal`; never, when it is not listened to.
async fn next_signal(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}
