//! Store §8.2 `policyCurrent` over real mTLS (catalogue [peer] OriginalPeerWithdrawal and
//! [lease] CancelsWhenPolicyAuthorityChanges): while a command runs under its operation
//! lease, the caller's template is withdrawn from its client policy; the next lease renewal
//! re-authenticates the call's peer against the reloaded authority, fails, cancels the
//! command and fences the environment, keeping the operation on record.

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::DEV_NAMESPACE;
use execution_provider::kube::crd::{ExecutionEnvironment, FenceState};
use execution_provider::server::status::error_detail;
use kube::api::Api;
use security::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawing_the_template_from_the_callers_policy_mid_command_cancels_it_and_fences() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "withdrawn")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "withdrawn", &env).await;
    let mut runner = client.clone();
    let request = pb::CommandStartRequest {
        context: Some(context("withdrawn", &claim)),
        command: "sleep 60; echo finished".into(),
        timeout_millis: 120_000,
        ..Default::default()
    };
    let command = tokio::spawn(async move { runner.start_command(request).await });

    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let operation = eventually(Duration::from_secs(20), "the dispatch", || async {
        let o = api.get(&env.id).await.ok()?;
        o.status?.active_operation.map(|op| op.id)
    })
    .await;
    edit_manifest(tmp.path(), |m| {
        m["clients"][0]
            .as_object_mut()
            .unwrap()
            .remove("executionTemplates");
    });
    reload(&dev).await;

    let refused = tokio::time::timeout(Duration::from_secs(40), command)
        .await
        .expect("cancelled at the next renewal, not after the command's 60 s")
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(error_detail(&refused).unwrap().code, "fence_unknown");
    let status = api.get(&env.id).await.unwrap().status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    assert_eq!(
        status.active_operation.map(|op| op.id),
        Some(operation),
        "the operation stays on record for recovery"
    );
    dev.stop().await.unwrap();
}
