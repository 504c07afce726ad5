//! Health and reflection on the mTLS port (issue 15, item 1): they answer only identities the
//! security authority admits, their streams hold limiter slots, reflection is served as both
//! `grpc.reflection.v1` and `v1alpha`, and a health check still answers NOT_SERVING while the
//! authority is withdrawn.

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::runtime::tls::Identity;
use execution_provider::server::limiter::RpcLimiter;
use security::*;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{v1, v1alpha};

const SERVICE: &str = "mecatl.execution.v1.ExecutionProviderService";

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

/// The services reflection v1 lists, or the refusal.
async fn list_v1(channel: tonic::transport::Channel) -> Result<Vec<String>, tonic::Status> {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("one answer");
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("unexpected answer {other:?}"),
    }
}

/// The services reflection v1alpha lists, or the refusal.
async fn list_v1alpha(channel: tonic::transport::Channel) -> Result<Vec<String>, tonic::Status> {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("one answer");
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("unexpected answer {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_identity_gets_neither_health_nor_reflection() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let strangers: [(&str, Identity); 2] = [
        (
            "unlisted",
            identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/other/stranger"),
        ),
        (
            "foreign CA",
            identity_from_foreign_ca("spiffe://dev.local/ns/default/client"),
        ),
    ];
    for (who, identity) in &strangers {
        let channel = channel(dev.addr, tmp.path(), Some(identity));
        let mut health = HealthClient::new(channel.clone());
        let refused = health.check(check("")).await.unwrap_err();
        assert_refused(&refused, Code::Unauthenticated, "unauthenticated", false);
        let refused = health.watch(check(SERVICE)).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{who}");
        let refused = list_v1(channel.clone()).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{who}");
        let refused = list_v1alpha(channel).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{who}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_identity_gets_health_and_both_reflection_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let channel = channel(dev.addr, tmp.path(), Some(&dev_identity(tmp.path())));
    let mut health = HealthClient::new(channel.clone());
    let answer = health.check(check(SERVICE)).await.unwrap().into_inner();
    assert_eq!(answer.status(), ServingStatus::Serving);
    for services in [
        list_v1(channel.clone()).await.unwrap(),
        list_v1alpha(channel).await.unwrap(),
    ] {
        assert!(services.iter().any(|s| s == SERVICE), "{services:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_streams_hold_limiter_slots_until_they_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let limiter = RpcLimiter::new(2, 2).unwrap();
    dev.security.set_limiter(limiter.clone());
    let channel = channel(dev.addr, tmp.path(), Some(&dev_identity(tmp.path())));
    let mut health = HealthClient::new(channel.clone());
    let mut first = health.watch(check(SERVICE)).await.unwrap().into_inner();
    let mut second = health.watch(check("")).await.unwrap().into_inner();
    assert_eq!(
        first.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );
    second.message().await.unwrap().unwrap();
    assert_eq!(limiter.active(), (2, 1), "two open streams, two slots");
    let refused = health.check(check("")).await.unwrap_err();
    assert_refused(
        &refused,
        Code::ResourceExhausted,
        "resource_exhausted",
        false,
    );
    let refused = list_v1(channel.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    drop(first);
    eventually(
        Duration::from_secs(10),
        "a slot freed by the ended stream",
        || {
            let mut health = health.clone();
            async move { health.check(check("")).await.ok() }
        },
    )
    .await;
    drop(second);
    eventually(Duration::from_secs(10), "every slot free", || {
        let free = limiter.active() == (0, 0);
        async move { free.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_authority_still_answers_a_health_check_but_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let channel = channel(dev.addr, tmp.path(), Some(&dev_identity(tmp.path())));
    let mut health = HealthClient::new(channel.clone());
    health.check(check("")).await.unwrap();
    dev.security.clear();
    eventually(Duration::from_secs(10), "NOT_SERVING", || {
        let mut health = health.clone();
        async move {
            let status = health
                .check(check(SERVICE))
                .await
                .ok()?
                .into_inner()
                .status();
            (status == ServingStatus::NotServing).then_some(())
        }
    })
    .await;
    let refused = health.watch(check(SERVICE)).await.unwrap_err();
    assert_refused(&refused, Code::Unavailable, "not_ready", true);
    let refused = list_v1alpha(channel).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
}
