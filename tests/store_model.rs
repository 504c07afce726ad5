//! Model-based property test: random sequences of run-claim, dispatch, revocation, reference
//! intent, admin lifecycle and time steps from two runs, several bindings and a foreign
//! client, run against the real store (two store instances, i.e. replicas) and against the
//! reference model of `store_support/model.rs` (store §4-§7; DECISIONS 8-10). Answers, the
//! durable epoch and grant generation, the lifecycle operation and the listed reference
//! intents must agree after every step (driver: `store_support/model_case.rs`). Shrunk
//! failures are kept in `store_model.proptest-regressions`.

#[path = "store_support/model_case.rs"]
mod case;
#[path = "store_support/model.rs"]
mod model;
mod store_support;

use case::{Case, RefOp, Step, step};
use execution_provider::errors::ErrorCode;
use model::Kind;
use proptest::prelude::*;

/// Runs `steps`; returns the store's answers (equal to the model's).
async fn run_case(steps: Vec<Step>) -> Result<Vec<Result<(), ErrorCode>>, TestCaseError> {
    let mut case = Case::new().await;
    let mut answers = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let Some((real, expected)) = case.apply(step).await? else {
            continue;
        };
        prop_assert_eq!(real, expected, "step {}: {:?}", i, step);
        case.check_state(i).await?;
        answers.push(real);
    }
    Ok(answers)
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
        Execute { replica: 1, run: 0 },
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
        Err(ErrorCode::NotReady),
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
        Execute { replica: 0, run: 0 },
        Acquire {
            replica: 1,
            run: 1,
            op: 1,
        },
        Execute { replica: 1, run: 1 },
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn the_store_agrees_with_the_reference_model(steps in prop::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(run_case(steps))?;
    }
}
