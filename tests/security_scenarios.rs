//! Scenarios of the api-security §9 catalogue about readiness, the error model and the
//! catalogue and reference RPCs, over real mTLS against `dev` (§9.3-5, §9.8-13). The full
//! scenario → test table is in docs/security.md.

mod common;
mod security;

use common::*;
use execution_provider::api::pb;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::server::status::{FENCE_UNKNOWN_MESSAGE, GENERIC_MESSAGE, error_detail};
use execution_provider::store::error::StoreError;
use kube::Api;
use security::*;
use tonic::Code;

async fn environments(dev: &execution_provider::cli::dev::DevProvider) -> usize {
    Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len()
}

fn create_file(context: pb::RequestContext) -> pb::FileRequest {
    pb::FileRequest {
        context: Some(context),
        operation: pb::FileOperation::Create as i32,
        path: "x.txt".into(),
        data: b"x".to_vec(),
        ..Default::default()
    }
}

/// Every RPC once with an empty request: the code of each.
async fn every_rpc_empty(c: &mut Client) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    vec![
        (
            "ValidateProfile",
            c.validate_profile(pb::ValidateProfileRequest::default())
                .await
                .map(drop),
        ),
        (
            "EnsureEnvironment",
            c.ensure_environment(pb::EnsureEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "ListExecutionTemplates",
            c.list_execution_templates(pb::ListExecutionTemplatesRequest::default())
                .await
                .map(drop),
        ),
        (
            "ValidateTemplate",
            c.validate_template(pb::ValidateTemplateRequest::default())
                .await
                .map(drop),
        ),
        (
            "EnsureTemplate",
            c.ensure_template(pb::EnsureTemplateRequest::default())
                .await
                .map(drop),
        ),
        (
            "AttachEnvironment",
            c.attach_environment(pb::AttachEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "AcquireRun",
            c.acquire_run(pb::AcquireRunRequest::default())
                .await
                .map(drop),
        ),
        (
            "RenewRun",
            c.renew_run(pb::RenewRunRequest::default()).await.map(drop),
        ),
        (
            "ReleaseRun",
            c.release_run(pb::ReleaseRunRequest::default())
                .await
                .map(drop),
        ),
        (
            "CommitReference",
            c.commit_reference(pb::ReferenceMutationRequest::default())
                .await
                .map(drop),
        ),
        (
            "AbortReference",
            c.abort_reference(pb::ReferenceMutationRequest::default())
                .await
                .map(drop),
        ),
        (
            "PrepareReferenceDelete",
            c.prepare_reference_delete(pb::ReferenceMutationRequest::default())
                .await
                .map(drop),
        ),
        (
            "ConfirmReferenceDelete",
            c.confirm_reference_delete(pb::ReferenceMutationRequest::default())
                .await
                .map(drop),
        ),
        (
            "CancelReferenceDelete",
            c.cancel_reference_delete(pb::ReferenceMutationRequest::default())
                .await
                .map(drop),
        ),
        (
            "ReserveSuccessor",
            c.reserve_successor(pb::ReserveSuccessorRequest::default())
                .await
                .map(drop),
        ),
        (
            "ListReferenceIntents",
            c.list_reference_intents(pb::ListReferenceIntentsRequest::default())
                .await
                .map(drop),
        ),
        (
            "ReleaseReference",
            c.release_reference(pb::ReleaseReferenceRequest::default())
                .await
                .map(drop),
        ),
        (
            "RetireEnvironment",
            c.retire_environment(pb::RetireEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "ReplaceExecutor",
            c.replace_executor(pb::ReplaceExecutorRequest::default())
                .await
                .map(drop),
        ),
        (
            "RecoverEnvironment",
            c.recover_environment(pb::RecoverEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "DeleteRetiredEnvironment",
            c.delete_retired_environment(pb::DeleteRetiredEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "RevokeEnvironment",
            c.revoke_environment(pb::RevokeEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        (
            "MigrateEnvironment",
            c.migrate_environment(pb::MigrateEnvironmentRequest::default())
                .await
                .map(drop),
        ),
        ("Files", c.files(pb::FileRequest::default()).await.map(drop)),
        (
            "StartCommand",
            c.start_command(pb::CommandStartRequest::default())
                .await
                .map(drop),
        ),
        (
            "CommandStatus",
            c.command_status(pb::CommandQueryRequest::default())
                .await
                .map(drop),
        ),
        (
            "CancelCommand",
            c.cancel_command(pb::CommandQueryRequest::default())
                .await
                .map(drop),
        ),
    ]
}

/// §9.3, §9.4, §9.13: with its authority withdrawn the replica answers every RPC, empty or
/// valid, UNAVAILABLE `not_ready` retryable; nothing is created and nothing dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unready_replica_answers_every_rpc_unavailable_and_dispatches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "b1").await.environment.unwrap();
    let claim = acquire(&mut client, "b1", &env).await;
    let good = std::fs::read(tmp.path().join("security/manifest.json")).unwrap();
    std::fs::write(
        tmp.path().join("security/manifest.json"),
        br#"{"version":2}"#,
    )
    .unwrap();
    assert!(dev.security_manager.reload().await.is_err());

    let results = every_rpc_empty(&mut client).await;
    assert_eq!(results.len(), 27, "every RPC of the service");
    for (rpc, result) in results {
        let status = result.expect_err(rpc);
        assert_refused(&status, Code::Unavailable, "not_ready", true);
    }
    let valid = client
        .files(create_file(context("b1", &claim)))
        .await
        .unwrap_err();
    assert_refused(&valid, Code::Unavailable, "not_ready", true);
    let ensured = client.ensure_template(pb::EnsureTemplateRequest {
        binding_id: "b2".into(),
        template: Some(pb::TemplateSelector {
            id: "default".into(),
            revision: "r".repeat(67),
        }),
        owner: Some(owner()),
        operation_id: "op-b2".into(),
    });
    assert_refused(
        &ensured.await.unwrap_err(),
        Code::Unavailable,
        "not_ready",
        true,
    );
    assert_eq!(environments(&dev).await, 1, "nothing was created");

    std::fs::write(tmp.path().join("security/manifest.json"), &good).unwrap();
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    let read = client
        .files(pb::FileRequest {
            operation: pb::FileOperation::Read as i32,
            data: Vec::new(),
            ..create_file(context("b1", &claim))
        })
        .await
        .unwrap_err();
    assert_eq!(
        read.code(),
        Code::NotFound,
        "the refused CREATE never reached the workspace"
    );
    client
        .files(create_file(context("b1", &claim)))
        .await
        .expect("the same call works when ready");
    dev.stop().await.unwrap();
}

/// §9.5: backend detail (tokens, paths, keys) never reaches a status; unknown failures are
/// INTERNAL `internal`; a fence is FAILED_PRECONDITION `fence_unknown`.
#[test]
fn backend_error_text_never_reaches_the_wire_and_a_fence_is_failed_precondition() {
    const SECRET: &str = "token=s3cr3t /var/run/secrets/kubernetes.io key=BEGIN PRIVATE KEY";
    let api = kube::Error::Api(
        kube::core::Status::failure(SECRET, "InternalError")
            .with_code(500)
            .boxed(),
    );
    let internal: tonic::Status = StoreError::Kube {
        env: SECRET.into(),
        source: api,
    }
    .into();
    let fence: tonic::Status = StoreError::FenceUnknown {
        env: SECRET.into(),
        reason: "lease lost",
    }
    .into();
    for (status, code, detail, message) in [
        (internal, Code::Internal, "internal", GENERIC_MESSAGE),
        (
            fence,
            Code::FailedPrecondition,
            "fence_unknown",
            FENCE_UNKNOWN_MESSAGE,
        ),
    ] {
        assert_eq!(status.code(), code);
        assert_eq!(status.message(), message, "a fixed message");
        assert_eq!(error_detail(&status).unwrap().code, detail);
        let everything = format!("{status:?}{}", String::from_utf8_lossy(status.details()));
        for word in ["s3cr3t", "/var/run", "PRIVATE KEY", "lease lost"] {
            assert!(!everything.contains(word), "{word} leaked: {everything}");
        }
    }
}

/// §9.8: ValidateTemplate writes nothing; EnsureTemplate twice creates one environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_template_is_read_only_and_ensure_template_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let template = default_template(&mut client).await;
    let request = pb::ValidateTemplateRequest {
        template: Some(template.clone()),
    };
    let validated = client
        .validate_template(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(validated.template, Some(template.clone()));
    assert_eq!(environments(&dev).await, 0, "validation is read-only");
    let ensure = pb::EnsureTemplateRequest {
        binding_id: "b1".into(),
        template: Some(template),
        owner: Some(owner()),
        operation_id: "op-b1".into(),
    };
    let first = client
        .ensure_template(ensure.clone())
        .await
        .unwrap()
        .into_inner();
    let second = client.ensure_template(ensure).await.unwrap().into_inner();
    assert_eq!(first.environment, second.environment);
    assert_eq!(
        environments(&dev).await,
        1,
        "one creation across two identical calls"
    );
    dev.stop().await.unwrap();
}

/// §9.9: an unknown and an unauthorised template are refused identically; a revisionless
/// selector is NOT_FOUND; a client that may see nothing gets an empty catalogue with
/// another inventory revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_unauthorised_templates_are_indistinguishable_and_a_hidden_catalog_is_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let template = default_template(&mut client).await;
    let full = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await;
    let full = full.unwrap().into_inner();
    const BLIND: &str = "spiffe://dev.local/ns/default/blind";
    edit_manifest(tmp.path(), |m| {
        m["clients"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
            "uri": BLIND, "mayAttestOwner": true, "executionTemplates": ["other"]}));
    });
    reload(&dev).await;
    let mut blind = connect(
        dev.addr,
        tmp.path(),
        Some(&identity_from_dev_ca(tmp.path(), BLIND)),
    )
    .await;
    let refusal = |r: Result<tonic::Response<pb::ValidateTemplateResponse>, tonic::Status>| {
        let s = r.unwrap_err();
        (
            s.code(),
            s.message().to_owned(),
            error_detail(&s).map(|d| d.code),
        )
    };
    let validate = |t: pb::TemplateSelector| pb::ValidateTemplateRequest { template: Some(t) };
    let unauthorised = refusal(blind.validate_template(validate(template.clone())).await);
    let unknown = pb::TemplateSelector {
        id: "nosuch".into(),
        ..template.clone()
    };
    assert_eq!(
        unauthorised,
        refusal(client.validate_template(validate(unknown)).await)
    );
    assert_eq!(unauthorised.0, Code::NotFound);
    let revisionless = pb::TemplateSelector {
        revision: String::new(),
        ..template
    };
    assert_eq!(
        refusal(client.validate_template(validate(revisionless)).await).0,
        Code::NotFound
    );
    let hidden = blind
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await;
    let hidden = hidden.unwrap().into_inner();
    assert!(hidden.items.is_empty());
    assert_ne!(hidden.inventory_revision, full.inventory_revision);
    dev.stop().await.unwrap();
}

/// §9.10 and §9.11: owner-mode discovery carries the attested owner; ReleaseReference needs
/// no run claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_mode_discovery_projects_the_owner_and_release_reference_needs_no_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure(&mut client, "b1").await.environment.unwrap();
    let successor = pb::ReserveSuccessorRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        source_binding_id: "b1".into(),
        destination_binding_id: "b2".into(),
        operation_id: "op-successor".into(),
    };
    client
        .reserve_successor(successor)
        .await
        .expect("an intent");
    let listed = client
        .list_reference_intents(pb::ListReferenceIntentsRequest {
            owner: Some(owner()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.intents.len(), 1);
    assert_eq!(
        listed.intents[0].owner,
        Some(owner()),
        "the attested owner is projected"
    );
    let release = pb::ReleaseReferenceRequest {
        context: Some(pb::RequestContext {
            environment: Some(env),
            owner: Some(owner()),
            binding_id: "b1".into(),
            ..Default::default()
        }),
    };
    client
        .release_reference(release)
        .await
        .expect("released without any run claim");
    dev.stop().await.unwrap();
}

/// §9.12: MigrateEnvironment needs an explicit source schema of at most 1: omitted or 2 is
/// INVALID_ARGUMENT, an explicit 0 passes validation (and is then refused by the store,
/// since every environment is already at schema 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_needs_an_explicit_source_schema_of_at_most_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure(&mut client, "b1").await.environment.unwrap();
    let migrate = |schema: Option<u32>| pb::MigrateEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_schema_version: schema,
        expected_pod_uid: "pod".into(),
        expected_pvc_uid: "pvc".into(),
        operation_id: "migrate-1".into(),
    };
    for (schema, code) in [
        (None, Code::InvalidArgument),
        (Some(2), Code::InvalidArgument),
        (Some(0), Code::Aborted),
    ] {
        let status = client
            .migrate_environment(migrate(schema))
            .await
            .unwrap_err();
        assert_eq!(status.code(), code, "{schema:?}");
    }
    dev.stop().await.unwrap();
}

/// §9.6: a command state outside the enum never decodes; the transport treats the answer as
/// uncertain, so the dispatch fences and the caller gets the fixed `fence_unknown` refusal,
/// never the helper's text.
#[test]
fn a_command_state_outside_the_enum_is_refused_as_an_uncertain_executor_answer() {
    use execution_provider::executor::transport::{TransportError, decode_envelope};
    let good = br#"{"response":{"command":{"state":"succeeded"}}}"#;
    assert!(decode_envelope(good).is_ok());
    let odd = br#"{"response":{"command":{"state":"exploded","stdout":"c2VjcmV0"}}}"#;
    let err = decode_envelope(odd).unwrap_err();
    assert!(
        matches!(err, TransportError::InvalidResponse { .. }),
        "{err:?}"
    );
    assert!(
        err.is_uncontrolled(),
        "an unreadable answer may hide a running command"
    );
}
