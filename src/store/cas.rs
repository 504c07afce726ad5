//! Compare-and-swap on the environment's status: read, decide, write with the read
//! `resourceVersion`, and start over when another writer got there first.

use kube::api::{Api, PostParams};
use tracing::Instrument as _;

use super::error::StoreError;
use crate::child_span;
use crate::kube::crd::ExecutionEnvironment;
use crate::telemetry::traces::record_store_outcome;

/// How many times a mutation is retried after losing a race before giving up.
const MAX_ATTEMPTS: usize = 8;

/// What a mutation decided for one observed object.
pub enum Decision<T> {
    /// Nothing to write; answer `T`.
    Keep(T),
    /// Write the mutated object's status, then answer `T`.
    Write(T),
}

/// Reads `name`; `None` when it does not exist.
pub async fn get(
    api: &Api<ExecutionEnvironment>,
    name: &str,
) -> Result<Option<ExecutionEnvironment>, StoreError> {
    api.get_opt(name)
        .await
        .map_err(|e| StoreError::kube(name, e))
}

/// Applies `mutate` to the current object and writes its status by compare-and-swap,
/// retrying on a lost race. `mutate` sees a fresh copy each attempt and must re-check
/// everything it relies on.
pub async fn update_status<T>(
    api: &Api<ExecutionEnvironment>,
    name: &str,
    mutate: impl FnMut(&mut ExecutionEnvironment) -> Result<Decision<T>, StoreError>,
) -> Result<T, StoreError> {
    update_status_from(api, name, None, mutate).await
}

/// [`update_status`] whose first attempt starts from `known`, an object the caller read
/// moments ago, instead of a fresh read: uncontended, it saves one request; if anything
/// changed since, the write loses (409) and the next attempt reads afresh.
pub async fn update_status_from<T>(
    api: &Api<ExecutionEnvironment>,
    name: &str,
    known: Option<ExecutionEnvironment>,
    mutate: impl FnMut(&mut ExecutionEnvironment) -> Result<Decision<T>, StoreError>,
) -> Result<T, StoreError> {
    update_status_observed(api, name, known, mutate)
        .await
        .map(|(answer, _)| answer)
}

/// [`update_status_from`] that also returns the object as the API server holds it after the
/// call: the write's response (the post-write state with its new `resourceVersion`), or the
/// object the decision was taken on when nothing was written. A caller that goes on working
/// with the environment starts its next write from it instead of reading again.
///
/// Only a write is checked by the server, so a decision taken on `known` counts only when it
/// writes: a refusal or a no-op decided on `known` (which may be stale) is taken again on a
/// fresh read before it is answered.
///
/// Inside a traced call, the whole compare-and-swap (its reads, its write, its retries) is
/// the span `store.cas`.
pub async fn update_status_observed<T>(
    api: &Api<ExecutionEnvironment>,
    name: &str,
    known: Option<ExecutionEnvironment>,
    mutate: impl FnMut(&mut ExecutionEnvironment) -> Result<Decision<T>, StoreError>,
) -> Result<(T, ExecutionEnvironment), StoreError> {
    let span = child_span!(
        "store.cas",
        environment = name,
        store.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty
    );
    let result = swap(api, name, known, mutate)
        .instrument(span.clone())
        .await;
    record_store_outcome(&span, &result);
    result
}

/// The compare-and-swap loop of [`update_status_observed`].
async fn swap<T>(
    api: &Api<ExecutionEnvironment>,
    name: &str,
    mut known: Option<ExecutionEnvironment>,
    mut mutate: impl FnMut(&mut ExecutionEnvironment) -> Result<Decision<T>, StoreError>,
) -> Result<(T, ExecutionEnvironment), StoreError> {
    let mut attempts = 0;
    while attempts < MAX_ATTEMPTS {
        let (mut object, cached) = match known.take() {
            Some(object) => (object, true),
            None => {
                attempts += 1;
                let fresh = get(api, name)
                    .await?
                    .ok_or_else(|| StoreError::not_found(name, "environment does not exist"))?;
                (fresh, false)
            }
        };
        let observed = object.clone();
        let decision = mutate(&mut object);
        let answer = match decision {
            Ok(Decision::Write(answer)) => answer,
            // A refusal or no-op on a possibly stale copy: decide again on a fresh read.
            Ok(Decision::Keep(_)) | Err(_) if cached => continue,
            Ok(Decision::Keep(answer)) => return Ok((answer, observed)),
            Err(error) => return Err(error),
        };
        #[cfg(debug_assertions)]
        {
            let broken = super::invariants::transition_violation(&observed, &object);
            debug_assert!(
                broken.is_none(),
                "store invariant broken on {name}: {broken:?}"
            );
        }
        match api
            .replace_status(name, &PostParams::default(), &object)
            .await
        {
            Ok(written) => return Ok((answer, written)),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(StoreError::kube(name, e)),
        }
    }
    Err(StoreError::Conflict {
        env: name.to_owned(),
        reason: "environment changed concurrently",
        retryable: true,
    })
}
