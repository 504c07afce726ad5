//! The standard gRPC health service follows the security authority over real mTLS
//! (api-security §6.5): SERVING while the replica is ready, NOT_SERVING while its authority
//! is withdrawn (a refused generation, an invalid manifest, a peer advancing the ledger),
//! and SERVING again once a valid higher generation is loaded, all on one open connection.

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::security::ledger::{AuthorityLedger, LedgerState};
use execution_provider::security::manager::DEFAULT_AUTHORITY_CONFIGMAP;
use security::*;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const EXECUTION_SERVICE: &str = "mecatl.execution.v1.ExecutionProviderService";

/// The status of the whole server (`""`) and of the execution service, once both agree. The
/// provider updates the two one after the other, so a check between the two updates can see
/// them differ for a moment; that is a transition, not an answer.
async fn status(health: &mut HealthClient<Channel>) -> Option<ServingStatus> {
    let mut statuses = Vec::new();
    for service in ["", EXECUTION_SERVICE] {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let response = health.check(request).await.expect("health answers");
        statuses.push(response.into_inner().status());
    }
    (statuses[0] == statuses[1]).then_some(statuses[0])
}

/// Polls until the server and the execution service both report `want`.
async fn wait_for(health: &mut HealthClient<Channel>, want: ServingStatus) {
    eventually(Duration::from_secs(10), &format!("{want:?}"), || {
        let mut health = health.clone();
        async move { (status(&mut health).await == Some(want)).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_while_a_refused_or_invalid_generation_stops_the_replica() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let channel = channel(dev.addr, tmp.path(), Some(&dev_identity(tmp.path())));
    let mut health = HealthClient::new(channel);
    wait_for(&mut health, ServingStatus::Serving).await;

    let generation_one = std::fs::read(tmp.path().join("security/manifest.json")).unwrap();
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    std::fs::write(tmp.path().join("security/manifest.json"), &generation_one).unwrap();
    let refused = dev.security_manager.reload().await.unwrap_err();
    assert!(refused.to_string().contains("rollback"), "{refused}");
    wait_for(&mut health, ServingStatus::NotServing).await;

    std::fs::write(
        tmp.path().join("security/manifest.json"),
        br#"{"version":2}"#,
    )
    .unwrap();
    assert!(dev.security_manager.reload().await.is_err());
    wait_for(&mut health, ServingStatus::NotServing).await;

    std::fs::write(tmp.path().join("security/manifest.json"), &generation_one).unwrap();
    edit_manifest(tmp.path(), |m| m["generation"] = 3.into());
    reload(&dev).await;
    wait_for(&mut health, ServingStatus::Serving).await;
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_once_a_peer_advances_the_ledger_past_this_replica() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut health = HealthClient::new(channel(
        dev.addr,
        tmp.path(),
        Some(&dev_identity(tmp.path())),
    ));
    wait_for(&mut health, ServingStatus::Serving).await;
    let ledger = AuthorityLedger::new(dev.kube.clone(), "execution", DEFAULT_AUTHORITY_CONFIGMAP);
    let peer = LedgerState {
        generation: 9,
        digest: "0".repeat(64),
    };
    ledger.advance(&peer).await.unwrap();
    wait_for(&mut health, ServingStatus::NotServing).await;
    assert!(!dev.security.ready());
    dev.stop().await.unwrap();
}
