//! The reference model of `tests/store_model.rs`: what the spec says one environment holds
//! and answers, written from store §4 (run claims and their renewal receipts), §4.4 and §5
//! (validation, then the fenced dispatch: an executor failure fences), §6 (reference intents,
//! attach, the allocation replay), §7 (admin lifecycle admission, recovery on proof of the
//! exact Pod's termination, revocation) and DECISIONS 8-11, with the check order of each
//! operation; and the capacity ledger of a second template. It performs no I/O; the test runs
//! every step against it and the real store and compares answers and the whole state.

use std::collections::{BTreeMap, BTreeSet};

use execution_provider::errors::ErrorCode;

/// The run-claim TTL every acquisition asks for, in seconds.
pub const TTL: u64 = 60;

/// The bindings the test uses; `b1` created the environment.
pub const BINDINGS: [&str; 3] = ["b1", "b2", "b3"];

/// The lease of an in-flight operation, in seconds (`store::OPERATION_TTL`).
pub const OPERATION_TTL: u64 = 30;

/// The capacity of the second template the allocation steps fill (`pair`).
pub const PAIR_CAPACITY: usize = 2;

/// How the scripted executor answers a dispatched call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorAnswer {
    /// A known success.
    Succeed,
    /// A typed refusal (`not_found`): the outcome is known, nothing is fenced.
    Refuse,
    /// The stream breaks: the outcome is unknown and the environment is fenced.
    Break,
}

/// What a renewal is bound to (its receipt's fingerprint): the claim and the TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewKey {
    pub run: u8,
    pub epoch: u64,
    pub generation: u64,
    pub ttl: u64,
}

/// A reference record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefState {
    PendingCreate,
    Published,
    PendingDelete,
}

/// A reference record: its state and the operation id of its transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: RefState,
    pub op: String,
    pub source: Option<String>,
}

/// The live claim as the model tracks it.
#[derive(Debug, Clone)]
pub struct ModelClaim {
    pub run: u8,
    pub op: u8,
    pub epoch: u64,
    pub generation: u64,
    pub expires: u64,
}

/// The admin lifecycle operations the store admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Replace,
    Retire,
    DeleteRetired,
}

/// The runtime identity an admin request names: epoch and executor Pod UID (the PVC never
/// changes in the test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub epoch: u64,
    pub pod_uid: String,
}

/// The model of one environment (and the allocations of the second template).
#[derive(Debug, Clone)]
pub struct Model {
    pub now: u64,
    pub epoch: u64,
    pub generation: u64,
    pub claim: Option<ModelClaim>,
    pub receipts: BTreeMap<u8, (u64, u64)>,
    pub references: BTreeMap<String, Record>,
    pub lifecycle: Option<(Kind, String)>,
    pub ready: bool,
    pub retired: bool,
    pub pod_uid: String,
    /// (operation id, identity before) of the last completed replacement.
    pub last_replacement: Option<(String, Identity)>,
    /// The termination proof: the operation that wrote it and the identity it proves.
    pub proof: Option<(String, Identity)>,
    /// Whether an operation of unknown outcome is outstanding (`fenceState`).
    pub fenced: bool,
    /// When the recorded in-flight operation's lease lapses, if one is recorded.
    pub in_flight: Option<u64>,
    /// Renewal receipts by operation id: what each was bound to and the expiry it set.
    pub renewals: BTreeMap<String, (RenewKey, u64)>,
    /// The current executor Pod has terminated.
    pub pod_terminal: bool,
    /// Bindings that hold an environment of the second template.
    pub allocations: BTreeSet<String>,
}

impl Model {
    /// A committed, Ready environment at epoch 1, generation 1, created by `b1` under `op`.
    pub fn new(create_op: &str, pod_uid: &str) -> Model {
        let mut references = BTreeMap::new();
        references.insert(
            "b1".to_owned(),
            Record {
                state: RefState::Published,
                op: create_op.to_owned(),
                source: None,
            },
        );
        Model {
            now: 0,
            epoch: 1,
            generation: 1,
            claim: None,
            receipts: BTreeMap::new(),
            references,
            lifecycle: None,
            ready: true,
            retired: false,
            pod_uid: pod_uid.to_owned(),
            last_replacement: None,
            proof: None,
            fenced: false,
            in_flight: None,
            renewals: BTreeMap::new(),
            pod_terminal: false,
            allocations: BTreeSet::new(),
        }
    }

    /// The identity an actor observing now would name.
    pub fn identity(&self) -> Identity {
        Identity {
            epoch: self.epoch,
            pod_uid: self.pod_uid.clone(),
        }
    }

    fn published(&self, binding: &str) -> bool {
        self.references
            .get(binding)
            .is_some_and(|r| r.state == RefState::Published)
    }

    fn live_claim(&self) -> bool {
        self.claim.as_ref().is_some_and(|c| self.now < c.expires)
    }

    /// AcquireRun (§4.1, DECISIONS 9) on binding `b1`.
    pub fn acquire(&mut self, run: u8, op: u8) -> Result<(), ErrorCode> {
        if self.lifecycle.is_some() {
            return Err(ErrorCode::NotReady);
        }
        if !self.published("b1") {
            return Err(ErrorCode::NotFound);
        }
        if !self.ready || self.fenced {
            return Err(ErrorCode::NotReady);
        }
        if let Some(c) = &self.claim {
            if c.run == run && c.op == op {
                if c.generation != self.generation {
                    return Err(ErrorCode::Conflict);
                }
                if self.now >= c.expires {
                    return Err(ErrorCode::ClaimExpired);
                }
                return Ok(());
            }
            if self.now < c.expires {
                return Err(ErrorCode::Conflict);
            }
            if self.in_flight.is_some() {
                return Err(ErrorCode::FenceUnknown);
            }
        }
        if self.in_flight.is_some() {
            return Err(ErrorCode::Conflict);
        }
        self.epoch += 1;
        self.claim = Some(ModelClaim {
            run,
            op,
            epoch: self.epoch,
            generation: self.generation,
            expires: self.now + TTL,
        });
        Ok(())
    }

    /// `held` is the claim this run last received (what it presents).
    fn current(&self, held: &ModelClaim) -> bool {
        self.claim.as_ref().is_some_and(|c| {
            c.epoch == held.epoch
                && c.run == held.run
                && c.generation == self.generation
                && held.generation == self.generation
        })
    }

    /// ReleaseRun (§4.3).
    pub fn release(&mut self, held: &ModelClaim) -> Result<(), ErrorCode> {
        if self.claim.is_none() {
            return Ok(());
        }
        if self.lifecycle.is_some() {
            return Err(ErrorCode::NotReady);
        }
        if !self.current(held) {
            return Err(ErrorCode::Conflict);
        }
        if self.in_flight.is_some() {
            return Err(ErrorCode::FenceUnknown);
        }
        self.claim = None;
        Ok(())
    }

    /// RenewRun (§4.2): `held` renews for `ttl` seconds under operation `op`; the expiry.
    pub fn renew(&mut self, held: &ModelClaim, op: &str, ttl: u64) -> Result<u64, ErrorCode> {
        if !self.current(held) {
            return Err(ErrorCode::Conflict);
        }
        let key = RenewKey {
            run: held.run,
            epoch: held.epoch,
            generation: held.generation,
            ttl,
        };
        if let Some((bound, expires)) = self.renewals.get(op) {
            if *bound != key || *expires <= self.now {
                return Err(ErrorCode::Conflict);
            }
            return Ok(*expires);
        }
        let now = self.now;
        let claim = self.claim.as_mut().expect("current");
        if now >= claim.expires {
            return Err(ErrorCode::Conflict);
        }
        claim.expires = now + ttl;
        self.renewals.insert(op.to_owned(), (key, now + ttl));
        Ok(now + ttl)
    }

    /// A file operation on the production path (§4.4 validation on one read, then the
    /// admission write from that observation, §5.2), answered by the executor as `answer`.
    pub fn execute(&mut self, held: &ModelClaim, answer: ExecutorAnswer) -> Result<(), ErrorCode> {
        self.validate(held)?;
        self.admit()?;
        match answer {
            ExecutorAnswer::Succeed => Ok(()),
            ExecutorAnswer::Refuse => Err(ErrorCode::NotFound),
            ExecutorAnswer::Break => {
                self.record_in_flight();
                self.fenced = true;
                Err(ErrorCode::FenceUnknown)
            }
        }
    }

    /// ValidateRunClaim (§4.4), in its order.
    pub fn validate(&self, held: &ModelClaim) -> Result<(), ErrorCode> {
        if !(self.current(held) && self.live_claim()) {
            return Err(ErrorCode::Conflict);
        }
        if !self.published("b1") || !self.ready || self.fenced {
            return Err(ErrorCode::NotReady);
        }
        Ok(())
    }

    /// The admission's gates after a passed validation: only an operation already in
    /// flight can refuse it (a lifecycle admission ends every claim first).
    fn admit(&self) -> Result<(), ErrorCode> {
        if self.lifecycle.is_some() {
            return Err(ErrorCode::NotReady);
        }
        if self.in_flight.is_some() {
            return Err(ErrorCode::Conflict);
        }
        Ok(())
    }

    /// An admission write landed: the operation is on record with its lease.
    pub fn record_in_flight(&mut self) {
        self.in_flight = Some(self.now + OPERATION_TTL);
    }

    /// The reconciler's expiry fence (§5.4): an operation whose lease lapsed is fenced and
    /// the environment is no longer Ready. Whether it applies now.
    pub fn fence_expired(&mut self) -> bool {
        match self.in_flight {
            Some(expires) if self.now >= expires && !self.fenced => {
                self.fenced = true;
                self.ready = false;
                true
            }
            _ => false,
        }
    }

    /// Attach (§3.3) through `binding`: validation only.
    pub fn attach(&self, binding: &str) -> Result<(), ErrorCode> {
        if !self.ready || self.fenced {
            return Err(ErrorCode::NotReady);
        }
        match self.references.get(binding).map(|r| r.state) {
            Some(RefState::PendingCreate | RefState::Published) => Ok(()),
            _ => Err(ErrorCode::NotFound),
        }
    }

    /// EnsureTemplate replayed by `b1` with operation `op` (§3.1): the environment exists,
    /// so only a record of that very operation answers it.
    pub fn ensure_replay(&self, op: &str) -> Result<(), ErrorCode> {
        match self.references.get("b1") {
            Some(r) if r.op == op && r.state != RefState::PendingDelete => Ok(()),
            _ => Err(ErrorCode::Conflict),
        }
    }

    /// EnsureTemplate of the second template by `binding` (§3.1, the capacity ledger): a
    /// replay answers the same environment; a new one needs a free slot.
    pub fn ensure_pair(&mut self, binding: &str) -> Result<(), ErrorCode> {
        if self.allocations.contains(binding) {
            return Ok(());
        }
        if self.allocations.len() >= PAIR_CAPACITY {
            return Err(ErrorCode::ResourceExhausted);
        }
        self.allocations.insert(binding.to_owned());
        Ok(())
    }

    /// RecoverEnvironment naming `named` (§7.8): clears the fence only on proof that the
    /// exact Pod terminated.
    pub fn recover(&mut self, op: &str, named: &Identity) -> Result<(), ErrorCode> {
        if *named != self.identity() {
            return Err(ErrorCode::Conflict);
        }
        if self
            .proof
            .as_ref()
            .is_some_and(|(o, id)| o == op && id == named)
        {
            return Ok(());
        }
        if !self.fenced {
            return Err(ErrorCode::Conflict);
        }
        if !self.pod_terminal {
            return Err(ErrorCode::FenceUnknown);
        }
        self.proof = Some((op.to_owned(), named.clone()));
        self.in_flight = None;
        self.claim = None;
        self.fenced = false;
        Ok(())
    }

    /// RevokeEnvironment (§7.7, DECISIONS 10).
    pub fn revoke(&mut self, expected: u64, op: u8) -> Result<u64, ErrorCode> {
        if let Some((exp, next)) = self.receipts.get(&op) {
            return if *exp == expected {
                Ok(*next)
            } else {
                Err(ErrorCode::Conflict)
            };
        }
        if expected != self.generation {
            return Err(ErrorCode::Conflict);
        }
        self.generation += 1;
        self.claim = None;
        self.receipts.insert(op, (expected, self.generation));
        Ok(self.generation)
    }
}

/// Reference intents (§6).
impl Model {
    fn mutation_gates(&self) -> Result<(), ErrorCode> {
        if self.lifecycle.is_some() {
            return Err(ErrorCode::NotReady);
        }
        Ok(())
    }

    /// The exact transition of §6.2: `to == None` removes the record.
    pub fn transition(
        &mut self,
        binding: &str,
        op: &str,
        from: RefState,
        to: Option<RefState>,
    ) -> Result<(), ErrorCode> {
        self.mutation_gates()?;
        let Some(record) = self.references.get_mut(binding) else {
            return if to.is_none() {
                Ok(())
            } else {
                Err(ErrorCode::NotFound)
            };
        };
        if record.op != op {
            return Err(ErrorCode::Conflict);
        }
        match to {
            Some(state) if record.state == state => Ok(()),
            _ if record.state != from => Err(ErrorCode::Conflict),
            Some(state) => {
                record.state = state;
                Ok(())
            }
            None => {
                self.references.remove(binding);
                Ok(())
            }
        }
    }

    /// PrepareReferenceDelete (§6.3).
    pub fn prepare_delete(&mut self, binding: &str, op: &str) -> Result<(), ErrorCode> {
        self.mutation_gates()?;
        let record = self
            .references
            .get_mut(binding)
            .ok_or(ErrorCode::NotFound)?;
        match record.state {
            RefState::PendingDelete if record.op == op => Ok(()),
            RefState::Published => {
                record.state = RefState::PendingDelete;
                record.op = op.to_owned();
                Ok(())
            }
            _ => Err(ErrorCode::Conflict),
        }
    }

    /// ReserveSuccessor (§6.4; a replay is recognized before quiescence, §14.11).
    pub fn reserve(&mut self, source: &str, destination: &str, op: &str) -> Result<(), ErrorCode> {
        self.mutation_gates()?;
        if !self.published(source) {
            return Err(ErrorCode::NotFound);
        }
        if let Some(existing) = self.references.get(destination) {
            let replay = existing.state == RefState::PendingCreate
                && existing.op == op
                && existing.source.as_deref() == Some(source);
            return if replay {
                Ok(())
            } else {
                Err(ErrorCode::Conflict)
            };
        }
        if self.in_flight.is_some() || self.fenced || self.live_claim() {
            return Err(ErrorCode::Conflict);
        }
        self.claim = None;
        self.references.insert(
            destination.to_owned(),
            Record {
                state: RefState::PendingCreate,
                op: op.to_owned(),
                source: Some(source.to_owned()),
            },
        );
        Ok(())
    }

    /// ReleaseReference (§3.2).
    pub fn release_reference(&mut self, binding: &str) -> Result<(), ErrorCode> {
        self.mutation_gates()?;
        match self.references.get(binding) {
            None => Ok(()),
            Some(r) if r.state != RefState::Published => Err(ErrorCode::Conflict),
            Some(_) => {
                self.references.remove(binding);
                Ok(())
            }
        }
    }

    /// Every record, by binding: (binding, state, operation id, source binding).
    pub fn records(&self) -> Vec<(String, RefState, String, Option<String>)> {
        self.references
            .iter()
            .map(|(b, r)| (b.clone(), r.state, r.op.clone(), r.source.clone()))
            .collect()
    }

    /// What ListReferenceIntents reports: every non-Published record, by binding.
    pub fn intents(&self) -> Vec<(String, RefState, String)> {
        self.references
            .iter()
            .filter(|(_, r)| r.state != RefState::Published)
            .map(|(b, r)| (b.clone(), r.state, r.op.clone()))
            .collect()
    }
}

/// Admin lifecycle admission (§7.3, §7.6). The environment is not Ready only while a
/// lifecycle runs or once it is retired, so admission never needs a fresh terminal proof.
impl Model {
    /// ReplaceExecutor / RetireEnvironment admission naming `named`.
    pub fn start_lifecycle(
        &mut self,
        kind: Kind,
        op: &str,
        named: &Identity,
    ) -> Result<(), ErrorCode> {
        let receipt = self
            .last_replacement
            .as_ref()
            .is_some_and(|(o, before)| o == op && before == named);
        if kind == Kind::Replace && receipt {
            return Ok(());
        }
        if *named != self.identity() {
            return Err(ErrorCode::Conflict);
        }
        if self.retired {
            // The proof pre-step passes (Retired); only an exact retirement replay succeeds.
            let replay = kind == Kind::Retire
                && self
                    .proof
                    .as_ref()
                    .is_some_and(|(o, id)| o == op && id == named);
            return if replay {
                Ok(())
            } else {
                Err(ErrorCode::Conflict)
            };
        }
        if let Some((admitted, admitted_op)) = &self.lifecycle {
            // The identity is exact (checked above) and cannot change while it runs.
            let replay = *admitted == kind && admitted_op == op;
            return if replay {
                Ok(())
            } else {
                Err(ErrorCode::Conflict)
            };
        }
        // Idle and healthy: no live claim, nothing in flight, no fence.
        if self.live_claim() || self.in_flight.is_some() || self.fenced {
            return Err(ErrorCode::Conflict);
        }
        // Not Ready (the reconciler fenced it, then it was recovered): admission needs a
        // durable proof that this exact Pod terminated, written first when it is observed.
        if !self.ready && self.proof.as_ref().is_none_or(|(_, id)| id != named) {
            if !self.pod_terminal {
                return Err(ErrorCode::Conflict);
            }
            self.proof = Some((op.to_owned(), named.clone()));
        }
        if kind == Kind::Retire && !self.references.is_empty() {
            return Err(ErrorCode::Conflict);
        }
        self.claim = None;
        self.lifecycle = Some((kind, op.to_owned()));
        self.ready = false;
        Ok(())
    }

    /// DeleteRetiredEnvironment admission (§7.6).
    pub fn delete_retired(&mut self, op: &str) -> Result<(), ErrorCode> {
        if let Some((kind, existing)) = &self.lifecycle {
            let replay = *kind == Kind::DeleteRetired && existing == op;
            return if replay {
                Ok(())
            } else {
                Err(ErrorCode::Conflict)
            };
        }
        let safe = self.references.is_empty()
            && self.claim.is_none()
            && self.in_flight.is_none()
            && self.retired;
        if !safe {
            return Err(ErrorCode::Conflict);
        }
        self.lifecycle = Some((Kind::DeleteRetired, op.to_owned()));
        Ok(())
    }

    /// The reconciler completes an admitted replacement or retirement (§7.4). Returns what
    /// completed, if anything.
    pub fn finish_lifecycle(&mut self, new_pod_uid: &str) -> Option<Kind> {
        let (kind, op) = self.lifecycle.clone()?;
        match kind {
            Kind::Replace => {
                self.last_replacement = Some((op, self.identity()));
                self.epoch += 1;
                self.pod_uid = new_pod_uid.to_owned();
                self.pod_terminal = false;
                self.ready = true;
            }
            Kind::Retire => {
                self.proof = Some((op, self.identity()));
                self.retired = true;
            }
            Kind::DeleteRetired => return None,
        }
        self.lifecycle = None;
        Some(kind)
    }
}
