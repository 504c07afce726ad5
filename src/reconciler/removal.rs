//! The last step of removing an environment object: drop the provider's finalizer by
//! compare-and-swap, then delete the object with UID and resourceVersion preconditions, so that
//! neither write can act on an object that changed since it was judged. Shared by the retained
//! deletion flow and the removal of a void (late-landed) environment.

use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::Next;
use super::error::ReconcileError;
use crate::kube::crd::{ENVIRONMENT_FINALIZER, ExecutionEnvironment};

/// What a lost compare-and-swap reports at each of the two writes.
pub struct RemovalConflicts {
    /// The object changed before its finalizer was removed.
    pub finalizer: &'static str,
    /// The object changed before it was deleted.
    pub delete: &'static str,
}

/// Removes the finalizer from `live` (the version the caller judged) and deletes it exactly.
/// A vanished object is done (`Next::Wait`); a changed one is a conflict.
pub async fn remove_finalizer_and_delete(
    envs: &Api<ExecutionEnvironment>,
    name: &str,
    mut live: ExecutionEnvironment,
    conflicts: &RemovalConflicts,
) -> Result<Next, ReconcileError> {
    let conflict = |what| ReconcileError::Conflict {
        env: name.to_owned(),
        what,
    };
    let finalizers = live.metadata.finalizers.get_or_insert_with(Vec::new);
    if finalizers.iter().any(|f| f == ENVIRONMENT_FINALIZER) {
        finalizers.retain(|f| f != ENVIRONMENT_FINALIZER);
        live = match envs.replace(name, &PostParams::default(), &live).await {
            Ok(updated) => updated,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Next::Wait),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(conflict(conflicts.finalizer));
            }
            Err(e) => {
                return Err(ReconcileError::kube(name, "remove environment finalizer")(
                    e,
                ));
            }
        };
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.metadata.uid.clone(),
            resource_version: live.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match envs.delete(name, &params).await {
        Ok(_) => Ok(Next::Wait),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Next::Wait),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(conflict(conflicts.delete)),
        Err(e) => Err(ReconcileError::kube(name, "delete environment")(e)),
    }
}
