//! The driver of `tests/store_model.rs`: the random steps, and one test world (an
//! environment, two store replicas, the claims each run holds and the reference model) that
//! runs each step against the real store and the model, plays the reconciler where the
//! lifecycle needs it, and compares the durable state with the model.

use std::collections::BTreeMap;
use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, LastReplacement, ObjectIdentity, ReferenceState,
    RfcTime, TerminalPodPhase, TerminationProof, condition,
};
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::{Caller, ClaimContext, EnvRef, RunClaim, Store};
use proptest::prelude::*;

use crate::model::{BINDINGS, Identity, Kind, Model, ModelClaim, RefState, TTL};
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

#[derive(Debug, Clone)]
pub(crate) enum Step {
    Acquire { replica: usize, run: u8, op: u8 },
    Release { replica: usize, run: u8 },
    Execute { replica: usize, run: u8 },
    Revoke { stale: bool, op: u8 },
    ForeignAcquire,
    Advance { secs: u64 },
    Reserve { source: u8, skip: u8, op: u8 },
    Reference { what: RefOp, binding: u8, op: u8 },
    Lifecycle { kind: Kind, stale: bool, op: u8 },
    ReconcilerFinishes,
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

pub(crate) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2usize, 0..2u8, 0..3u8).prop_map(|(replica, run, op)| Step::Acquire {
            replica,
            run,
            op
        }),
        1 => (0..2usize, 0..2u8).prop_map(|(replica, run)| Step::Release { replica, run }),
        3 => (0..2usize, 0..2u8).prop_map(|(replica, run)| Step::Execute { replica, run }),
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
        1 => Just(Step::ReconcilerFinishes),
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

fn code<T>(r: &Result<T, execution_provider::store::StoreError>) -> Result<(), ErrorCode> {
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

/// One test world with its environment, the two replicas and the claims each run holds.
pub(crate) struct Case {
    world: World,
    replicas: [Store; 2],
    caller: Caller,
    env: EnvRef,
    held: BTreeMap<u8, (RunClaim, ModelClaim)>,
    model: Model,
    replacements: usize,
}

impl Case {
    pub(crate) async fn new() -> Case {
        let world = World::new().await;
        let replicas = [world.store(), world.store()];
        let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", CREATE_OP);
        let a = replicas[0].ensure_template(&req).await.expect("ensure");
        replicas[0]
            .commit_reference(&a.env, &req.caller, "b1", CREATE_OP)
            .await
            .expect("commit");
        world.make_ready(&a.env.id).await;
        let model = Model::new(CREATE_OP, &format!("pod-uid-{}", a.env.id));
        Case {
            world,
            replicas,
            caller: req.caller,
            env: a.env,
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
            expected_pvc_uid: format!("pvc-uid-{}", self.env.id),
            operation_id: op,
        }
    }
}

pub(crate) type Answers = (Result<(), ErrorCode>, Result<(), ErrorCode>);

impl Case {
    /// Runs `step` on the store and the model; `None` when the step does not apply.
    pub(crate) async fn apply(&mut self, step: &Step) -> Result<Option<Answers>, TestCaseError> {
        Ok(Some(match step.clone() {
            Step::Acquire { replica, run, op } => self.acquire(replica, run, op).await,
            Step::Release { replica, run } => {
                let Some((c, m)) = self.held.get(&run) else {
                    return Ok(None);
                };
                let r = self.replicas[replica]
                    .release_run(&self.caller, &ctx(c))
                    .await;
                (code(&r), self.model.release(&m.clone()))
            }
            Step::Execute { replica, run } => {
                let Some((c, m)) = self.held.get(&run) else {
                    return Ok(None);
                };
                let r = self.replicas[replica]
                    .execute(&self.caller, &ctx(c), stat("f"))
                    .await;
                (code(&r), self.model.execute(m))
            }
            Step::Revoke { stale, op } => self.revoke(stale, op).await?,
            Step::ForeignAcquire => {
                let r = self.replicas[1]
                    .acquire_run(&AcquireRequest {
                        env: self.env.clone(),
                        caller: caller_of(OTHER_CLIENT, "alice"),
                        binding_id: "b1".to_owned(),
                        run_id: "intruder".to_owned(),
                        operation_id: "op-x".to_owned(),
                        ttl: Duration::from_secs(TTL),
                    })
                    .await;
                (code(&r), Err(ErrorCode::NotFound))
            }
            Step::Advance { secs } => {
                tokio::time::advance(Duration::from_secs(secs)).await;
                self.model.now += secs;
                (Ok(()), Ok(()))
            }
            Step::Reserve { source, skip, op } => {
                let index = usize::from(source);
                let source = BINDINGS[index];
                let destination = BINDINGS[(index + 1 + usize::from(skip)) % BINDINGS.len()];
                let op = ref_op_id(op);
                let r = self.replicas[0]
                    .reserve_successor(&self.env, &self.caller, source, destination, &op)
                    .await;
                (code(&r), self.model.reserve(source, destination, &op))
            }
            Step::Reference { what, binding, op } => self.reference(what, binding, op).await,
            Step::Lifecycle { kind, stale, op } => self.lifecycle(kind, stale, op).await,
            Step::ReconcilerFinishes => {
                self.finish().await;
                (Ok(()), Ok(()))
            }
        }))
    }

    async fn acquire(&mut self, replica: usize, run: u8, op: u8) -> Answers {
        let r = self.replicas[replica]
            .acquire_run(&AcquireRequest {
                env: self.env.clone(),
                caller: self.caller.clone(),
                binding_id: "b1".to_owned(),
                run_id: format!("run-{run}"),
                operation_id: format!("op-{run}-{op}"),
                ttl: Duration::from_secs(TTL),
            })
            .await;
        let expected = self.model.acquire(run, op);
        if let (Ok(claim), Some(m)) = (&r, &self.model.claim) {
            self.held.insert(run, (claim.clone(), m.clone()));
        }
        (code(&r), expected)
    }

    async fn revoke(&mut self, stale: bool, op: u8) -> Result<Answers, TestCaseError> {
        let generation = self.model.generation;
        let expected_gen = if stale && generation > 1 {
            generation - 1
        } else {
            generation
        };
        let named = self.model.identity();
        let q = self.admin(&named, format!("rev-{op}"));
        let r = self.replicas[0].revoke_environment(&q, expected_gen).await;
        let m = self.model.revoke(expected_gen, op);
        prop_assert_eq!(r.as_ref().ok().copied(), m.ok(), "revocation generation");
        Ok((code(&r), m.map(|_| ())))
    }

    async fn reference(&mut self, what: RefOp, binding: u8, op: u8) -> Answers {
        let (store, env, caller) = (&self.replicas[1], &self.env, &self.caller);
        let binding = BINDINGS[usize::from(binding)];
        let op = ref_op_id(op);
        let model = &mut self.model;
        let (r, m) = match what {
            RefOp::Commit => (
                store.commit_reference(env, caller, binding, &op).await,
                model.transition(
                    binding,
                    &op,
                    RefState::PendingCreate,
                    Some(RefState::Published),
                ),
            ),
            RefOp::Abort => (
                store.abort_reference(env, caller, binding, &op).await,
                model.transition(binding, &op, RefState::PendingCreate, None),
            ),
            RefOp::Prepare => (
                store
                    .prepare_reference_delete(env, caller, binding, &op)
                    .await,
                model.prepare_delete(binding, &op),
            ),
            RefOp::Confirm => (
                store
                    .confirm_reference_delete(env, caller, binding, &op)
                    .await,
                model.transition(binding, &op, RefState::PendingDelete, None),
            ),
            RefOp::Cancel => (
                store
                    .cancel_reference_delete(env, caller, binding, &op)
                    .await,
                model.transition(
                    binding,
                    &op,
                    RefState::PendingDelete,
                    Some(RefState::Published),
                ),
            ),
            RefOp::Release => (
                store.release_reference(env, caller, binding).await,
                model.release_reference(binding),
            ),
        };
        (code(&r), m)
    }

    async fn lifecycle(&mut self, kind: Kind, stale: bool, op: u8) -> Answers {
        let named = match (&self.model.last_replacement, stale) {
            (Some((_, before)), true) => before.clone(),
            (None, true) => Identity {
                epoch: self.model.epoch + 1,
                ..self.model.identity()
            },
            (_, false) => self.model.identity(),
        };
        let op = format!("admin-{op}");
        let q = self.admin(&named, op.clone());
        let store = &self.replicas[0];
        let (r, m) = match kind {
            Kind::Replace => (
                store.replace_executor(&q).await,
                self.model.start_lifecycle(kind, &op, &named),
            ),
            Kind::Retire => (
                store.retire_environment(&q).await,
                self.model.start_lifecycle(kind, &op, &named),
            ),
            Kind::DeleteRetired => (
                store.delete_retired_environment(&q).await,
                self.model.delete_retired(&op),
            ),
        };
        (code(&r), m)
    }
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
    /// Plays the reconciler's last phase of an admitted replacement or retirement (§7.4).
    async fn finish(&mut self) {
        let new_pod_uid = format!("pod-uid-{}-{}", self.env.id, self.replacements + 1);
        let before = self.model.identity();
        let Some(kind) = self.model.finish_lifecycle(&new_pod_uid) else {
            return;
        };
        let api = self.world.environments();
        let mut o = api.get(&self.env.id).await.expect("environment");
        let now = RfcTime::from_system_time(self.world.clock_now());
        let pvc_uid = format!("pvc-uid-{}", self.env.id);
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
                    name: format!("executor-{}", self.env.id),
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

    /// The durable state agrees with the model.
    pub(crate) async fn check_state(&self, i: usize) -> Result<(), TestCaseError> {
        let status = self.world.get(&self.env.id).await.status.expect("status");
        prop_assert_eq!(
            status.epoch,
            Some(self.model.epoch),
            "epoch after step {}",
            i
        );
        prop_assert_eq!(
            status.grant_generation,
            Some(self.model.generation),
            "generation after step {}",
            i
        );
        prop_assert!(
            status.active_operation.is_none(),
            "no operation left behind"
        );
        prop_assert_eq!(
            status.lifecycle_operation.map(|l| l.id),
            self.model.lifecycle.as_ref().map(|(_, op)| op.clone()),
            "lifecycle after step {}",
            i
        );
        let listed = self.replicas[1]
            .list_reference_intents(&self.caller, 0)
            .await
            .expect("list intents");
        let listed: Vec<_> = listed
            .into_iter()
            .map(|intent| {
                let state = match intent.record.state {
                    ReferenceState::PendingCreate => RefState::PendingCreate,
                    ReferenceState::Published => RefState::Published,
                    ReferenceState::PendingDelete => RefState::PendingDelete,
                };
                (intent.record.binding_id, state, intent.record.operation_id)
            })
            .collect();
        prop_assert_eq!(listed, self.model.intents(), "intents after step {}", i);
        Ok(())
    }
}
