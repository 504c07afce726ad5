//! Model-based property test: random sequences of run-claim, dispatch, revocation and time
//! steps from two runs and a foreign client, run against the real store (several store
//! instances, i.e. replicas) and against a small reference model written here from the spec
//! (store §4, §5, §7.7; DECISIONS 8-10). Answers and the durable epoch and grant generation
//! must agree after every step. Shrunk failures are kept in `store_model.proptest-regressions`.

mod store_support;

use std::collections::BTreeMap;
use std::time::Duration;

use execution_provider::errors::ErrorCode;
use execution_provider::store::admin::AdminRequest;
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::{ClaimContext, RunClaim};
use proptest::prelude::*;
use store_support::*;

#[derive(Debug, Clone)]
enum Step {
    Acquire { replica: usize, run: u8, op: u8 },
    Release { replica: usize, run: u8 },
    Execute { replica: usize, run: u8 },
    Revoke { stale: bool, op: u8 },
    ForeignAcquire,
    Advance { secs: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..2usize, 0..2u8, 0..3u8).prop_map(|(replica, run, op)| Step::Acquire {
            replica,
            run,
            op
        }),
        (0..2usize, 0..2u8).prop_map(|(replica, run)| Step::Release { replica, run }),
        (0..2usize, 0..2u8).prop_map(|(replica, run)| Step::Execute { replica, run }),
        (any::<bool>(), 0..2u8).prop_map(|(stale, op)| Step::Revoke { stale, op }),
        Just(Step::ForeignAcquire),
        (0..90u64).prop_map(|secs| Step::Advance { secs }),
    ]
}

/// The live claim as the model tracks it.
#[derive(Debug, Clone)]
struct ModelClaim {
    run: u8,
    op: u8,
    epoch: u64,
    generation: u64,
    expires: u64,
}

/// The reference model: what the spec says the environment holds.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    epoch: u64,
    generation: u64,
    claim: Option<ModelClaim>,
    receipts: BTreeMap<u8, (u64, u64)>,
}

const TTL: u64 = 60;

impl Model {
    fn acquire(&mut self, run: u8, op: u8) -> Result<(), ErrorCode> {
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

    fn release(&mut self, held: &ModelClaim) -> Result<(), ErrorCode> {
        match &self.claim {
            None => Ok(()),
            Some(_) if self.current(held) => {
                self.claim = None;
                Ok(())
            }
            Some(_) => Err(ErrorCode::Conflict),
        }
    }

    fn execute(&self, held: &ModelClaim) -> Result<(), ErrorCode> {
        let live = self.claim.as_ref().is_some_and(|c| self.now < c.expires);
        if self.current(held) && live {
            Ok(())
        } else {
            Err(ErrorCode::Conflict)
        }
    }

    fn revoke(&mut self, expected: u64, op: u8) -> Result<u64, ErrorCode> {
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

fn code<T>(r: &Result<T, execution_provider::store::StoreError>) -> Result<(), ErrorCode> {
    r.as_ref().map(|_| ()).map_err(|e| e.code())
}

async fn run_case(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let world = World::new().await;
    let replicas = [world.store(), world.store()];
    let req = ensure_request(&world, CLIENT, "alice", "b1", "roomy", "op-e");
    let a = replicas[0].ensure_template(&req).await.expect("ensure");
    replicas[0]
        .commit_reference(&a.env, &req.caller, "b1", "op-e")
        .await
        .expect("commit");
    world.make_ready(&a.env.id).await;
    let mut model = Model {
        epoch: 1,
        generation: 1,
        ..Model::default()
    };
    let mut held: BTreeMap<u8, (RunClaim, ModelClaim)> = BTreeMap::new();
    let ctx = |c: &RunClaim| ClaimContext {
        env: c.env.clone(),
        binding_id: c.binding_id.clone(),
        run_id: c.run_id.clone(),
        claim_id: c.claim_id.clone(),
        epoch: c.epoch,
        grant_generation: c.grant_generation,
    };
    for (i, step) in steps.iter().enumerate() {
        let (real, expected) = match step.clone() {
            Step::Acquire { replica, run, op } => {
                let r = replicas[replica]
                    .acquire_run(&AcquireRequest {
                        env: a.env.clone(),
                        caller: req.caller.clone(),
                        binding_id: "b1".to_owned(),
                        run_id: format!("run-{run}"),
                        operation_id: format!("op-{run}-{op}"),
                        ttl: Duration::from_secs(TTL),
                    })
                    .await;
                let expected = model.acquire(run, op);
                if let (Ok(claim), Some(m)) = (&r, &model.claim) {
                    held.insert(run, (claim.clone(), m.clone()));
                }
                (code(&r), expected)
            }
            Step::Release { replica, run } => match held.get(&run) {
                None => continue,
                Some((c, m)) => {
                    let r = replicas[replica].release_run(&req.caller, &ctx(c)).await;
                    (code(&r), model.release(m))
                }
            },
            Step::Execute { replica, run } => match held.get(&run) {
                None => continue,
                Some((c, m)) => {
                    let r = replicas[replica]
                        .execute(&req.caller, &ctx(c), stat("f"))
                        .await;
                    (code(&r), model.execute(m))
                }
            },
            Step::Revoke { stale, op } => {
                let expected_gen = if stale {
                    model.generation.saturating_sub(1).max(1)
                } else {
                    model.generation
                };
                let stale_gen = stale && model.generation > 1;
                let expected_gen = if stale_gen {
                    expected_gen
                } else {
                    model.generation
                };
                let q = AdminRequest {
                    env: a.env.clone(),
                    owner_hash: req.caller.owner_hash.clone(),
                    actor: CLIENT.to_owned(),
                    administrator_for: Vec::new(),
                    expected_epoch: 0,
                    expected_pod_uid: String::new(),
                    expected_pvc_uid: String::new(),
                    operation_id: format!("rev-{op}"),
                };
                let r = replicas[0].revoke_environment(&q, expected_gen).await;
                let m = model.revoke(expected_gen, op);
                prop_assert_eq!(r.as_ref().ok().copied(), m.ok(), "step {}: {:?}", i, step);
                (code(&r), m.map(|_| ()))
            }
            Step::ForeignAcquire => {
                let r = replicas[1]
                    .acquire_run(&AcquireRequest {
                        env: a.env.clone(),
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
                model.now += secs;
                (Ok(()), Ok(()))
            }
        };
        prop_assert_eq!(real, expected, "step {}: {:?}", i, step);
        let status = world.get(&a.env.id).await.status.expect("status");
        prop_assert_eq!(status.epoch, Some(model.epoch), "epoch after step {}", i);
        prop_assert_eq!(
            status.grant_generation,
            Some(model.generation),
            "generation after step {}",
            i
        );
        prop_assert!(
            status.active_operation.is_none(),
            "no operation left behind"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_store_agrees_with_the_reference_model(steps in prop::collection::vec(step(), 1..24)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(run_case(steps))?;
    }
}
