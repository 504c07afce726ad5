//! Model-based property test: random sequences of run-claim (acquire, renew, release),
//! dispatch (validation, then `execute_validated` from the validated object, as the server
//! does, with an executor that succeeds, refuses or breaks), attach, allocation (a replay, and
//! a second template filling its capacity ledger), revocation, reference intent, admin
//! lifecycle, recovery, executor death, reconciler and time steps from two runs, several
//! bindings and a foreign client, run against the real store (two replicas) and against the
//! reference model of `store_support/model.rs` (store §3-§7; DECISIONS 8-11). Any step may
//! meet an injected API fault on one of its writes (409, 500, a request lost before it lands,
//! an answer lost after it landed), and two steps may run at once on the two replicas with
//! their API requests interleaved by a seed. Answers and the whole durable state (fence
//! state, claim id and expiry, operation lease, references, receipts, proofs, the capacity
//! ledger) must agree after every action (driver: `store_support/model_case.rs`). Shrunk
//! failures are kept in `store_model.proptest-regressions`.

#[path = "store_support/model_case.rs"]
mod case;
#[path = "store_support/model.rs"]
mod model;
mod store_support;

use case::{Action, ApiFault, Case, RefOp, Step, action};
use execution_provider::errors::ErrorCode;
use model::{ExecutorAnswer, Kind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Runs `actions`; returns the store's answers (equal to the model's).
async fn run_actions(actions: Vec<Action>) -> Result<Vec<Result<(), ErrorCode>>, TestCaseError> {
    let mut case = Case::new().await;
    let mut answers = Vec::new();
    for (i, action) in actions.iter().enumerate() {
        let Some(real) = case.run(action).await? else {
            continue;
        };
        case.check_state(i).await?;
        answers.extend(real);
    }
    Ok(answers)
}

/// Runs fault-free `steps` one at a time.
async fn run_case(steps: Vec<Step>) -> Result<Vec<Result<(), ErrorCode>>, TestCaseError> {
    let actions = steps
        .into_iter()
        .map(|step| Action::One { step, fault: None })
        .collect();
    run_actions(actions).await
}

/// The full lifecycle path the random walk reaches rarely: a successor is reserved and
/// committed, both references go away, the environment is retired and the reconciler
/// finishes, a retirement replay succeeds, and the deletion of the retired environment is
/// admitted once and replayed.
#[tokio::test(start_paused = true)]
async fn the_model_and_the_store_agree_through_retirement_and_deletion() {
    use Step::*;
    let reference = |what, binding, op| Reference { what, binding, op };
    let steps = vec![
        Acquire {
            replica: 0,
            run: 0,
            op: 0,
        },
        Reserve {
            source: 0,
            skip: 0,
            op: 0,
        },
        Advance { secs: 61 },
        Reserve {
            source: 0,
            skip: 0,
            op: 0,
        },
        reference(RefOp::Commit, 1, 0),
        Lifecycle {
            kind: Kind::Retire,
            stale: false,
            op: 0,
        },
        reference(RefOp::Release, 0, 0),
        reference(RefOp::Prepare, 1, 1),
        reference(RefOp::Confirm, 1, 1),
        Lifecycle {
            kind: Kind::Retire,
            stale: false,
            op: 0,
        },
        Execute {
            replica: 1,
            run: 0,
            answer: ExecutorAnswer::Succeed,
        },
        ReconcilerFinishes,
        Lifecycle {
            kind: Kind::Retire,
            stale: false,
            op: 0,
        },
        Lifecycle {
            kind: Kind::Replace,
            stale: false,
            op: 1,
        },
        Lifecycle {
            kind: Kind::DeleteRetired,
            stale: false,
            op: 1,
        },
        Lifecycle {
            kind: Kind::DeleteRetired,
            stale: false,
            op: 1,
        },
        Lifecycle {
            kind: Kind::DeleteRetired,
            stale: false,
            op: 0,
        },
    ];
    let answers = run_case(steps).await.expect("store and model agree");
    use ErrorCode::Conflict;
    let expected = vec![
        Ok(()),
        Err(Conflict),
        Ok(()),
        Ok(()),
        Ok(()),
        Err(Conflict),
        Ok(()),
        Ok(()),
        Ok(()),
        Ok(()),
        // The validation finds no current claim first (the admission ended it).
        Err(Conflict),
        Ok(()),
        Ok(()),
        Err(Conflict),
        Ok(()),
        Ok(()),
        Err(Conflict),
    ];
    assert_eq!(answers, expected);
}

/// An exact replacement is admitted, finished by the reconciler (epoch + 1), replayed by its
/// receipt with the old identity, and every claim taken before it is dead.
#[tokio::test(start_paused = true)]
async fn the_model_and_the_store_agree_through_a_replacement() {
    use Step::*;
    let steps = vec![
        Acquire {
            replica: 0,
            run: 0,
            op: 0,
        },
        Lifecycle {
            kind: Kind::Replace,
            stale: false,
            op: 0,
        },
        Advance { secs: 61 },
        Lifecycle {
            kind: Kind::Replace,
            stale: false,
            op: 0,
        },
        Acquire {
            replica: 1,
            run: 1,
            op: 0,
        },
        ReconcilerFinishes,
        Lifecycle {
            kind: Kind::Replace,
            stale: true,
            op: 0,
        },
        Execute {
            replica: 0,
            run: 0,
            answer: ExecutorAnswer::Succeed,
        },
        Acquire {
            replica: 1,
            run: 1,
            op: 1,
        },
        Execute {
            replica: 1,
            run: 1,
            answer: ExecutorAnswer::Succeed,
        },
    ];
    let answers = run_case(steps).await.expect("store and model agree");
    let expected = vec![
        Ok(()),
        Err(ErrorCode::Conflict),
        Ok(()),
        Ok(()),
        Err(ErrorCode::NotReady),
        Ok(()),
        Ok(()),
        Err(ErrorCode::Conflict),
        Ok(()),
        Ok(()),
    ];
    assert_eq!(answers, expected);
}

/// A dispatch whose executor breaks fences the environment with its operation on record;
/// a lost answer of an admission fences too; recovery needs the exact Pod's end and then
/// clears the fence, the operation and the claim; its replay answers the same.
#[tokio::test(start_paused = true)]
async fn the_model_and_the_store_agree_through_a_fence_and_its_recovery() {
    use Step::*;
    let one = |step| Action::One { step, fault: None };
    let execute = |answer| Execute {
        replica: 0,
        run: 0,
        answer,
    };
    let actions = vec![
        one(Acquire {
            replica: 0,
            run: 0,
            op: 0,
        }),
        Action::One {
            step: execute(ExecutorAnswer::Succeed),
            fault: Some((ApiFault::LostAfter, 1)),
        },
        one(Recover {
            stale: false,
            op: 0,
        }),
        one(ExecutorDies),
        one(Recover {
            stale: false,
            op: 0,
        }),
        one(Recover {
            stale: false,
            op: 0,
        }),
        one(Acquire {
            replica: 1,
            run: 1,
            op: 0,
        }),
        one(execute(ExecutorAnswer::Break)),
        one(Execute {
            replica: 1,
            run: 1,
            answer: ExecutorAnswer::Break,
        }),
    ];
    let answers = run_actions(actions).await.expect("store and model agree");
    use ErrorCode::*;
    let expected = vec![
        Ok(()),
        Err(Internal),
        Err(FenceUnknown),
        Ok(()),
        Ok(()),
        Ok(()),
        Ok(()),
        Err(Conflict),
        Err(FenceUnknown),
    ];
    assert_eq!(answers, expected);
}

/// Two callers race for the claim under every interleaving of their requests: exactly one
/// wins, and the state is the winner's.
#[tokio::test(start_paused = true)]
async fn two_concurrent_acquisitions_serialize_under_every_seed() {
    for seed in 0..8 {
        let actions = vec![Action::Both {
            a: Step::Acquire {
                replica: 0,
                run: 0,
                op: 0,
            },
            b: Step::Acquire {
                replica: 1,
                run: 1,
                op: 0,
            },
            seed,
        }];
        let answers = run_actions(actions).await.expect("a serial order");
        assert_eq!(
            answers.iter().filter(|a| a.is_ok()).count(),
            1,
            "seed {seed}: {answers:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES runs a longer campaign.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(192),
        // Integration tests have no lib.rs beside them: name the committed file directly.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/store_model.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_store_agrees_with_the_reference_model(actions in prop::collection::vec(action(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(run_actions(actions))?;
    }
}
