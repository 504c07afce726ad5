//! `kubectl delete executionenvironment X --cascade=foreground` on the real control plane: the
//! garbage collector finishes its foreground pass (it removes the `foregroundDeletion`
//! finalizer) without deleting the executor Pod or the retained workspace PVC, because neither
//! carries an owner reference; the resource stays, held by the provider's finalizer and marked
//! DeletionBlocked, until the provider's own deletion flow (retire, then
//! DeleteRetiredEnvironment) removes them.

use std::time::Duration;

use execution_provider::kube::crd::{
    ConditionStatus, ENVIRONMENT_FINALIZER, ExecutionEnvironment, condition, pod_name, pvc_name,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{Api, Resource, ResourceExt};

use crate::cluster::{Cluster, eventually};
use crate::common;
use crate::flow::Setup;

/// The finalizer the API server adds for a foreground cascading delete; the garbage collector
/// removes it once every dependent that blocks its owner's deletion is gone.
const FOREGROUND: &str = "foregroundDeletion";

fn deleting<K: Resource>(object: &Option<K>) -> bool {
    object
        .as_ref()
        .is_none_or(|o| o.meta().deletion_timestamp.is_some())
}

pub async fn a_foreground_cascading_delete_leaves_the_executor_pod_and_the_workspace(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "foreground").await;
    let provider = setup.installation.start_provider("provider").await;
    let mut client = setup.installation.client(&provider);
    let allocation = common::ensure_ready(&mut client, "fg").await;
    let name = allocation.environment.clone().unwrap().id;
    let ns = &setup.ns;
    let resources = Api::<ExecutionEnvironment>::namespaced(ns.client.clone(), &ns.name);
    let pods = Api::<Pod>::namespaced(ns.client.clone(), &ns.name);
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ns.client.clone(), &ns.name);
    let (pod, pvc) = (pod_name(&name), pvc_name(&name));
    let pod_uid = pods.get(&pod).await.unwrap().uid();
    let pvc_uid = pvcs.get(&pvc).await.unwrap().uid();

    setup
        .cluster
        .kubectl(&[
            "delete",
            "executionenvironment",
            &name,
            "--namespace",
            &ns.name,
            "--cascade=foreground",
            "--wait=false",
        ])
        .await;

    // Wait until the garbage collector has acted: its foreground pass is over (the finalizer
    // it owns is gone and the provider has seen the deletion), or it has started deleting a
    // dependent. Either way the answer is settled and checked below.
    eventually(
        Duration::from_secs(120),
        "the garbage collector's foreground pass over the environment",
        || {
            let (resources, pods, pvcs) = (resources.clone(), pods.clone(), pvcs.clone());
            let (name, pod, pvc) = (name.clone(), pod.clone(), pvc.clone());
            async move {
                let env = resources.get_opt(&name).await.ok()?;
                let pass_over = env.as_ref().is_some_and(|env| {
                    env.metadata.deletion_timestamp.is_some()
                        && !env.finalizers().iter().any(|f| f == FOREGROUND)
                        && env.status.as_ref().is_some_and(|s| {
                            s.conditions.iter().any(|c| {
                                c.type_ == condition::DELETION_BLOCKED
                                    && c.status == ConditionStatus::True
                            })
                        })
                });
                let dependent_hit = deleting(&pods.get_opt(&pod).await.ok()?)
                    || deleting(&pvcs.get_opt(&pvc).await.ok()?);
                (pass_over || dependent_hit || env.is_none()).then_some(())
            }
        },
    )
    .await;

    let live_pod = pods.get_opt(&pod).await.unwrap();
    let live_pod = live_pod.expect("the executor Pod outlives a foreground cascading delete");
    assert_eq!(live_pod.uid(), pod_uid, "the same executor Pod");
    assert!(
        live_pod.metadata.deletion_timestamp.is_none(),
        "the garbage collector did not delete the executor Pod"
    );
    let live_pvc = pvcs.get_opt(&pvc).await.unwrap();
    let live_pvc = live_pvc.expect("the workspace PVC outlives a foreground cascading delete");
    assert_eq!(live_pvc.uid(), pvc_uid, "the same workspace PVC");
    assert!(
        live_pvc.metadata.deletion_timestamp.is_none(),
        "the garbage collector did not delete the workspace PVC"
    );
    let env = resources.get(&name).await.unwrap();
    assert!(
        env.finalizers().iter().any(|f| f == ENVIRONMENT_FINALIZER),
        "the provider's finalizer holds the resource until its own deletion flow"
    );
    provider.stop().await;
    setup.finish().await;
}
