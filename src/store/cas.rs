//! Compare-and-swap on the environment's status: read, decide, write with the read
//! `resourceVersion`, and start over when another writer got there first.

use kube::api::{Api, PostParams};

use super::error::StoreError;
use crate::kube::crd::ExecutionEnvironment;

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
    mut known: Option<ExecutionEnvironment>,
    mut mutate: impl FnMut(&mut ExecutionEnvironment) -> Result<Decision<T>, StoreError>,
) -> Result<T, StoreError> {
    for _ in 0..MAX_ATTEMPTS {
        let mut object = match known.take() {
            Some(object) => object,
            None => get(api, name)
                .await?
                .ok_or_else(|| StoreError::not_found(name, "environment does not exist"))?,
        };
        #[cfg(debug_assertions)]
        let before = object.clone();
        let answer = match mutate(&mut object)? {
            Decision::Keep(answer) => return Ok(answer),
            Decision::Write(answer) => answer,
        };
        #[cfg(debug_assertions)]
        {
            let broken = super::invariants::transition_violation(&before, &object);
            debug_assert!(
                broken.is_none(),
                "store invariant broken on {name}: {broken:?}"
            );
        }
        match api
            .replace_status(name, &PostParams::default(), &object)
            .await
        {
            Ok(_) => return Ok(answer),
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
