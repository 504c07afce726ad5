//! What the supervisor does for each authenticated request (docs/commands.md §4.4, §5): start,
//! status, stdin, signals, cancel, claim renewal and end, listing, the journal query and the
//! cancel of a journaled call (the recovery issue, item 1). The
//! claim tuple of every request is compared exactly with the command's; a mismatch answers
//! `not_found`, like an unknown id.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use super::command_link::{self, ProcessReapers, ReaperHost, ReaperPids, now_ms};
use super::journal::{Admission, CommandEntry, Journal, RunningCall};
use super::reaper_wire::ToReaper;
use crate::executor::protocol::{ErrorCode, ExecutorError, MAX_COMMAND_BYTES};
use crate::executor::supervisor_protocol::{
    CLAIM_KILL_GRACE, ClaimTuple, CommandView, DEFAULT_CANCEL_GRACE, DEFAULT_WINDOW, JournalEntry,
    MAX_CANCEL_GRACE, MAX_ENV_TOTAL, MAX_ENV_VALUE, MAX_ENV_VARS, MAX_LEASE, MAX_LIST,
    MAX_PTY_SIDE, MAX_STATUS_BYTES, MAX_STDIN_CHUNK, MAX_STDIN_QUEUE, MAX_WINDOW, PtySize,
    StartRequest, SupervisorReply, SupervisorRequest, valid_command_id, valid_env_name,
};
use crate::helper::reaper::SWEEP_WINDOW;
use crate::runtime::Runtime;

/// How long one orphan sweep after a child's exit may take.
const ORPHAN_SWEEP: Duration = Duration::from_millis(500);
/// Added to a cancel's grace and the sweep window before a cancel stops waiting.
const CANCEL_SLACK: Duration = Duration::from_secs(5);

/// The supervisor's state, shared by every connection.
pub struct Supervisor {
    /// The helper binary, re-executed as each command's reaper.
    pub helper: PathBuf,
    /// The workspace root.
    pub root: PathBuf,
    /// This boot's id.
    pub boot_id: [u8; 16],
    /// Time and randomness.
    pub runtime: Runtime,
    secret: Mutex<Option<[u8; 32]>>,
    journal: Mutex<Journal>,
    reapers: ReaperPids,
    reaper_host: Arc<dyn ReaperHost>,
    deadlines: Notify,
}

fn refuse(code: ErrorCode, message: &str) -> SupervisorReply {
    SupervisorReply::Error(ExecutorError::new(code, message))
}

fn absent() -> SupervisorReply {
    refuse(ErrorCode::NotFound, "command not found")
}

/// The answer to a start of a command id already known under the same claim: that command,
/// unless the start asks for something else (another request digest): then `conflict`.
fn replayed(entry: &CommandEntry, start: &StartRequest) -> SupervisorReply {
    if entry.request_digest != start.request_digest {
        return refuse(
            ErrorCode::Conflict,
            "command id already used by another request",
        );
    }
    SupervisorReply::Status(entry.summary())
}

impl Supervisor {
    /// A fresh, unenrolled supervisor whose commands each run under a reaper process.
    pub fn new(helper: PathBuf, root: PathBuf, runtime: Runtime) -> Arc<Self> {
        let reapers = ReaperPids::default();
        let host = Arc::new(ProcessReapers {
            helper: helper.clone(),
            root: root.clone(),
            pids: reapers.clone(),
        });
        Self::build(helper, root, runtime, reapers, host)
    }

    /// A fresh, unenrolled supervisor whose reapers `host` starts (the simulator's node). It
    /// has no helper binary: a one-shot `call` fails to start and is answered as such.
    pub fn with_reapers(root: PathBuf, runtime: Runtime, host: Arc<dyn ReaperHost>) -> Arc<Self> {
        Self::build(PathBuf::new(), root, runtime, ReaperPids::default(), host)
    }

    fn build(
        helper: PathBuf,
        root: PathBuf,
        runtime: Runtime,
        reapers: ReaperPids,
        reaper_host: Arc<dyn ReaperHost>,
    ) -> Arc<Self> {
        let mut boot_id = [0u8; 16];
        runtime.ids.fill(&mut boot_id);
        Arc::new(Self {
            helper,
            root,
            boot_id,
            runtime,
            secret: Mutex::new(None),
            journal: Mutex::new(Journal::default()),
            reapers,
            reaper_host,
            deadlines: Notify::new(),
        })
    }

    /// The pinned secret, if enrolled.
    pub fn secret(&self) -> Option<[u8; 32]> {
        *self.secret.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins `secret` on first use; afterwards only the same secret is accepted.
    pub fn enroll(&self, secret: [u8; 32]) -> bool {
        use subtle::ConstantTimeEq as _;
        let mut pinned = self.secret.lock().unwrap_or_else(|e| e.into_inner());
        match *pinned {
            None => {
                *pinned = Some(secret);
                true
            }
            Some(existing) => bool::from(existing.ct_eq(&secret)),
        }
    }

    /// The pids of the supervisor's legitimate children (reapers and per-call helpers).
    pub fn reaper_pids(&self) -> &ReaperPids {
        &self.reapers
    }

    /// How many commands are running.
    pub fn running_commands(&self) -> usize {
        self.journal().running().count()
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Instant {
        self.runtime.clock.monotonic()
    }

    /// Journals a call about to run under operation `id` (`cancel` stops it); refused when the
    /// id is not valid or already known, before anything runs.
    pub fn begin_call(
        &self,
        id: &str,
        cancel: Arc<watch::Sender<bool>>,
    ) -> Result<(), ExecutorError> {
        if !valid_command_id(id) {
            return Err(ExecutorError::new(
                ErrorCode::InvalidArgument,
                "operation id is not valid",
            ));
        }
        if self.journal().begin_call(id, RunningCall::new(cancel)) {
            Ok(())
        } else {
            Err(ExecutorError::new(
                ErrorCode::Conflict,
                "operation id already used",
            ))
        }
    }

    /// Journals the outcome of a call begun with [`Supervisor::begin_call`].
    pub fn finish_call(&self, stone: JournalEntry) {
        self.journal().finish_call(stone);
    }

    /// Stops the call of operation `id` and waits, at most `grace` and the sweep window, for
    /// its end; answers its journal entry as it then stands (`None`: unknown id).
    pub async fn cancel_call(&self, id: &str, grace: Duration) -> Option<JournalEntry> {
        let ended = self.journal().cancel_call(id);
        if let Some(mut ended) = ended {
            let wait = async { while ended.changed().await.is_ok() {} };
            let _ = tokio::time::timeout(grace + SWEEP_WINDOW + CANCEL_SLACK, wait).await;
        }
        self.journal().journal(id, false)
    }

    /// The entry `id` of exactly `claim`, with its deadline ahead.
    pub fn owned(&self, id: &str, claim: &ClaimTuple) -> Option<Arc<CommandEntry>> {
        self.journal().owned(id, claim, self.now())
    }

    /// Answers one unary request (not `enroll` nor `follow`, which the channel handles).
    pub async fn handle(self: &Arc<Self>, request: SupervisorRequest) -> SupervisorReply {
        match request {
            SupervisorRequest::Start(start) => self.start(start).await,
            SupervisorRequest::Status {
                command_id,
                claim,
                offset,
                max_bytes,
            } => match self.owned(&command_id, &claim) {
                None => absent(),
                Some(entry) => {
                    let max = usize::try_from(max_bytes)
                        .ok()
                        .filter(|m| *m > 0 && *m <= MAX_STATUS_BYTES)
                        .unwrap_or(MAX_STATUS_BYTES);
                    match entry.view(offset, max) {
                        Some(view) => SupervisorReply::Status(view),
                        None => refuse(ErrorCode::InvalidArgument, "offset is past the output"),
                    }
                }
            },
            SupervisorRequest::Stdin {
                command_id,
                claim,
                data,
                close,
            } => self.stdin(&command_id, &claim, data, close),
            SupervisorRequest::Signal {
                command_id,
                claim,
                signal,
            } => match self.owned(&command_id, &claim) {
                None => absent(),
                Some(entry) if !entry.is_running() => {
                    refuse(ErrorCode::Conflict, "command has ended")
                }
                Some(entry) => {
                    entry.send(ToReaper::Signal { signal });
                    SupervisorReply::Ok {}
                }
            },
            SupervisorRequest::Resize {
                command_id,
                claim,
                size,
            } => match self.owned(&command_id, &claim) {
                None => absent(),
                Some(entry) if !entry.pty => refuse(ErrorCode::Conflict, "command has no terminal"),
                Some(entry) if !entry.is_running() => {
                    refuse(ErrorCode::Conflict, "command has ended")
                }
                Some(_) if !valid_pty_size(size) => {
                    refuse(ErrorCode::InvalidArgument, "terminal size is out of range")
                }
                Some(entry) => {
                    entry.send(ToReaper::Resize { size });
                    SupervisorReply::Ok {}
                }
            },
            SupervisorRequest::Cancel {
                command_id,
                claim,
                grace_ms,
            } => match self.owned(&command_id, &claim) {
                None => absent(),
                Some(entry) => {
                    let grace = grace_of(grace_ms, DEFAULT_CANCEL_GRACE);
                    cancel(&entry, grace).await;
                    SupervisorReply::Status(entry.summary())
                }
            },
            SupervisorRequest::Renew { claim, lease_ms } => self.renew(&claim, lease_ms),
            SupervisorRequest::EndClaim { claim_id, grace_ms } => {
                let grace = grace_of(grace_ms, CLAIM_KILL_GRACE);
                SupervisorReply::StatusList {
                    commands: self.end_claim(&claim_id, grace).await,
                }
            }
            SupervisorRequest::List { claim, limit } => {
                let limit = usize::try_from(limit)
                    .ok()
                    .filter(|l| *l > 0 && *l <= MAX_LIST)
                    .unwrap_or(MAX_LIST);
                let journal = self.journal();
                let live = journal.claim_live(&claim.claim_id, self.now());
                let commands = journal
                    .listed(&claim.claim_id)
                    .into_iter()
                    .filter(|e| live && e.claim == claim)
                    .take(limit)
                    .map(|e| e.summary())
                    .collect();
                SupervisorReply::StatusList { commands }
            }
            SupervisorRequest::Journal { command_id, seal } => SupervisorReply::Journal {
                entry: self.journal().journal(&command_id, seal),
            },
            SupervisorRequest::CancelCall {
                operation_id,
                grace_ms,
            } => SupervisorReply::Journal {
                entry: self
                    .cancel_call(&operation_id, grace_of(grace_ms, DEFAULT_CANCEL_GRACE))
                    .await,
            },
            SupervisorRequest::Enroll { .. }
            | SupervisorRequest::Follow { .. }
            | SupervisorRequest::Call { .. }
            | SupervisorRequest::CallInput { .. } => {
                refuse(ErrorCode::InvalidArgument, "request not valid here")
            }
        }
    }

    async fn start(self: &Arc<Self>, start: StartRequest) -> SupervisorReply {
        if let Err(message) = validate_start(&start) {
            return refuse(ErrorCode::InvalidArgument, message);
        }
        let window = match usize::try_from(start.window_bytes) {
            Ok(0) => DEFAULT_WINDOW,
            Ok(w) if w <= MAX_WINDOW => w,
            _ => {
                return refuse(
                    ErrorCode::ResourceExhausted,
                    "output window exceeds its bound",
                );
            }
        };
        let now = self.now();
        if start.replay_only {
            let known = self.journal().known(&start.command_id, &start.claim, now);
            return match known {
                Some(entry) => replayed(&entry, &start),
                None => absent(),
            };
        }
        let (entry, started) = {
            let mut journal = self.journal();
            match journal.admit(&start.command_id, &start.claim, window, now) {
                Admission::Known(entry) => return replayed(&entry, &start),
                Admission::Foreign => return absent(),
                Admission::Used => return refuse(ErrorCode::Conflict, "command id already used"),
                Admission::TooMany => {
                    return refuse(ErrorCode::ResourceExhausted, "too many running commands");
                }
                Admission::NoRoom => {
                    return refuse(
                        ErrorCode::ResourceExhausted,
                        "command output memory exhausted",
                    );
                }
                Admission::Admit => {}
            }
            let launch = match self.reaper_host.launch(&start) {
                Ok(launch) => launch,
                Err(error) => return SupervisorReply::Error(error),
            };
            let entry = Arc::new(CommandEntry::new(
                start.command_id.clone(),
                start.claim.clone(),
                now_ms(&*self.runtime.clock),
                window,
                (start.stdin, start.pty.is_some()),
                start.request_digest.clone(),
                launch.control.clone(),
            ));
            entry.send(ToReaper::Start {
                command: start.command.clone(),
                env: start.env.clone(),
                working_dir: start.working_dir.clone(),
                timeout_ms: start.timeout_ms,
                stdin: start.stdin,
                pty: start.pty,
            });
            journal.extend_claim(
                &start.claim.claim_id,
                now + Duration::from_millis(start.lease_ms),
            );
            journal.insert(entry.clone());
            let (started_tx, started_rx) = oneshot::channel();
            command_link::follow(
                launch,
                entry.clone(),
                started_tx,
                self.runtime.clock.clone(),
            );
            (entry, started_rx)
        };
        self.deadlines.notify_one();
        match started.await {
            Ok(Ok(())) => SupervisorReply::Status(entry.summary()),
            Ok(Err(error)) => {
                self.journal().forget(&entry.id);
                SupervisorReply::Error(error)
            }
            Err(_) => {
                self.journal().forget(&entry.id);
                refuse(ErrorCode::Internal, "command could not be started")
            }
        }
    }

    fn stdin(
        &self,
        command_id: &str,
        claim: &ClaimTuple,
        data: Vec<u8>,
        close: bool,
    ) -> SupervisorReply {
        let Some(entry) = self.owned(command_id, claim) else {
            return absent();
        };
        if data.len() > MAX_STDIN_CHUNK {
            return refuse(ErrorCode::InvalidArgument, "stdin chunk exceeds its bound");
        }
        let (open, fits) = entry.queue_stdin(data.len(), MAX_STDIN_QUEUE);
        if !open {
            return refuse(ErrorCode::Conflict, "command stdin is closed");
        }
        if !fits {
            return SupervisorReply::Error(ExecutorError {
                retryable: true,
                ..ExecutorError::new(ErrorCode::ResourceExhausted, "command stdin is full")
            });
        }
        let accepted = data.len() as u64;
        if !data.is_empty() {
            entry.send(ToReaper::Stdin { data });
        }
        if close {
            entry.send(ToReaper::CloseStdin);
            entry.close_stdin();
        }
        SupervisorReply::Stdin {
            accepted,
            open: entry.stdin_open(),
        }
    }

    fn renew(&self, claim: &ClaimTuple, lease_ms: u64) -> SupervisorReply {
        if lease_ms == 0 || Duration::from_millis(lease_ms) > MAX_LEASE {
            return refuse(ErrorCode::InvalidArgument, "lease is out of range");
        }
        let deadline = self.now() + Duration::from_millis(lease_ms);
        let commands = {
            let mut journal = self.journal();
            let owned: Vec<_> = journal
                .running()
                .filter(|e| e.claim == *claim)
                .cloned()
                .collect();
            if !owned.is_empty() {
                journal.extend_claim(&claim.claim_id, deadline);
            }
            owned.len() as u64
        };
        self.deadlines.notify_one();
        SupervisorReply::Renewed { commands }
    }

    /// Ends every command of the claim (SIGTERM, `grace`, SIGKILL, proof), then erases their
    /// output, keeping tombstones; returns their final views.
    pub async fn end_claim(&self, claim_id: &str, grace: Duration) -> Vec<CommandView> {
        let entries = {
            let mut journal = self.journal();
            journal.drop_claim(claim_id);
            journal.of_claim(claim_id)
        };
        futures::future::join_all(entries.iter().map(|e| cancel(e, grace))).await;
        let views: Vec<CommandView> = entries.iter().map(|e| e.summary()).collect();
        let mut journal = self.journal();
        for entry in &entries {
            journal.bury(&entry.id);
        }
        views
    }

    /// Kills and reaps every child that is not a live reaper: as PID 1 of a Pod the supervisor
    /// inherits every orphan of the namespace (a killed one-shot helper's command, say), and an
    /// orphan is never left running or as a zombie.
    pub async fn reap_orphans(&self) {
        let _ = command_link::sweep_orphans(&self.reapers, ORPHAN_SWEEP).await;
    }

    /// Ends every command (the supervisor is stopping).
    pub async fn end_all(&self, grace: Duration) {
        let entries = self.journal().all();
        futures::future::join_all(entries.iter().map(|e| cancel(e, grace))).await;
    }

    /// Kills the commands of every claim whose deadline passed, forever.
    pub async fn watch_deadlines(self: Arc<Self>) {
        loop {
            let notified = self.deadlines.notified();
            let next = self.journal().next_deadline();
            match next {
                Some((at, _)) if at > self.now() => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
                Some(_) => {}
                None => notified.await,
            }
            let expired = {
                let mut journal = self.journal();
                let expired = journal.expired_claims(self.now());
                for claim in &expired {
                    journal.drop_claim(claim);
                }
                expired
            };
            for claim in expired {
                if cfg!(feature = "sim-supervisor-canary") {
                    // The simulator's teeth test: the claim's commands run on past its end.
                    continue;
                }
                let supervisor = self.clone();
                // Detached so that one slow kill does not hold back the next claim's.
                tokio::spawn(async move { supervisor.end_claim(&claim, CLAIM_KILL_GRACE).await });
            }
        }
    }
}

/// Asks the reaper to cancel and waits (bounded) until the entry ended.
async fn cancel(entry: &CommandEntry, grace: Duration) {
    if !entry.is_running() {
        return;
    }
    let mut changes = entry.subscribe();
    if !entry.send(ToReaper::Cancel {
        grace_ms: grace.as_millis() as u64,
    }) {
        return;
    }
    let ended = async {
        while entry.is_running() {
            if changes.changed().await.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(grace + SWEEP_WINDOW + CANCEL_SLACK, ended).await;
}

fn grace_of(grace_ms: u64, default: Duration) -> Duration {
    if grace_ms == 0 {
        default
    } else {
        Duration::from_millis(grace_ms).min(MAX_CANCEL_GRACE)
    }
}

fn validate_start(start: &StartRequest) -> Result<(), &'static str> {
    if !valid_command_id(&start.command_id) {
        return Err("command id is not valid");
    }
    if start.command.is_empty() || start.command.len() > MAX_COMMAND_BYTES {
        return Err("command must be 1 byte to 1 MiB");
    }
    if start.lease_ms == 0 || Duration::from_millis(start.lease_ms) > MAX_LEASE {
        return Err("lease is out of range");
    }
    if start.env.len() > MAX_ENV_VARS {
        return Err("too many environment variables");
    }
    let mut total = 0;
    for (name, value) in &start.env {
        if !valid_env_name(name) || value.len() > MAX_ENV_VALUE || value.contains('\0') {
            return Err("environment variable is not valid");
        }
        total += name.len() + value.len();
    }
    if total > MAX_ENV_TOTAL {
        return Err("environment variables exceed their bound");
    }
    if start.working_dir.contains('\0') || start.working_dir.len() > 4096 {
        return Err("working directory is not valid");
    }
    if start.pty.is_some_and(|size| !valid_pty_size(size)) {
        return Err("terminal size is out of range");
    }
    Ok(())
}

/// 1..=[`MAX_PTY_SIDE`] rows and columns.
fn valid_pty_size(size: PtySize) -> bool {
    (1..=MAX_PTY_SIDE).contains(&size.rows) && (1..=MAX_PTY_SIDE).contains(&size.cols)
}
