//! The TLS boundary over real mTLS on loopback (api-security §2, §9.1-2, §9.19-21): identity
//! rules, the chain verified per RPC against the CA pool in force now and at the injected
//! clock's time, and reloads taking effect on connections that are already open.

mod common;
mod security;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::runtime::{Clock, SystemClock};
use security::*;

type Client = common::Client;

async fn templates(client: &mut Client) -> Result<Vec<String>, tonic::Status> {
    let list = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await?
        .into_inner();
    Ok(list
        .items
        .into_iter()
        .filter_map(|i| i.template)
        .map(|t| t.id)
        .collect())
}

fn assert_unauthenticated(result: Result<Vec<String>, tonic::Status>) {
    let status = result.expect_err("refused");
    assert_refused(
        &status,
        tonic::Code::Unauthenticated,
        "unauthenticated",
        false,
    );
}

const DEV_URI: &str = "spiffe://dev.local/ns/default/client";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cn_only_certificate_and_one_with_two_uri_sans_are_unauthenticated() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let root = Ca::root("test root");
    write_client_cas(
        tmp.path(),
        &format!("{}{}", dev_ca_pem(tmp.path()), root.pem),
    );
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    let cn_only = root.leaf(vec![], None, None);
    let two = root.leaf(
        vec![uri_san(DEV_URI), uri_san("spiffe://dev.local/ns/x")],
        None,
        None,
    );
    let dns_only = root.leaf(
        vec![rcgen::SanType::DnsName(
            "client.dev.local".try_into().unwrap(),
        )],
        None,
        None,
    );
    for identity in [cn_only, two, dns_only] {
        let mut client = connect(dev.addr, tmp.path(), Some(&identity)).await;
        assert_unauthenticated(templates(&mut client).await);
    }
    let mut good = connect(dev.addr, tmp.path(), Some(&root.client(DEV_URI))).await;
    assert_eq!(templates(&mut good).await.unwrap(), ["default"]);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canonical_uri_that_is_not_allowlisted_is_unauthenticated() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let stranger = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/stranger");
    let mut client = connect(dev.addr, tmp.path(), Some(&stranger)).await;
    assert_unauthenticated(templates(&mut client).await);
    // The canonical form lowercases scheme and host, so this is the admitted client.
    let shouted = identity_from_dev_ca(tmp.path(), "SPIFFE://DEV.LOCAL/ns/default/client");
    let mut client = connect(dev.addr, tmp.path(), Some(&shouted)).await;
    assert_eq!(templates(&mut client).await.unwrap(), ["default"]);
    // The path keeps its case.
    let path_case = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/Client");
    let mut client = connect(dev.addr, tmp.path(), Some(&path_case)).await;
    assert_unauthenticated(templates(&mut client).await);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_rotation_refuses_the_next_rpc_on_an_open_connection_and_admits_the_new_root() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut old = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    assert_eq!(templates(&mut old).await.unwrap(), ["default"]);

    let new_root = Ca::root("rotated root");
    write_client_cas(tmp.path(), &new_root.pem);
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;

    assert_unauthenticated(templates(&mut old).await);
    let mut new = connect(dev.addr, tmp.path(), Some(&new_root.client(DEV_URI))).await;
    assert_eq!(templates(&mut new).await.unwrap(), ["default"]);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_under_an_intermediate_is_admitted_until_its_root_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let root = Ca::root("issuer root");
    let intermediate = root.intermediate("issuing intermediate");
    write_client_cas(
        tmp.path(),
        &format!("{}{}", dev_ca_pem(tmp.path()), root.pem),
    );
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    let identity = intermediate.leaf(vec![uri_san(DEV_URI)], None, Some(&intermediate.pem));
    let mut client = connect(dev.addr, tmp.path(), Some(&identity)).await;
    assert_eq!(templates(&mut client).await.unwrap(), ["default"]);

    // Without the intermediate in the presented chain the leaf does not verify.
    let bare = intermediate.leaf(vec![uri_san(DEV_URI)], None, None);
    let mut bare_client = connect(dev.addr, tmp.path(), Some(&bare)).await;
    assert_unauthenticated(templates(&mut bare_client).await);

    write_client_cas(tmp.path(), &dev_ca_pem(tmp.path()));
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    assert_unauthenticated(templates(&mut client).await);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_expiry_is_judged_by_the_injected_clock_on_an_open_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Arc::new(ShiftedClock::default());
    let dev = start_dev_with_clock(tmp.path(), clock.clone()).await;
    let root = Ca::root("short-lived root");
    write_client_cas(
        tmp.path(),
        &format!("{}{}", dev_ca_pem(tmp.path()), root.pem),
    );
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    let not_after = SystemClock.wall() + Duration::from_secs(24 * 3600);
    let identity = root.leaf(vec![uri_san(DEV_URI)], Some(not_after), None);
    let mut client = connect(dev.addr, tmp.path(), Some(&identity)).await;
    assert_eq!(templates(&mut client).await.unwrap(), ["default"]);

    clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert_unauthenticated(templates(&mut client).await);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_applies_to_the_next_request_on_an_open_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    assert_eq!(templates(&mut client).await.unwrap(), ["default"]);

    edit_manifest(tmp.path(), |m| {
        m["clients"][0]["mayAttestOwner"] = false.into();
        m["clients"][0]
            .as_object_mut()
            .unwrap()
            .remove("executionTemplates");
    });
    reload(&dev).await;
    assert!(
        templates(&mut client).await.unwrap().is_empty(),
        "nothing visible"
    );
    let refused = client
        .acquire_run(pb::AcquireRunRequest::default())
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        tonic::Code::InvalidArgument,
        "invalid_argument",
        false,
    );

    edit_manifest(tmp.path(), |m| {
        m["clients"].as_array_mut().unwrap().clear();
        m["clients"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"uri": "spiffe://dev.local/ns/default/other"}));
    });
    reload(&dev).await;
    assert_unauthenticated(templates(&mut client).await);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_or_speaking_tls_1_2_fails_the_handshake() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut anonymous = connect(dev.addr, tmp.path(), None).await;
    let status = templates(&mut anonymous).await.unwrap_err();
    assert!(
        execution_provider::server::status::error_detail(&status).is_none(),
        "the handshake fails before any gRPC status: {status:?}"
    );
    assert_ne!(status.code(), tonic::Code::Ok);

    let cas = execution_provider::runtime::tls::certificates_from_pem(&server_ca(tmp.path()), "ca")
        .unwrap();
    let identity = dev_identity(tmp.path());
    let config = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS12])
        .with_root_certificates(execution_provider::runtime::tls::root_store(&cas).unwrap())
        .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(dev.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    assert!(
        connector.connect(name, tcp).await.is_err(),
        "TLS 1.2 is refused"
    );
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_attestation_gets_the_codes_of_the_check_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let template = default_template(&mut client).await;
    edit_manifest(tmp.path(), |m| {
        m["clients"][0]["mayAttestOwner"] = false.into();
        m["clients"][0]
            .as_object_mut()
            .unwrap()
            .remove("executionTemplates");
    });
    reload(&dev).await;
    let code = |r: Result<(), tonic::Status>| r.unwrap_err().code();
    let ensure = client
        .ensure_template(pb::EnsureTemplateRequest {
            binding_id: "b".into(),
            template: Some(template),
            owner: Some(owner()),
            operation_id: "op".into(),
        })
        .await
        .map(drop);
    assert_eq!(
        code(ensure),
        tonic::Code::NotFound,
        "ensure: selector first"
    );
    let attach = client
        .attach_environment(pb::AttachEnvironmentRequest::default())
        .await
        .map(drop);
    assert_eq!(code(attach), tonic::Code::PermissionDenied);
    let files = client
        .files(pb::FileRequest {
            operation: pb::FileOperation::Read as i32,
            path: "x".into(),
            ..pb::FileRequest::default()
        })
        .await
        .map(drop);
    assert_eq!(code(files), tonic::Code::PermissionDenied);
    let unknown_op = client.files(pb::FileRequest::default()).await.map(drop);
    assert_eq!(
        code(unknown_op),
        tonic::Code::InvalidArgument,
        "operation first"
    );
    let command = client
        .start_command(pb::CommandStartRequest {
            command: "true".into(),
            ..pb::CommandStartRequest::default()
        })
        .await
        .map(drop);
    assert_eq!(code(command), tonic::Code::PermissionDenied);
    let status = client
        .command_status(pb::CommandQueryRequest::default())
        .await
        .map(drop);
    assert_eq!(
        code(status),
        tonic::Code::PermissionDenied,
        "data plane before shape"
    );
    let acquire = client
        .acquire_run(pb::AcquireRunRequest::default())
        .await
        .map(drop);
    assert_eq!(code(acquire), tonic::Code::InvalidArgument);
    let commit = client
        .commit_reference(pb::ReferenceMutationRequest::default())
        .await
        .map(drop);
    assert_eq!(code(commit), tonic::Code::InvalidArgument);
    let intents = client
        .list_reference_intents(pb::ListReferenceIntentsRequest::default())
        .await
        .map(drop);
    assert_eq!(code(intents), tonic::Code::InvalidArgument);
    assert!(templates(&mut client).await.unwrap().is_empty());
    dev.stop().await.unwrap();
}
