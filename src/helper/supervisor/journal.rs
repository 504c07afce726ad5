//! The supervisor's operation journal (docs/commands.md §3): commands keyed by command id, with
//! their output windows while they run or recently finished, tombstones (outcome and receipt
//! without output) after that, and one deadline per claim; beside them the one-shot helper
//! calls run under a store operation id (file operations, foreground commands), running and
//! then as tombstones with their receipts. Everything in it is bounded; it lives only in the
//! supervisor's memory, where the workload cannot write.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::reaper_wire::ToReaper;
use super::ring::OutputRing;
use crate::executor::protocol::CommandState;
use crate::executor::supervisor_protocol::{
    ClaimTuple, CommandView, FINISHED_RETENTION, JournalEntry, MAX_FINISHED_COMMANDS,
    MAX_JOURNAL_BYTES, MAX_RUNNING_COMMANDS, MAX_TOMBSTONES, OutputStream,
};

/// One command the supervisor started.
#[derive(Debug)]
pub struct CommandEntry {
    /// The command id.
    pub id: String,
    /// The claim that owns it.
    pub claim: ClaimTuple,
    /// Start time, Unix ms.
    pub started_at_ms: i64,
    /// Its retained window in bytes (reserved in the journal's budget).
    pub window: usize,
    /// Runs on a terminal.
    pub pty: bool,
    /// The digest of the start request (empty without a client operation id).
    pub request_digest: String,
    /// Followers streaming it now.
    pub followers: AtomicUsize,
    state: Mutex<EntryState>,
    changed: watch::Sender<u64>,
    control: mpsc::UnboundedSender<ToReaper>,
}

#[derive(Debug)]
struct EntryState {
    ring: OutputRing,
    state: CommandState,
    exit_code: i32,
    proven: bool,
    receipt: String,
    ended_at_ms: i64,
    ended_at: Option<Instant>,
    stdin_open: bool,
    stdin_queued: usize,
}

impl CommandEntry {
    /// A running entry whose reaper takes frames from `control`; on a terminal (`pty`) stdin
    /// is open from the start.
    pub fn new(
        id: String,
        claim: ClaimTuple,
        started_at_ms: i64,
        window: usize,
        (stdin_open, pty): (bool, bool),
        request_digest: String,
        control: mpsc::UnboundedSender<ToReaper>,
    ) -> Self {
        Self {
            id,
            claim,
            started_at_ms,
            window,
            pty,
            request_digest,
            followers: AtomicUsize::new(0),
            state: Mutex::new(EntryState {
                ring: OutputRing::new(window),
                state: CommandState::Running,
                exit_code: 0,
                proven: false,
                receipt: String::new(),
                ended_at_ms: 0,
                ended_at: None,
                stdin_open: stdin_open || pty,
                stdin_queued: 0,
            }),
            changed: watch::channel(0).0,
            control,
        }
    }

    fn lock(&self) -> MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// A receiver that sees every later change (output, stdin, end).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Sends a frame to the reaper; false once the reaper is gone.
    pub fn send(&self, frame: ToReaper) -> bool {
        self.control.send(frame).is_ok()
    }

    /// When the command ended (Unix ms), `i64::MAX` while it runs.
    pub fn ended_at_ms(&self) -> i64 {
        let state = self.lock();
        if state.state == CommandState::Running {
            i64::MAX
        } else {
            state.ended_at_ms
        }
    }

    /// Whether the command still runs.
    pub fn is_running(&self) -> bool {
        self.lock().state == CommandState::Running
    }

    /// Appends output.
    pub fn push_output(&self, stream: OutputStream, data: &[u8]) {
        self.lock().ring.push(stream, data);
        self.bump();
    }

    /// Queues `len` stdin bytes if the pipe is open and the queue has room; returns whether the
    /// pipe was open, and whether the bytes fit.
    pub fn queue_stdin(&self, len: usize, limit: usize) -> (bool, bool) {
        let mut state = self.lock();
        if !state.stdin_open || state.state != CommandState::Running {
            return (false, false);
        }
        if state.stdin_queued + len > limit {
            return (true, false);
        }
        state.stdin_queued += len;
        (true, true)
    }

    /// Marks stdin closed by the caller or by the command.
    pub fn close_stdin(&self) {
        self.lock().stdin_open = false;
        self.bump();
    }

    /// The reaper wrote `bytes` stdin bytes to the command.
    pub fn stdin_written(&self, bytes: usize) {
        let mut state = self.lock();
        state.stdin_queued = state.stdin_queued.saturating_sub(bytes);
    }

    /// Whether stdin is open.
    pub fn stdin_open(&self) -> bool {
        self.lock().stdin_open
    }

    /// Records the end; the receipt only when the end is proven.
    pub fn finish(&self, exit_code: i32, interrupted: bool, proven: bool, now_ms: i64) {
        let mut state = self.lock();
        if state.state != CommandState::Running {
            return;
        }
        let outcome = if !proven {
            CommandState::FenceUnknown
        } else if interrupted {
            CommandState::Cancelled
        } else if exit_code != 0 {
            CommandState::Failed
        } else {
            CommandState::Succeeded
        };
        state.state = outcome;
        state.exit_code = exit_code;
        state.proven = proven;
        state.stdin_open = false;
        state.ended_at_ms = now_ms;
        state.ended_at = Some(Instant::now());
        if proven {
            let next = state.ring.next_offset();
            state.receipt = state
                .ring
                .digest()
                .receipt(&self.id, outcome, exit_code, next);
        }
        drop(state);
        self.bump();
    }

    /// The view with output from `offset` (at most `max` bytes); `None` past the end.
    pub fn view(&self, offset: u64, max: usize) -> Option<CommandView> {
        let state = self.lock();
        let read = state.ring.read(offset, max)?;
        Some(CommandView {
            chunks: read.chunks,
            start_offset: read.start_offset,
            next_offset: read.next_offset,
            dropped_bytes: read.dropped_bytes,
            ..self.summary_of(&state)
        })
    }

    /// The view without output.
    pub fn summary(&self) -> CommandView {
        self.summary_of(&self.lock())
    }

    fn summary_of(&self, state: &EntryState) -> CommandView {
        CommandView {
            command_id: self.id.clone(),
            state: state.state,
            exit_code: state.exit_code,
            chunks: Vec::new(),
            start_offset: state.ring.next_offset(),
            next_offset: state.ring.next_offset(),
            dropped_bytes: 0,
            stdin_open: state.stdin_open,
            proven: state.proven,
            terminal_receipt: state.receipt.clone(),
            started_at_ms: self.started_at_ms,
            ended_at_ms: state.ended_at_ms,
        }
    }

    fn ended_at(&self) -> Option<Instant> {
        self.lock().ended_at
    }

    fn tombstone(&self) -> JournalEntry {
        let state = self.lock();
        JournalEntry {
            command_id: self.id.clone(),
            claim_id: self.claim.claim_id.clone(),
            state: state.state,
            exit_code: state.exit_code,
            proven: state.proven,
            terminal_receipt: state.receipt.clone(),
            never_started: false,
        }
    }
}

/// Why a start is not admitted.
#[derive(Debug)]
pub enum Admission {
    /// Admitted: insert the entry.
    Admit,
    /// The id is known: answer this entry.
    Known(Arc<CommandEntry>),
    /// The id is known under another claim.
    Foreign,
    /// The id was used (tombstone or seal).
    Used,
    /// [`MAX_RUNNING_COMMANDS`] run.
    TooMany,
    /// The windows would pass [`MAX_JOURNAL_BYTES`].
    NoRoom,
}

/// A call of the one-shot helper running under a store operation id (the recovery issue,
/// item 1): what a `cancel_call` needs to stop it and wait for its end.
#[derive(Debug)]
pub struct RunningCall {
    cancel: Arc<watch::Sender<bool>>,
    /// Dropped when the call's outcome is journaled: its receivers then see the end.
    ended: watch::Sender<()>,
}

impl RunningCall {
    /// A running call that `cancel` stops.
    pub fn new(cancel: Arc<watch::Sender<bool>>) -> Self {
        Self {
            cancel,
            ended: watch::channel(()).0,
        }
    }
}

/// The journal.
#[derive(Debug, Default)]
pub struct Journal {
    entries: BTreeMap<String, Arc<CommandEntry>>,
    tombstones: BTreeMap<String, JournalEntry>,
    tombstone_order: VecDeque<String>,
    claims: BTreeMap<String, Instant>,
    /// Calls running under an operation id (at most one per connection, so bounded by the
    /// connection limit); their outcomes become tombstones.
    calls: BTreeMap<String, RunningCall>,
}

impl Journal {
    /// Decides a start of `id` under `claim` with a `window`-byte window.
    pub fn admit(
        &mut self,
        id: &str,
        claim: &ClaimTuple,
        window: usize,
        now: Instant,
    ) -> Admission {
        self.housekeep(now);
        if let Some(entry) = self.entries.get(id) {
            return if entry.claim == *claim {
                Admission::Known(entry.clone())
            } else {
                Admission::Foreign
            };
        }
        if self.tombstones.contains_key(id) {
            return Admission::Used;
        }
        if self.running().count() >= MAX_RUNNING_COMMANDS {
            return Admission::TooMany;
        }
        while self.reserved() + window > MAX_JOURNAL_BYTES {
            let oldest = self
                .entries
                .values()
                .filter_map(|e| e.ended_at().map(|at| (at, e.id.clone())))
                .min();
            match oldest {
                Some((_, id)) => self.bury(&id),
                None => return Admission::NoRoom,
            }
        }
        Admission::Admit
    }

    /// The live entry of `id` when `claim` owns it (a replayed start's lookup: nothing is
    /// admitted, buried or reserved).
    pub fn known(
        &mut self,
        id: &str,
        claim: &ClaimTuple,
        now: Instant,
    ) -> Option<Arc<CommandEntry>> {
        self.housekeep(now);
        self.entries.get(id).filter(|e| e.claim == *claim).cloned()
    }

    /// Inserts an admitted entry.
    pub fn insert(&mut self, entry: Arc<CommandEntry>) {
        self.entries.insert(entry.id.clone(), entry);
    }

    /// Forgets an entry whose start was refused (nothing ran).
    pub fn forget(&mut self, id: &str) {
        self.entries.remove(id);
    }

    /// The entry `id` if it belongs to exactly `claim` and that claim's deadline has not passed.
    pub fn owned(&self, id: &str, claim: &ClaimTuple, now: Instant) -> Option<Arc<CommandEntry>> {
        let entry = self.entries.get(id)?;
        (entry.claim == *claim && self.claim_live(&claim.claim_id, now)).then(|| entry.clone())
    }

    /// Whether the claim's deadline is still ahead.
    pub fn claim_live(&self, claim_id: &str, now: Instant) -> bool {
        self.claims
            .get(claim_id)
            .is_some_and(|deadline| *deadline > now)
    }

    /// Moves the claim's deadline to `deadline` if that is later.
    pub fn extend_claim(&mut self, claim_id: &str, deadline: Instant) {
        let slot = self.claims.entry(claim_id.to_owned()).or_insert(deadline);
        *slot = (*slot).max(deadline);
    }

    /// Forgets the claim's deadline.
    pub fn drop_claim(&mut self, claim_id: &str) {
        self.claims.remove(claim_id);
    }

    /// The earliest deadline of a claim that still has a running command.
    pub fn next_deadline(&self) -> Option<(Instant, String)> {
        self.claims
            .iter()
            .filter(|(claim, _)| self.running().any(|e| e.claim.claim_id == **claim))
            .map(|(claim, at)| (*at, claim.clone()))
            .min()
    }

    /// Claims whose deadline passed while a command of theirs still runs.
    pub fn expired_claims(&self, now: Instant) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(claim, at)| {
                **at <= now && self.running().any(|e| e.claim.claim_id == **claim)
            })
            .map(|(claim, _)| claim.clone())
            .collect()
    }

    /// Every entry of the claim.
    pub fn of_claim(&self, claim_id: &str) -> Vec<Arc<CommandEntry>> {
        self.entries
            .values()
            .filter(|e| e.claim.claim_id == claim_id)
            .cloned()
            .collect()
    }

    /// The entries of `claim_id` in the order a list gives them: the running ones, then the
    /// finished ones, most recently ended first (ties by id). A list cut at its limit then
    /// keeps what a caller recording ends needs most: the ends it has not seen yet.
    pub fn listed(&self, claim_id: &str) -> Vec<Arc<CommandEntry>> {
        let mut entries = self.of_claim(claim_id);
        entries.sort_by_cached_key(|e| (std::cmp::Reverse(e.ended_at_ms()), e.id.clone()));
        entries
    }

    /// Every entry that still runs.
    pub fn running(&self) -> impl Iterator<Item = &Arc<CommandEntry>> {
        self.entries.values().filter(|e| e.is_running())
    }

    /// Every entry.
    pub fn all(&self) -> Vec<Arc<CommandEntry>> {
        self.entries.values().cloned().collect()
    }

    /// Turns a finished entry into a tombstone, erasing its output.
    pub fn bury(&mut self, id: &str) {
        let Some(entry) = self.entries.get(id) else {
            return;
        };
        if entry.is_running() {
            return;
        }
        let stone = entry.tombstone();
        self.entries.remove(id);
        self.add_tombstone(stone);
    }

    fn add_tombstone(&mut self, stone: JournalEntry) {
        self.tombstone_order.push_back(stone.command_id.clone());
        self.tombstones.insert(stone.command_id.clone(), stone);
        while self.tombstones.len() > MAX_TOMBSTONES {
            if let Some(oldest) = self.tombstone_order.pop_front() {
                self.tombstones.remove(&oldest);
            }
        }
    }

    /// Journals a call starting under operation `id`; false when the id is already known (a
    /// call, a command or a tombstone of it): nothing may run twice under one id.
    pub fn begin_call(&mut self, id: &str, call: RunningCall) -> bool {
        let known = self.calls.contains_key(id)
            || self.entries.contains_key(id)
            || self.tombstones.contains_key(id);
        if !known {
            self.calls.insert(id.to_owned(), call);
        }
        !known
    }

    /// Records the outcome of the call of operation `id` (a tombstone: no output is kept) and
    /// wakes whoever waits for its end.
    pub fn finish_call(&mut self, stone: JournalEntry) {
        if self.calls.remove(&stone.command_id).is_some() {
            self.add_tombstone(stone);
        }
    }

    /// Asks the running call of `id` to stop; a receiver that sees its end (closed), or `None`
    /// when no call of that id runs.
    pub fn cancel_call(&self, id: &str) -> Option<watch::Receiver<()>> {
        let call = self.calls.get(id)?;
        call.cancel.send_replace(true);
        Some(call.ended.subscribe())
    }

    /// What the journal knows of `id`; with `seal`, an unknown id becomes a never-started
    /// tombstone so that no later start can use it.
    pub fn journal(&mut self, id: &str, seal: bool) -> Option<JournalEntry> {
        if let Some(entry) = self.entries.get(id) {
            return Some(entry.tombstone());
        }
        if self.calls.contains_key(id) {
            return Some(JournalEntry {
                command_id: id.to_owned(),
                claim_id: String::new(),
                state: CommandState::Running,
                exit_code: 0,
                proven: false,
                terminal_receipt: String::new(),
                never_started: false,
            });
        }
        if let Some(stone) = self.tombstones.get(id) {
            return Some(stone.clone());
        }
        if !seal {
            return None;
        }
        let stone = JournalEntry {
            command_id: id.to_owned(),
            claim_id: String::new(),
            state: CommandState::Failed,
            exit_code: -1,
            proven: true,
            terminal_receipt: String::new(),
            never_started: true,
        };
        self.add_tombstone(stone.clone());
        Some(stone)
    }

    fn reserved(&self) -> usize {
        self.entries.values().map(|e| e.window).sum()
    }

    /// Buries finished entries past their retention or past the finished bound, and forgets
    /// deadlines of claims without entries.
    pub fn housekeep(&mut self, now: Instant) {
        let mut finished: Vec<(Instant, String)> = self
            .entries
            .values()
            .filter_map(|e| e.ended_at().map(|at| (at, e.id.clone())))
            .collect();
        finished.sort();
        let excess = finished.len().saturating_sub(MAX_FINISHED_COMMANDS);
        for (index, (ended_at, id)) in finished.iter().enumerate() {
            if index < excess || now.saturating_duration_since(*ended_at) >= FINISHED_RETENTION {
                self.bury(id);
            }
        }
        let entries = &self.entries;
        self.claims
            .retain(|claim, _| entries.values().any(|e| e.claim.claim_id == *claim));
    }
}
