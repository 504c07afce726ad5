//! An environment whose create landed after its own create deadline is void (store
//! `ledger::proof`): its capacity slot may already have been reclaimed, so it is never
//! initialized, provisioned or served. The reconciler removes it: it drops the environment
//! finalizer and deletes the object with UID and resourceVersion preconditions. A void object
//! that somehow carries a status or runtime identity is left alone and reported.

use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::Next;
use super::error::ReconcileError;
use crate::kube::crd::{ENVIRONMENT_FINALIZER, ExecutionEnvironment};

/// Removes the void environment `env`.
pub async fn remove_landed_late(
    envs: &Api<ExecutionEnvironment>,
    env: &ExecutionEnvironment,
) -> Result<Next, ReconcileError> {
    let name = env.metadata.name.clone().unwrap_or_default();
    if env
        .status
        .as_ref()
        .is_some_and(|s| s.epoch.is_some() || s.pod.is_some() || s.pvc.is_some())
    {
        return Err(ReconcileError::Mismatch {
            env: name,
            what: "an environment that landed after its create deadline carries a status"
                .to_owned(),
        });
    }
    tracing::warn!(env = %name, "removing an environment whose create landed after its deadline");
    let conflict = |what| ReconcileError::Conflict {
        env: name.clone(),
        what,
    };
    let mut live = env.clone();
    let finalizers = live.metadata.finalizers.get_or_insert_with(Vec::new);
    if finalizers.iter().any(|f| f == ENVIRONMENT_FINALIZER) {
        finalizers.retain(|f| f != ENVIRONMENT_FINALIZER);
        live = match envs.replace(&name, &PostParams::default(), &live).await {
            Ok(updated) => updated,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Next::Wait),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(conflict(
                    "void environment changed before its finalizer was removed",
                ));
            }
            Err(e) => {
                return Err(ReconcileError::kube(&name, "remove environment finalizer")(
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
    match envs.delete(&name, &params).await {
        Ok(_) => Ok(Next::Wait),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Next::Wait),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(conflict("void environment changed before it was deleted"))
        }
        Err(e) => Err(ReconcileError::kube(&name, "delete environment")(e)),
    }
}
