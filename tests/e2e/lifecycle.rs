//! The admin lifecycle on the real control plane: revocation refuses the grants issued before
//! it; after the reference is deleted (prepare, confirm), retirement with the exact proof (epoch, Pod UID, PVC UID) removes the executor Pod and
//! keeps the workspace PVC; deleting the retired environment removes the resource and the PVC.

use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::kube::crd::{ExecutionEnvironment, pod_name, pvc_name};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;

use crate::cluster::{Cluster, eventually};
use crate::common::{self, owner};
use crate::flow::{Setup, read, run};

pub async fn revoke_refuses_old_grants_and_retire_then_delete_remove_pod_then_workspace(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "lifecycle").await;
    let provider = setup.installation.start_provider("provider").await;
    let mut client = setup.installation.client(&provider);
    let allocation = common::ensure_ready(&mut client, "life").await;
    let env = allocation.environment.clone().unwrap();
    let claim = common::acquire(&mut client, "life", &env).await;
    run(&mut client, "life", &claim, "echo data > data.txt").await;

    let revoked = client
        .revoke_environment(pb::RevokeEnvironmentRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            expected_grant_generation: claim.grant_generation,
            operation_id: "revoke-1".into(),
        })
        .await
        .expect("the administrator revokes")
        .into_inner();
    assert!(revoked.grant_generation > claim.grant_generation);
    let refused = read(&mut client, "life", &claim, "data.txt").await;
    assert!(
        refused.is_err(),
        "a grant from before the revocation is refused"
    );

    // Only an unreferenced environment retires: delete the binding's reference first.
    let reference = |operation: &str| pb::ReferenceMutationRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        binding_id: "life".into(),
        operation_id: operation.into(),
    };
    client
        .prepare_reference_delete(reference("unref-1"))
        .await
        .expect("the reference delete is prepared");
    client
        .confirm_reference_delete(reference("unref-1"))
        .await
        .expect("the reference delete is confirmed");

    let (ns, name) = (&setup.ns, env.id.clone());
    let resources = Api::<ExecutionEnvironment>::namespaced(ns.client.clone(), &ns.name);
    let status = resources.get(&name).await.unwrap().status.unwrap();
    let pvc_uid = status.pvc.as_ref().unwrap().uid.clone();
    client
        .retire_environment(pb::RetireEnvironmentRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            expected_execution_epoch: status.epoch.unwrap(),
            expected_pod_uid: status.pod.as_ref().unwrap().uid.clone(),
            expected_pvc_uid: pvc_uid.clone(),
            operation_id: "retire-1".into(),
        })
        .await
        .expect("retirement with the exact proof is accepted");
    let pods = Api::<Pod>::namespaced(ns.client.clone(), &ns.name);
    let pod = pod_name(&name);
    eventually(
        Duration::from_secs(120),
        "the executor Pod to be gone",
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move { matches!(pods.get_opt(&pod).await, Ok(None)).then_some(()) }
        },
    )
    .await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ns.client.clone(), &ns.name);
    assert!(
        pvcs.get_opt(&pvc_name(&name)).await.unwrap().is_some(),
        "retirement keeps the workspace"
    );
    eventually(
        Duration::from_secs(120),
        "the delete of the retired environment",
        || {
            let mut client = client.clone();
            let request = pb::DeleteRetiredEnvironmentRequest {
                environment: Some(env.clone()),
                owner: Some(owner()),
                expected_pvc_uid: pvc_uid.clone(),
                operation_id: "delete-1".into(),
            };
            async move { client.delete_retired_environment(request).await.ok() }
        },
    )
    .await;
    eventually(
        Duration::from_secs(120),
        "the resource and PVC to be gone",
        || {
            let (resources, pvcs, name) = (resources.clone(), pvcs.clone(), name.clone());
            async move {
                let gone = matches!(resources.get_opt(&name).await, Ok(None))
                    && matches!(pvcs.get_opt(&pvc_name(&name)).await, Ok(None));
                gone.then_some(())
            }
        },
    )
    .await;
    provider.stop().await;
    setup.finish().await;
}
