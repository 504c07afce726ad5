//! A rolling upgrade of the provider on the real control plane (the recovery issue, item 5).
//! The suite runs `serve` as processes, not as the chart's Deployment, so the rollout is
//! modelled as the Deployment's controller does it with `maxUnavailable: 0`: a new replica is
//! started and becomes ready, then the old one gets SIGTERM while a foreground call runs
//! through it and a detached command runs in another environment. Every environment keeps
//! serving at its epoch (no fence, no recovery), the in-flight call finishes with its result,
//! and the detached command keeps running, readable through the new replica, until it is
//! cancelled with its end proven.

use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::kube::crd::{ExecutionEnvironment, FenceState};
use kube::Api;

use crate::cluster::{Cluster, eventually};
use crate::commands::{SERVER_LOOP, assert_consecutive_lines, query, status_through};
use crate::common::{self, context};
use crate::flow::{Setup, release, run};

pub async fn a_rolling_upgrade_keeps_every_environment_serving_and_detached_commands_running(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "rolling").await;
    let envs = Api::<ExecutionEnvironment>::namespaced(setup.ns.client.clone(), &setup.ns.name);
    let old = setup.installation.start_provider("old").await;
    let mut client = setup.installation.client(&old);
    let fg = common::ensure_ready(&mut client, "fg")
        .await
        .environment
        .unwrap();
    let det = common::ensure_ready(&mut client, "det")
        .await
        .environment
        .unwrap();
    let fg_claim = common::acquire(&mut client, "fg", &fg).await;
    let det_claim = common::acquire(&mut client, "det", &det).await;
    let det_ctx = context("det", &det_claim);
    let started = client
        .start_command(pb::CommandStartRequest {
            context: Some(det_ctx.clone()),
            command: SERVER_LOOP.into(),
            detach: true,
            ..Default::default()
        })
        .await
        .expect("a detached start")
        .into_inner();
    let id = started.command_id;
    let before = status_through(&client, &det_ctx, &id, 3).await;
    let seen = assert_consecutive_lines(&String::from_utf8_lossy(&before.stdout), 0);

    // The new replica first; the old one is told to stop with a foreground call in flight.
    let new = setup.installation.start_provider("new").await;
    let mut through_new = setup.installation.client(&new);
    let call = {
        let mut client = client.clone();
        let request = pb::CommandStartRequest {
            context: Some(context("fg", &fg_claim)),
            command: "sleep 3; echo through the old replica".into(),
            timeout_millis: 20_000,
            ..Default::default()
        };
        tokio::spawn(async move { client.start_command(request).await })
    };
    eventually(Duration::from_secs(30), "the call in flight", || async {
        envs.get(&fg.id).await.ok()?.status?.active_operation
    })
    .await;
    old.stop().await;
    let answer = call
        .await
        .unwrap()
        .expect("the draining replica finishes its call")
        .into_inner()
        .result
        .expect("a foreground result");
    assert_eq!(
        answer.state,
        pb::CommandState::Succeeded as i32,
        "{answer:?}"
    );
    assert_eq!(answer.stdout, b"through the old replica\n");

    // Nothing was fenced or recovered: the same executors serve, at the same epochs.
    for (env, claim) in [(&fg, &fg_claim), (&det, &det_claim)] {
        let status = envs.get(&env.id).await.unwrap().status.unwrap();
        assert_eq!(status.fence_state, Some(FenceState::Healthy), "{status:?}");
        assert_eq!(status.epoch, Some(claim.epoch));
        assert!(status.active_operation.is_none() && status.termination_proof.is_none());
    }
    let after = run(
        &mut through_new,
        "fg",
        &fg_claim,
        "echo through the new replica",
    )
    .await;
    assert_eq!(after.stdout, b"through the new replica\n", "{after:?}");

    // The detached command kept running; the new replica reads all of it and ends it.
    let status = status_through(&through_new, &det_ctx, &id, seen + 10).await;
    assert_eq!(status.state, pb::CommandState::Running as i32, "{status:?}");
    assert_eq!(&status.stdout[..before.stdout.len()], &before.stdout[..]);
    assert_consecutive_lines(&String::from_utf8_lossy(&status.stdout), 0);
    let mut cancel = query(&det_ctx, &id, 0);
    cancel.grace_millis = 500;
    let ended = through_new
        .cancel_command(cancel)
        .await
        .expect("the cancel through the new replica")
        .into_inner();
    assert_eq!(ended.state, pb::CommandState::Cancelled as i32, "{ended:?}");
    assert_eq!(
        ended.terminal_receipt.len(),
        64,
        "its end is proven: {ended:?}"
    );

    release(&mut through_new, "fg", &fg_claim).await;
    release(&mut through_new, "det", &det_claim).await;
    new.stop().await;
    setup.finish().await;
}
