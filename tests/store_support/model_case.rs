//! The driver of `tests/store_model.rs`: the random actions, and one test world (an
//! environment with its real executor Pod and PVC objects, two store replicas behind the
//! interleaving gate and the fault layer, the claims each run holds and the reference model)
//! that runs each action against the real store and the model, plays the reconciler where
//! the lifecycle needs it, and compares the whole durable state with the model.
//!
//! An action is one step, alone or with one injected API fault on its n-th environment write
//! (a 409, a 500, a request lost before it lands, an answer lost after the write landed), or
//! two steps of two callers on the two replicas run concurrently, their API requests
//! interleaved by a seed. A fault that fired is judged by what it means: a 409 is retried by
//! the store's compare-and-swap and changes nothing; a failure before the write lands leaves
//! the model as it was and answers `internal`; a lost answer leaves the model as if the step
//! succeeded; in a dispatch, whatever may have landed fences (DECISIONS 11). Two concurrent
//! steps must answer and leave the state as one of their two serial orders does.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, FenceState, LastReplacement, ObjectIdentity,
    ReferenceState, RfcTime, TerminalPodPhase, TerminationProof, condition,
};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::naming::allocation_name;
use execution_provider::store::{Caller, ClaimContext, EnvRef, RunClaim, Store, StoreError};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaim,
    Pod, PodSpec, PodStatus,
};
use kube::api::{Api, ObjectMeta, PostParams};
use proptest::prelude::*;

use crate::model::{BINDINGS, ExecutorAnswer, Identity, Kind, Model, ModelClaim, RefState, TTL};
use crate::store_support::*;

#[derive(Debug, Clone, Copy)]
pub(crate) enum RefOp {
    Commit,
    Abort,
    Prepare,
    Confirm,
    Cancel,
    Release,
}

/// One step of one caller.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    Acquire {
        replica: usize,
        run: u8,
        op: u8,
    },
    Renew {
        replica: usize,
        run: u8,
        op: u8,
        ttl: u64,
    },
    Release {
        replica: usize,
        run: u8,
    },
    Execute {
        replica: usize,
        run: u8,
        answer: ExecutorAnswer,
    },
    Attach {
        binding: u8,
    },
    EnsureReplay {
        op: u8,
    },
    EnsurePair {
        binding: u8,
    },
    Revoke {
        stale: bool,
        op: u8,
    },
    ForeignAcquire,
    Advance {
        secs: u64,
    },
    Reserve {
        source: u8,
        skip: u8,
        op: u8,
    },
    Reference {
        what: RefOp,
        binding: u8,
        op: u8,
    },
    Lifecycle {
        kind: Kind,
        stale: bool,
        op: u8,
    },
    Recover {
        stale: bool,
        op: u8,
    },
    ExecutorDies,
    ReconcilerFences,
    ReconcilerFinishes,
}

/// An API fault injected into one environment write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApiFault {
    /// 409: another writer won; the compare-and-swap starts over.
    Conflict,
    /// 500: the server refused; nothing landed.
    Error,
    /// The request is lost before it lands.
    LostBefore,
    /// The write lands and its answer is lost.
    LostAfter,
}

impl ApiFault {
    fn injected(self) -> Fault {
        match self {
            ApiFault::Conflict => Fault::StatusWith(409, "Conflict", "injected conflict"),
            ApiFault::Error => Fault::StatusWith(500, "InternalError", "injected failure"),
            ApiFault::LostBefore => Fault::Transport,
            ApiFault::LostAfter => Fault::LostAnswer,
        }
    }

    fn landed(self) -> bool {
        self == ApiFault::LostAfter
    }
}

/// What the test does next.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// One step; with a fault, on its `nth` environment write.
    One {
        step: Step,
        fault: Option<(ApiFault, usize)>,
    },
    /// Two steps on the two replicas at once, interleaved by `seed` at API-call granularity.
    Both { a: Step, b: Step, seed: u64 },
}

fn ref_op() -> impl Strategy<Value = RefOp> {
    prop_oneof![
        Just(RefOp::Commit),
        Just(RefOp::Abort),
        Just(RefOp::Prepare),
        Just(RefOp::Confirm),
        Just(RefOp::Cancel),
        Just(RefOp::Release),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Replace),
        Just(Kind::Retire),
        Just(Kind::DeleteRetired)
    ]
}

fn answer() -> impl Strategy<Value = ExecutorAnswer> {
    prop_oneof![
        6 => Just(ExecutorAnswer::Succeed),
        1 => Just(ExecutorAnswer::Refuse),
        1 => Just(ExecutorAnswer::Break),
    ]
}

fn api_fault() -> impl Strategy<Value = ApiFault> {
    prop_oneof![
        Just(ApiFault::Conflict),
        Just(ApiFault::Error),
        Just(ApiFault::LostBefore),
        Just(ApiFault::LostAfter),
    ]
}

/// The steps that are one compare-and-swap (or one read) each, which two callers may race.
fn atomic_step(replica: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2u8, 0..3u8).prop_map(move |(run, op)| Step::Acquire { replica, run, op }),
        2 => (0..2u8, 0..3u8, prop_oneof![Just(30u64), Just(60), Just(120)])
            .prop_map(move |(run, op, ttl)| Step::Renew { replica, run, op, ttl }),
        1 => (0..2u8).prop_map(move |run| Step::Release { replica, run }),
        1 => (0..3u8).prop_map(|binding| Step::Attach { binding }),
        1 => (any::<bool>(), 0..2u8).prop_map(|(stale, op)| Step::Revoke { stale, op }),
        2 => (0..3u8, 0..2u8, 0..2u8).prop_map(|(source, skip, op)| Step::Reserve {
            source,
            skip,
            op
        }),
        3 => (ref_op(), 0..3u8, 0..3u8).prop_map(|(what, binding, op)| Step::Reference {
            what,
            binding,
            op
        }),
        2 => (kind(), any::<bool>(), 0..2u8).prop_map(|(kind, stale, op)| Step::Lifecycle {
            kind,
            stale,
            op
        }),
    ]
}

pub(crate) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2usize, 0..2u8, 0..3u8).prop_map(|(replica, run, op)| Step::Acquire {
            replica,
            run,
            op
        }),
        2 => (0..2usize, 0..2u8, 0..3u8, prop_oneof![Just(30u64), Just(60), Just(120)])
            .prop_map(|(replica, run, op, ttl)| Step::Renew { replica, run, op, ttl }),
        1 => (0..2usize, 0..2u8).prop_map(|(replica, run)| Step::Release { replica, run }),
        4 => (0..2usize, 0..2u8, answer()).prop_map(|(replica, run, answer)| Step::Execute {
            replica,
            run,
            answer
        }),
        1 => (0..3u8).prop_map(|binding| Step::Attach { binding }),
        1 => (0..3u8).prop_map(|op| Step::EnsureReplay { op }),
        1 => (0..3u8).prop_map(|binding| Step::EnsurePair { binding }),
        1 => (any::<bool>(), 0..2u8).prop_map(|(stale, op)| Step::Revoke { stale, op }),
        1 => Just(Step::ForeignAcquire),
        2 => (0..90u64).prop_map(|secs| Step::Advance { secs }),
        2 => (0..3u8, 0..2u8, 0..2u8).prop_map(|(source, skip, op)| Step::Reserve {
            source,
            skip,
            op
        }),
        4 => (ref_op(), 0..3u8, 0..3u8).prop_map(|(what, binding, op)| Step::Reference {
            what,
            binding,
            op
        }),
        2 => (kind(), any::<bool>(), 0..2u8).prop_map(|(kind, stale, op)| Step::Lifecycle {
            kind,
            stale,
            op
        }),
        1 => (any::<bool>(), 0..2u8).prop_map(|(stale, op)| Step::Recover { stale, op }),
        1 => Just(Step::ExecutorDies),
        1 => Just(Step::ReconcilerFences),
        1 => Just(Step::ReconcilerFinishes),
    ]
}

pub(crate) fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => step().prop_map(|step| Action::One { step, fault: None }),
        3 => (step(), api_fault(), 1..3usize).prop_map(|(step, fault, nth)| Action::One {
            step,
            fault: Some((fault, nth)),
        }),
        2 => (atomic_step(0), atomic_step(1), any::<u64>())
            .prop_map(|(a, b, seed)| Action::Both { a, b, seed }),
    ]
}

/// Reference operation ids: two fresh ones and the id that created `b1`.
pub(crate) fn ref_op_id(op: u8) -> String {
    match op {
        0 | 1 => format!("ref-{op}"),
        _ => CREATE_OP.to_owned(),
    }
}

pub(crate) const CREATE_OP: &str = "op-e";

/// The bindings that allocate from the second template (`pair`, capacity 2).
const PAIR_BINDINGS: [&str; 3] = ["p1", "p2", "p3"];

fn code<T>(r: &Result<T, StoreError>) -> Result<(), ErrorCode> {
    r.as_ref().map(|_| ()).map_err(|e| e.code())
}

fn ctx(c: &RunClaim) -> ClaimContext {
    ClaimContext {
        env: c.env.clone(),
        binding_id: c.binding_id.clone(),
        run_id: c.run_id.clone(),
        claim_id: c.claim_id.clone(),
        epoch: c.epoch,
        grant_generation: c.grant_generation,
    }
}

/// The wall time `secs` seconds after the world's origin.
fn at(secs: u64) -> SystemTime {
    origin() + Duration::from_secs(secs)
}

/// What the store answered to one step: the code, and what a caller keeps from it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub code: Result<(), ErrorCode>,
    /// A claim the step handed out (acquire, renew).
    claim: Option<RunClaim>,
    /// The expiry a renewal answered, or the generation a revocation answered.
    value: Option<u64>,
}

impl Answer {
    fn of<T>(r: &Result<T, StoreError>) -> Answer {
        Answer {
            code: code(r),
            claim: None,
            value: None,
        }
    }
}

/// What the model expects of one step: the code and, for a renewal or a revocation, the
/// value the store must answer.
type Expected = (Result<(), ErrorCode>, Option<u64>);

/// What a step's request names, fixed before it runs (two concurrent steps both name what
/// was current when they started): the admin identity and the expected generation.
#[derive(Debug, Clone)]
struct Params {
    named: Identity,
    expected_generation: u64,
}

/// One test world with its environment, the two replicas and the claims each run holds.
pub(crate) struct Case {
    world: World,
    gate: std::sync::Arc<Gate>,
    replicas: [Store; 2],
    caller: Caller,
    env: EnvRef,
    pvc_uid: String,
    held: BTreeMap<u8, (RunClaim, ModelClaim)>,
    model: Model,
    replacements: usize,
}

/// Creates an executor Pod named `name` (not terminal); its UID.
async fn create_pod(world: &World, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(world.server.client(NAMESPACE), NAMESPACE);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "executor".to_owned(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    pod.metadata.uid.expect("uid")
}

impl Case {
    pub(crate) async fn new() -> Case {
        let world = World::new().await;
        let gate = Gate::new();
        let replicas = [
            world.gated_store(gate.clone(), 0),
            world.gated_store(gate.clone(), 1),
        ];
        let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", CREATE_OP);
        let a = replicas[0].ensure_template(&req).await.expect("ensure");
        replicas[0]
            .commit_reference(&a.env, &req.caller, "b1", CREATE_OP)
            .await
            .expect("commit");
        world.make_ready(&a.env.id).await;
        // The real runtime objects, so that a recovery can observe the exact Pod end.
        let pod_name = format!("executor-{}", a.env.id);
        let pod_uid = create_pod(&world, &pod_name).await;
        let pvcs: Api<PersistentVolumeClaim> =
            Api::namespaced(world.server.client(NAMESPACE), NAMESPACE);
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(format!("workspace-{}", a.env.id)),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        let pvc_uid = pvcs
            .create(&PostParams::default(), &pvc)
            .await
            .expect("pvc")
            .metadata
            .uid
            .expect("uid");
        let api = world.environments();
        let mut o = api.get(&a.env.id).await.expect("environment");
        let status = o.status.as_mut().expect("status");
        status.pod = Some(ObjectIdentity {
            name: pod_name,
            uid: pod_uid.clone(),
        });
        status.pvc = Some(ObjectIdentity {
            name: format!("workspace-{}", a.env.id),
            uid: pvc_uid.clone(),
        });
        api.replace_status(&a.env.id, &PostParams::default(), &o)
            .await
            .expect("runtime identity");
        let model = Model::new(CREATE_OP, &pod_uid);
        Case {
            world,
            gate,
            replicas,
            caller: req.caller,
            env: a.env,
            pvc_uid,
            held: BTreeMap::new(),
            model,
            replacements: 0,
        }
    }

    fn admin(&self, named: &Identity, op: String) -> AdminRequest {
        AdminRequest {
            env: self.env.clone(),
            owner_hash: self.caller.owner_hash.clone(),
            actor: CLIENT.to_owned(),
            administrator_for: Vec::new(),
            expected_epoch: named.epoch,
            expected_pod_uid: named.pod_uid.clone(),
            expected_pvc_uid: self.pvc_uid.clone(),
            operation_id: op,
        }
    }

    /// What `step` names, from the model as it is now.
    fn params(&self, step: &Step) -> Params {
        let stale = match step {
            Step::Lifecycle { stale, .. }
            | Step::Recover { stale, .. }
            | Step::Revoke { stale, .. } => *stale,
            _ => false,
        };
        Params {
            named: self.named(stale),
            expected_generation: self.revocation_expected(stale),
        }
    }

    /// The identity an admin step names: the current one, or a stale one.
    fn named(&self, stale: bool) -> Identity {
        match (&self.model.last_replacement, stale) {
            (Some((_, before)), true) => before.clone(),
            (None, true) => Identity {
                epoch: self.model.epoch + 1,
                ..self.model.identity()
            },
            (_, false) => self.model.identity(),
        }
    }

    fn acquire_request(&self, run: u8, op: u8) -> AcquireRequest {
        AcquireRequest {
            env: self.env.clone(),
            caller: self.caller.clone(),
            binding_id: "b1".to_owned(),
            run_id: format!("run-{run}"),
            operation_id: format!("op-{run}-{op}"),
            ttl: Duration::from_secs(TTL),
        }
    }
}

/// The world-level steps: no store call a fault or a second caller could meet.
fn is_world_step(step: &Step) -> bool {
    matches!(
        step,
        Step::Advance { .. }
            | Step::ExecutorDies
            | Step::ReconcilerFences
            | Step::ReconcilerFinishes
    )
}

impl Case {
    /// Runs `action`; `None` when it does not apply. Returns the answers of its steps.
    pub(crate) async fn run(
        &mut self,
        action: &Action,
    ) -> Result<Option<Vec<Result<(), ErrorCode>>>, TestCaseError> {
        match action {
            Action::One { step, fault } => {
                if !self.applies(step) {
                    return Ok(None);
                }
                if is_world_step(step) {
                    self.world_step(step).await;
                    return Ok(Some(vec![Ok(())]));
                }
                let fault = fault.filter(|_| !matches!(step, Step::EnsurePair { .. }));
                Ok(Some(vec![self.one(step, fault).await?]))
            }
            Action::Both { a, b, seed } => {
                if !(self.applies(a) && self.applies(b)) {
                    return Ok(None);
                }
                Ok(Some(self.both(a, b, *seed).await?))
            }
        }
    }

    /// A step on a run's claim applies only once that run holds one.
    fn applies(&self, step: &Step) -> bool {
        match step {
            Step::Renew { run, .. } | Step::Release { run, .. } | Step::Execute { run, .. } => {
                self.held.contains_key(run)
            }
            _ => true,
        }
    }

    /// One step, with an optional fault on its `nth` environment write.
    async fn one(
        &mut self,
        step: &Step,
        fault: Option<(ApiFault, usize)>,
    ) -> Result<Result<(), ErrorCode>, TestCaseError> {
        if let Step::Execute { answer, .. } = step {
            self.world.executor.push(match answer {
                ExecutorAnswer::Succeed => Script::Succeed,
                ExecutorAnswer::Refuse => {
                    Script::Refuse(execution_provider::executor::ErrorCode::NotFound)
                }
                ExecutorAnswer::Break => Script::Break,
            });
        }
        let params = self.params(step);
        let before = self.model.clone();
        let expected = self.expect(step, &params);
        let fired_before = self.world.faults.lock().expect("faults").fired;
        if let Some((fault, nth)) = fault {
            self.world
                .fail_write(nth, fault.injected(), "executionenvironments");
        }
        let real = self.call(0, step, &params).await;
        self.world.clear_faults();
        self.world.executor.script.lock().expect("script").clear();
        let fired = self.world.faults.lock().expect("faults").fired > fired_before;
        let expected = match fault {
            Some((fault, nth)) if fired && fault != ApiFault::Conflict => {
                self.faulted(step, &before, expected, fault, nth)?
            }
            _ => expected,
        };
        let claim = self.model.claim.clone();
        self.judge(step, &real, &expected, claim)?;
        Ok(real.code)
    }

    /// What a fired fault (not a 409) makes of the fault-free expectation `expected`; resets
    /// the model to `before` plus whatever landed.
    fn faulted(
        &mut self,
        step: &Step,
        before: &Model,
        expected: Expected,
        fault: ApiFault,
        nth: usize,
    ) -> Result<Expected, TestCaseError> {
        if let Step::Lifecycle { op, .. } = step {
            // On a not-Ready environment the admission's pre-step writes the termination
            // proof first (write 1); the admission is write 2.
            let proof_first = self.model.proof != before.proof
                && self
                    .model
                    .proof
                    .as_ref()
                    .is_some_and(|(o, _)| *o == format!("admin-{op}"));
            if proof_first {
                let mut proved = before.clone();
                proved.proof = self.model.proof.clone();
                self.model = match (nth, fault.landed()) {
                    (1, false) => before.clone(),
                    (1, true) | (_, false) => proved,
                    (_, true) => self.model.clone(),
                };
                return Ok((Err(ErrorCode::Internal), None));
            }
        }
        let Step::Execute { .. } = step else {
            prop_assert!(nth == 1, "{:?} wrote more than once: {:?}", step, fault);
            prop_assert!(
                expected.0.is_ok(),
                "the store wrote where the model refuses ({:?}): {:?}",
                expected,
                step
            );
            if !fault.landed() {
                self.model = before.clone();
            }
            return Ok((Err(ErrorCode::Internal), None));
        };
        // A dispatch: write 1 is the admission, write 2 the completion.
        let admitted = {
            let mut m = before.clone();
            m.record_in_flight();
            m
        };
        Ok(match (nth, fault.landed()) {
            // The admission did not land: nothing is on record to fence.
            (1, false) => {
                self.model = before.clone();
                (Err(ErrorCode::Internal), None)
            }
            // The admission landed unanswered: it is fenced at once, nothing dispatched.
            (1, true) => {
                self.model = admitted;
                self.model.fenced = true;
                (Err(ErrorCode::Internal), None)
            }
            // The completion did not land: the operation stays on record, unfenced until
            // its lease lapses (the reconciler's expiry fence).
            (_, false) => {
                self.model = admitted;
                (Err(ErrorCode::FenceUnknown), None)
            }
            // The completion landed unanswered: its effect stands, the caller cannot know.
            (_, true) => (Err(ErrorCode::FenceUnknown), None),
        })
    }

    /// The model's expectation of `step`, applied to the model.
    fn expect(&mut self, step: &Step, params: &Params) -> Expected {
        let held = |run: &u8| self.held.get(run).map(|(_, m)| m.clone());
        match step.clone() {
            Step::Acquire { run, op, .. } => (self.model.acquire(run, op), None),
            Step::Renew { run, op, ttl, .. } => {
                let m = held(&run).expect("held");
                match self.model.renew(&m, &format!("renew-{op}"), ttl) {
                    Ok(expires) => (Ok(()), Some(expires)),
                    Err(code) => (Err(code), None),
                }
            }
            Step::Release { run, .. } => (self.model.release(&held(&run).expect("held")), None),
            Step::Execute { run, answer, .. } => {
                let m = held(&run).expect("held");
                (self.model.execute(&m, answer), None)
            }
            Step::Attach { binding } => (self.model.attach(BINDINGS[usize::from(binding)]), None),
            Step::EnsureReplay { op } => (self.model.ensure_replay(&ensure_op(op)), None),
            Step::EnsurePair { binding } => (
                self.model.ensure_pair(PAIR_BINDINGS[usize::from(binding)]),
                None,
            ),
            Step::Revoke { op, .. } => match self.model.revoke(params.expected_generation, op) {
                Ok(next) => (Ok(()), Some(next)),
                Err(code) => (Err(code), None),
            },
            Step::ForeignAcquire => (Err(ErrorCode::NotFound), None),
            Step::Reserve { source, skip, op } => {
                let (source, destination) = reserve_pair(source, skip);
                (
                    self.model.reserve(source, destination, &ref_op_id(op)),
                    None,
                )
            }
            Step::Reference { what, binding, op } => {
                (self.model_reference(what, binding, op), None)
            }
            Step::Lifecycle { kind, op, .. } => {
                let named = params.named.clone();
                let op = format!("admin-{op}");
                let r = match kind {
                    Kind::DeleteRetired => self.model.delete_retired(&op),
                    _ => self.model.start_lifecycle(kind, &op, &named),
                };
                (r, None)
            }
            Step::Recover { op, .. } => (
                self.model.recover(&format!("recover-{op}"), &params.named),
                None,
            ),
            Step::Advance { .. }
            | Step::ExecutorDies
            | Step::ReconcilerFences
            | Step::ReconcilerFinishes => (Ok(()), None),
        }
    }

    fn revocation_expected(&self, stale: bool) -> u64 {
        let generation = self.model.generation;
        if stale && generation > 1 {
            generation - 1
        } else {
            generation
        }
    }

    fn model_reference(&mut self, what: RefOp, binding: u8, op: u8) -> Result<(), ErrorCode> {
        let binding = BINDINGS[usize::from(binding)];
        let op = ref_op_id(op);
        let model = &mut self.model;
        match what {
            RefOp::Commit => model.transition(
                binding,
                &op,
                RefState::PendingCreate,
                Some(RefState::Published),
            ),
            RefOp::Abort => model.transition(binding, &op, RefState::PendingCreate, None),
            RefOp::Prepare => model.prepare_delete(binding, &op),
            RefOp::Confirm => model.transition(binding, &op, RefState::PendingDelete, None),
            RefOp::Cancel => model.transition(
                binding,
                &op,
                RefState::PendingDelete,
                Some(RefState::Published),
            ),
            RefOp::Release => model.release_reference(binding),
        }
    }

    /// The store's answer to `step`, as caller `caller` (which picks the replica of steps
    /// that name none). Reads only `self`; the model is not touched.
    async fn call(&self, caller: usize, step: &Step, params: &Params) -> Answer {
        let (env, me) = (&self.env, &self.caller);
        let replica = |r: usize| &self.replicas[r];
        let any = &self.replicas[caller];
        match step.clone() {
            Step::Acquire {
                replica: r,
                run,
                op,
            } => {
                let r = replica(r).acquire_run(&self.acquire_request(run, op)).await;
                Answer {
                    code: code(&r),
                    claim: r.ok(),
                    value: None,
                }
            }
            Step::Renew {
                replica: r,
                run,
                op,
                ttl,
            } => {
                let (c, _) = &self.held[&run];
                let r = replica(r)
                    .renew_run(
                        me,
                        &ctx(c),
                        &format!("renew-{op}"),
                        Duration::from_secs(ttl),
                    )
                    .await;
                Answer {
                    code: code(&r),
                    value: r.as_ref().ok().map(|c| {
                        c.expires_at
                            .duration_since(origin())
                            .expect("after the origin")
                            .as_secs()
                    }),
                    claim: r.ok(),
                }
            }
            Step::Release { replica: r, run } => {
                let (c, _) = &self.held[&run];
                Answer::of(&replica(r).release_run(me, &ctx(c)).await)
            }
            Step::Execute {
                replica: r, run, ..
            } => {
                // The production path: validation on one read, then the dispatch from it.
                let (c, _) = &self.held[&run];
                let store = replica(r);
                let r = match store.validate_run_claim(me, &ctx(c)).await {
                    Ok(validated) => store.execute_validated(validated, stat("f")).await,
                    Err(refused) => Err(refused),
                };
                Answer::of(&r)
            }
            Step::Attach { binding } => {
                let binding = BINDINGS[usize::from(binding)];
                Answer::of(&any.attach(env, me, binding).await)
            }
            Step::EnsureReplay { op } => {
                let req =
                    ensure_request(&self.world, CLIENT, "alice", "b1", "roomy", &ensure_op(op));
                Answer::of(&any.ensure_template(&req).await)
            }
            Step::EnsurePair { binding } => {
                let binding = PAIR_BINDINGS[usize::from(binding)];
                let req = ensure_request(&self.world, CLIENT, "alice", binding, "pair", "op-p");
                Answer::of(&any.ensure_template(&req).await)
            }
            Step::Revoke { op, .. } => {
                let q = self.admin(&params.named, format!("rev-{op}"));
                let r = any.revoke_environment(&q, params.expected_generation).await;
                Answer {
                    code: code(&r),
                    claim: None,
                    value: r.ok(),
                }
            }
            Step::ForeignAcquire => {
                let r = any
                    .acquire_run(&AcquireRequest {
                        caller: caller_of(OTHER_CLIENT, "alice"),
                        run_id: "intruder".to_owned(),
                        operation_id: "op-x".to_owned(),
                        ..self.acquire_request(0, 0)
                    })
                    .await;
                Answer::of(&r)
            }
            Step::Reserve { source, skip, op } => {
                let (source, destination) = reserve_pair(source, skip);
                let r = any
                    .reserve_successor(env, me, source, destination, &ref_op_id(op))
                    .await;
                Answer::of(&r)
            }
            Step::Reference { what, binding, op } => {
                let binding = BINDINGS[usize::from(binding)];
                let op = ref_op_id(op);
                let r = match what {
                    RefOp::Commit => any.commit_reference(env, me, binding, &op).await,
                    RefOp::Abort => any.abort_reference(env, me, binding, &op).await,
                    RefOp::Prepare => any.prepare_reference_delete(env, me, binding, &op).await,
                    RefOp::Confirm => any.confirm_reference_delete(env, me, binding, &op).await,
                    RefOp::Cancel => any.cancel_reference_delete(env, me, binding, &op).await,
                    RefOp::Release => any.release_reference(env, me, binding).await,
                };
                Answer::of(&r)
            }
            Step::Lifecycle { kind, op, .. } => {
                let q = self.admin(&params.named, format!("admin-{op}"));
                let r = match kind {
                    Kind::Replace => any.replace_executor(&q).await,
                    Kind::Retire => any.retire_environment(&q).await,
                    Kind::DeleteRetired => any.delete_retired_environment(&q).await,
                };
                Answer::of(&r)
            }
            Step::Recover { op, .. } => {
                let q = self.admin(&params.named, format!("recover-{op}"));
                Answer::of(&any.recover_environment(&q).await)
            }
            Step::Advance { .. }
            | Step::ExecutorDies
            | Step::ReconcilerFences
            | Step::ReconcilerFinishes => unreachable!("world steps make no store call"),
        }
    }

    /// Compares the store's answer with the expectation and keeps what the caller received.
    fn judge(
        &mut self,
        step: &Step,
        real: &Answer,
        expected: &Expected,
        model_claim: Option<ModelClaim>,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(&real.code, &expected.0, "answer of {:?}", step);
        if real.code.is_ok() && expected.1.is_some() {
            prop_assert_eq!(real.value, expected.1, "value answered by {:?}", step);
        }
        if let (Some(claim), Step::Acquire { run, .. } | Step::Renew { run, .. }) =
            (&real.claim, step)
        {
            let m = model_claim.expect("the model holds the claim it answered");
            prop_assert_eq!(claim.epoch, m.epoch, "claim epoch of {:?}", step);
            prop_assert_eq!(
                claim.grant_generation,
                m.generation,
                "claim generation of {:?}",
                step
            );
            self.held.insert(*run, (claim.clone(), m));
        }
        Ok(())
    }

    /// Two steps by callers 0 and 1 at once, interleaved by `seed`: the answers and the state
    /// must be those of one of the two serial orders.
    async fn both(
        &mut self,
        a: &Step,
        b: &Step,
        seed: u64,
    ) -> Result<Vec<Result<(), ErrorCode>>, TestCaseError> {
        let (pa, pb) = (self.params(a), self.params(b));
        self.gate.open(2, seed);
        let (ra, rb) = {
            let this = &*self;
            let gate = &this.gate;
            tokio::join!(
                async {
                    let r = this.call(0, a, &pa).await;
                    gate.finished(0);
                    r
                },
                async {
                    let r = this.call(1, b, &pb).await;
                    gate.finished(1);
                    r
                }
            )
        };
        let order = self.gate.close();
        let start = self.model.clone();
        let held = self.held.clone();
        let mut outcomes = Vec::new();
        for a_first in [true, false] {
            self.model = start.clone();
            self.held = held.clone();
            let mut serial = Vec::new();
            let steps = if a_first {
                [(a, &pa, &ra), (b, &pb, &rb)]
            } else {
                [(b, &pb, &rb), (a, &pa, &ra)]
            };
            for (step, params, real) in steps {
                let expected = self.expect(step, params);
                serial.push((step, real, expected, self.model.claim.clone()));
            }
            let answers_agree = serial.iter().all(|(_, real, expected, _)| {
                real.code == expected.0
                    && (real.code.is_err() || expected.1.is_none() || real.value == expected.1)
            });
            let state = self.compare_state().await;
            if answers_agree && state.is_ok() {
                // Keep what each caller received, in the serial order found.
                for (step, real, expected, claim) in serial {
                    self.judge(step, real, &expected, claim)?;
                }
                return Ok(vec![ra.code, rb.code]);
            }
            let answers: Vec<_> = serial.into_iter().map(|(_, _, e, _)| e).collect();
            outcomes.push((a_first, answers, state.err()));
        }
        Err(TestCaseError::fail(format!(
            "{a:?} and {b:?} under seed {seed} (request order {order:?}) answered {:?} and {:?}, \
             which no serial order gives (a first?, expected answers, state): {outcomes:?}",
            ra.code, rb.code
        )))
    }
}

/// The operation id of an allocation replay: the creating one, or another.
fn ensure_op(op: u8) -> String {
    match op {
        0 => CREATE_OP.to_owned(),
        n => format!("op-e{n}"),
    }
}

/// The source and destination bindings of a successor reservation.
fn reserve_pair(source: u8, skip: u8) -> (&'static str, &'static str) {
    let index = usize::from(source);
    let destination = BINDINGS[(index + 1 + usize::from(skip)) % BINDINGS.len()];
    (BINDINGS[index], destination)
}

fn condition_of(type_: &str, status: ConditionStatus, now: RfcTime) -> EnvironmentCondition {
    EnvironmentCondition {
        type_: type_.to_owned(),
        status,
        reason: "Reconciled".to_owned(),
        message: String::new(),
        observed_generation: 1,
        last_transition_time: now,
    }
}

impl Case {
    /// The world-level steps: time, the executor Pod's end, the reconciler's part.
    async fn world_step(&mut self, step: &Step) {
        match step {
            Step::Advance { secs } => {
                tokio::time::advance(Duration::from_secs(*secs)).await;
                self.model.now += secs;
            }
            Step::ExecutorDies => self.pod_terminates().await,
            Step::ReconcilerFences => {
                if self.model.fence_expired() {
                    let observed = self.world.get(&self.env.id).await;
                    self.world
                        .fence_expired_as_observed(&observed)
                        .await
                        .expect("the reconciler fences an expired operation");
                }
            }
            Step::ReconcilerFinishes => self.finish().await,
            _ => unreachable!("not a world step"),
        }
    }

    /// The current executor Pod reaches a terminal phase.
    async fn pod_terminates(&mut self) {
        let pods: Api<Pod> = Api::namespaced(self.world.server.client(NAMESPACE), NAMESPACE);
        let status = self.world.get(&self.env.id).await.status.expect("status");
        let name = status.pod.expect("pod").name;
        let mut pod = pods.get(&name).await.expect("pod");
        pod.status = Some(PodStatus {
            phase: Some("Failed".to_owned()),
            container_statuses: Some(vec![ContainerStatus {
                name: "executor".to_owned(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        pods.replace_status(&name, &PostParams::default(), &pod)
            .await
            .expect("terminal");
        self.model.pod_terminal = true;
    }

    /// Plays the reconciler's last phase of an admitted replacement (a new Pod) or
    /// retirement (§7.4).
    async fn finish(&mut self) {
        if !matches!(
            self.model.lifecycle,
            Some((Kind::Replace | Kind::Retire, _))
        ) {
            return;
        }
        let pod_name = format!("executor-{}-{}", self.env.id, self.replacements + 1);
        let new_pod_uid = match &self.model.lifecycle {
            Some((Kind::Replace, _)) => create_pod(&self.world, &pod_name).await,
            _ => String::new(),
        };
        let before = self.model.identity();
        let Some(kind) = self.model.finish_lifecycle(&new_pod_uid) else {
            return;
        };
        let api = self.world.environments();
        let mut o = api.get(&self.env.id).await.expect("environment");
        let now = RfcTime::from_system_time(self.world.clock_now());
        let pvc_uid = self.pvc_uid.clone();
        let status = o.status.as_mut().expect("status");
        let op = status.lifecycle_operation.take().expect("admitted").id;
        let set = |status: &mut execution_provider::kube::crd::ExecutionEnvironmentStatus,
                   type_: &str,
                   value: ConditionStatus| {
            status.conditions.retain(|c| c.type_ != type_);
            status.conditions.push(condition_of(type_, value, now));
        };
        match kind {
            Kind::Replace => {
                self.replacements += 1;
                let epoch = before.epoch + 1;
                status.epoch = Some(epoch);
                status.pod = Some(ObjectIdentity {
                    name: pod_name,
                    uid: new_pod_uid.clone(),
                });
                status.last_replacement = Some(LastReplacement {
                    operation_id: op,
                    previous_pod_uid: before.pod_uid,
                    replacement_pod_uid: new_pod_uid,
                    pvc_uid,
                    previous_epoch: before.epoch,
                    replacement_epoch: epoch,
                });
                set(status, condition::READY, ConditionStatus::True);
            }
            _ => {
                status.termination_proof = Some(TerminationProof {
                    operation_id: op,
                    pod_uid: before.pod_uid,
                    pvc_uid,
                    epoch: before.epoch,
                    pod_phase: TerminalPodPhase::Succeeded,
                    observed_at: now,
                });
                set(status, condition::READY, ConditionStatus::False);
                set(status, condition::RETIRED, ConditionStatus::True);
                set(
                    status,
                    condition::EXECUTOR_TERMINATED,
                    ConditionStatus::True,
                );
            }
        }
        api.replace_status(&self.env.id, &Default::default(), &o)
            .await
            .expect("reconciler write");
    }

    /// The whole durable state agrees with the model.
    pub(crate) async fn check_state(&self, i: usize) -> Result<(), TestCaseError> {
        self.compare_state()
            .await
            .map_err(|e| TestCaseError::fail(format!("after action {i}: {e}")))
    }

    /// Compares the whole observable state with the model: epoch, generation, fence state,
    /// the claim (id, run, operation, epoch, generation, expiry), the operation on record and
    /// its lease, every reference record, the revocation and renewal receipts, the lifecycle
    /// operation, the termination proof and replacement receipt, the listed intents, and the
    /// capacity ledger of both templates.
    async fn compare_state(&self) -> Result<(), String> {
        let m = &self.model;
        let status = self.world.get(&self.env.id).await.status.expect("status");
        let check = |what: &str, equal: bool, detail: String| {
            if equal {
                Ok(())
            } else {
                Err(format!("{what} differs: {detail}"))
            }
        };
        check(
            "epoch",
            status.epoch == Some(m.epoch),
            format!("{:?} vs {}", status.epoch, m.epoch),
        )?;
        check(
            "grant generation",
            status.grant_generation == Some(m.generation),
            format!("{:?} vs {}", status.grant_generation, m.generation),
        )?;
        let fence = if m.fenced {
            FenceState::FenceUnknown
        } else {
            FenceState::Healthy
        };
        check(
            "fence state",
            status.fence_state == Some(fence),
            format!("{:?} vs {fence:?}", status.fence_state),
        )?;
        let stored = status.active_run.as_ref();
        match (&m.claim, stored) {
            (None, None) => {}
            (Some(c), Some(run)) => {
                let issued = self
                    .held
                    .get(&c.run)
                    .filter(|(_, h)| h.epoch == c.epoch)
                    .map(|(rc, _)| rc.claim_id.clone());
                let expected = (
                    format!("run-{}", c.run),
                    format!("op-{}-{}", c.run, c.op),
                    c.epoch,
                    c.generation,
                    at(c.expires),
                );
                let actual = (
                    run.run_id.clone(),
                    run.operation_id.clone(),
                    run.epoch,
                    run.grant_generation,
                    run.expires_at.to_system_time(),
                );
                check(
                    "claim",
                    actual == expected,
                    format!("{actual:?} vs {expected:?}"),
                )?;
                if let Some(issued) = issued {
                    check(
                        "claim id",
                        run.claim_id == issued,
                        format!("{} vs the issued {issued}", run.claim_id),
                    )?;
                }
            }
            (model, store) => return Err(format!("claim differs: {store:?} vs {model:?}")),
        }
        let operation = status
            .active_operation
            .as_ref()
            .map(|o| o.expires_at.to_system_time());
        check(
            "operation on record",
            operation == m.in_flight.map(at),
            format!("{operation:?} vs {:?}", m.in_flight.map(at)),
        )?;
        let records: Vec<_> = status
            .references
            .iter()
            .map(|r| {
                let state = match r.state {
                    ReferenceState::PendingCreate => RefState::PendingCreate,
                    ReferenceState::Published => RefState::Published,
                    ReferenceState::PendingDelete => RefState::PendingDelete,
                };
                (
                    r.binding_id.clone(),
                    state,
                    r.operation_id.clone(),
                    r.source_binding_id.clone(),
                )
            })
            .collect();
        check(
            "references",
            records == m.records(),
            format!("{records:?} vs {:?}", m.records()),
        )?;
        let revocations: Vec<_> = status
            .revocation_receipts
            .iter()
            .map(|r| {
                (
                    r.operation_id.clone(),
                    r.expected_grant_generation,
                    r.grant_generation,
                )
            })
            .collect();
        let mut modelled: Vec<_> = m
            .receipts
            .iter()
            .map(|(op, (exp, next))| (format!("rev-{op}"), *exp, *next))
            .collect();
        modelled.sort_by_key(|r| r.2);
        check(
            "revocation receipts",
            revocations == modelled,
            format!("{revocations:?} vs {modelled:?}"),
        )?;
        let mut renewals: Vec<_> = status
            .renew_receipts
            .iter()
            .map(|r| (r.operation_id.clone(), r.expires_at.to_system_time()))
            .collect();
        renewals.sort();
        let modelled: Vec<_> = m
            .renewals
            .iter()
            .map(|(op, (_, expires))| (op.clone(), at(*expires)))
            .collect();
        check(
            "renewal receipts",
            renewals == modelled,
            format!("{renewals:?} vs {modelled:?}"),
        )?;
        let lifecycle = status.lifecycle_operation.as_ref().map(|l| l.id.clone());
        let modelled = m.lifecycle.as_ref().map(|(_, op)| op.clone());
        check(
            "lifecycle operation",
            lifecycle == modelled,
            format!("{lifecycle:?} vs {modelled:?}"),
        )?;
        let proof = status
            .termination_proof
            .as_ref()
            .map(|p| (p.operation_id.clone(), p.epoch, p.pod_uid.clone()));
        let modelled = m
            .proof
            .as_ref()
            .map(|(op, id)| (op.clone(), id.epoch, id.pod_uid.clone()));
        check(
            "termination proof",
            proof == modelled,
            format!("{proof:?} vs {modelled:?}"),
        )?;
        let replacement = status
            .last_replacement
            .as_ref()
            .map(|r| (r.operation_id.clone(), r.previous_epoch));
        let modelled = m
            .last_replacement
            .as_ref()
            .map(|(op, before)| (op.clone(), before.epoch));
        check(
            "replacement receipt",
            replacement == modelled,
            format!("{replacement:?} vs {modelled:?}"),
        )?;
        let listed = self.replicas[1]
            .list_reference_intents(&self.caller, 0)
            .await
            .map_err(|e| format!("list intents: {e}"))?;
        let listed: Vec<_> = listed
            .into_iter()
            .filter(|intent| intent.env == self.env)
            .map(|intent| {
                let state = match intent.record.state {
                    ReferenceState::PendingCreate => RefState::PendingCreate,
                    ReferenceState::Published => RefState::Published,
                    ReferenceState::PendingDelete => RefState::PendingDelete,
                };
                (intent.record.binding_id, state, intent.record.operation_id)
            })
            .collect();
        check(
            "listed intents",
            listed == m.intents(),
            format!("{listed:?} vs {:?}", m.intents()),
        )?;
        let roomy = self.world.ledger("roomy").await;
        check(
            "ledger of the environment's template",
            roomy == vec![self.env.id.clone()],
            format!("{roomy:?}"),
        )?;
        let pair = self.world.ledger("pair").await;
        let mut modelled: Vec<String> = m
            .allocations
            .iter()
            .map(|b| allocation_name(CLIENT, &self.caller.owner_hash, b))
            .collect();
        modelled.sort();
        check(
            "ledger of the second template",
            pair == modelled,
            format!("{pair:?} vs {modelled:?}"),
        )?;
        Ok(())
    }
}
