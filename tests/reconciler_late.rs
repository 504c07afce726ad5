//! An environment whose create landed after its own create deadline (docs/store.md, "The
//! capacity ledger") is void: the reconciler never provisions it and removes it; one that
//! landed in time is left to the store to initialize.

mod reconciler_support;

use std::time::Duration;

use execution_provider::kube::crd::RfcTime;
use kube::ResourceExt;
use reconciler_support::*;

async fn create_with_deadline(world: &World, deadline: std::time::SystemTime) {
    let templates = registry();
    let revision = templates.default_template(TEMPLATE).unwrap();
    world
        .create_uninitialized(
            revision.revision(),
            revision.digest(),
            revision.execution().image(),
            Some(RfcTime::from_system_time(deadline).whole_seconds()),
        )
        .await;
}

#[tokio::test]
async fn a_create_that_landed_after_its_deadline_is_removed_and_never_provisioned() {
    let world = World::new().await;
    create_with_deadline(&world, world.now() - Duration::from_secs(5)).await;
    let reconciler = world.reconciler(&registry(), EXECUTOR_ACCOUNT);
    reconciler.reconcile(ENV).await.expect("reconcile");
    assert!(
        world.envs().get_opt(ENV).await.unwrap().is_none(),
        "removed"
    );
    assert_eq!(world.pod_count().await, 0);
    assert_eq!(world.pvc_count().await, 0);
}

#[tokio::test]
async fn a_create_that_landed_in_time_is_kept() {
    let world = World::new().await;
    create_with_deadline(&world, world.now() + Duration::from_secs(30)).await;
    let reconciler = world.reconciler(&registry(), EXECUTOR_ACCOUNT);
    let _ = reconciler.reconcile(ENV).await;
    let env = world.envs().get_opt(ENV).await.unwrap().expect("kept");
    assert!(env.metadata.deletion_timestamp.is_none());
    assert!(
        env.finalizers()
            .iter()
            .any(|f| f == "execution.mecatl.dev/retain-workspace")
    );
}
