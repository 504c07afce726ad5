//! An environment whose create landed after its own create deadline is void (store
//! `ledger::proof`): its capacity slot may already have been reclaimed, so it is never
//! initialized, provisioned or served. The reconciler removes it: it drops the environment
//! finalizer and deletes the object with UID and resourceVersion preconditions. A void object
//! that somehow carries a status or runtime identity is left alone and reported.

use kube::api::Api;

use super::Next;
use super::error::ReconcileError;
use super::removal::{RemovalConflicts, remove_finalizer_and_delete};
use crate::kube::crd::ExecutionEnvironment;

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
    let conflicts = RemovalConflicts {
        finalizer: "void environment changed before its finalizer was removed",
        delete: "void environment changed before it was deleted",
    };
    remove_finalizer_and_delete(envs, &name, env.clone(), &conflicts).await
}
