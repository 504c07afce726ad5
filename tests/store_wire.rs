//! The reference and admin RPCs through the real gRPC server (`dev` in-process, mTLS): the
//! wire codes of api-security §4.3 and the stable `ErrorDetail.code`s.

mod common;

use common::*;
use execution_provider::api::pb;
use execution_provider::server::status::error_detail;
use tonic::Code;

fn code_of<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    let status = r.expect_err("refused");
    let detail = error_detail(&status).map(|d| d.code).unwrap_or_default();
    (status.code(), detail)
}

fn mutation(env: &pb::EnvironmentRef, binding: &str, op: &str) -> pb::ReferenceMutationRequest {
    pb::ReferenceMutationRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        binding_id: binding.into(),
        operation_id: op.into(),
    }
}

#[tokio::test]
async fn reference_intents_answer_with_the_specified_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure(&mut client, "src").await.environment.expect("env");
    let reserve = |dst: &str, op: &str| pb::ReserveSuccessorRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        source_binding_id: "src".into(),
        destination_binding_id: dst.into(),
        operation_id: op.into(),
    };
    let same = client.reserve_successor(reserve("src", "op-r")).await;
    assert_eq!(
        code_of(same),
        (Code::InvalidArgument, "invalid_argument".into())
    );
    let reply = client
        .reserve_successor(reserve("dst", "op-r"))
        .await
        .expect("reserve");
    assert_eq!(reply.into_inner().environment.as_ref(), Some(&env));
    client
        .reserve_successor(reserve("dst", "op-r"))
        .await
        .expect("replay");
    let exact = client
        .list_reference_intents(pb::ListReferenceIntentsRequest {
            owner: Some(owner()),
            limit: 0,
            environment: Some(env.clone()),
            binding_id: "dst".into(),
        })
        .await
        .expect("exact")
        .into_inner();
    assert_eq!(exact.intents.len(), 1);
    assert_eq!(exact.intents[0].state, "PendingCreate");
    assert_eq!(exact.intents[0].source_binding_id, "src");
    assert_eq!(exact.intents[0].owner, Some(owner()));
    let by_client = client
        .list_reference_intents(pb::ListReferenceIntentsRequest::default())
        .await
        .expect("client mode")
        .into_inner();
    assert_eq!(by_client.intents.len(), 1);
    assert_eq!(by_client.intents[0].owner, Some(owner()));
    let too_many = client
        .list_reference_intents(pb::ListReferenceIntentsRequest {
            limit: 65,
            ..Default::default()
        })
        .await;
    assert_eq!(code_of(too_many).0, Code::InvalidArgument);
    let wrong_op = client.abort_reference(mutation(&env, "dst", "op-x")).await;
    assert_eq!(code_of(wrong_op), (Code::Aborted, "conflict".into()));
    let missing = client
        .prepare_reference_delete(mutation(&env, "nobody", "op"))
        .await;
    assert_eq!(code_of(missing), (Code::NotFound, "not_found".into()));
    let mut foreign = mutation(&env, "dst", "op-r");
    foreign.owner = Some(pb::Owner {
        issuer: "https://issuer.test".into(),
        subject: "mallory".into(),
    });
    assert_eq!(
        code_of(client.commit_reference(foreign).await).0,
        Code::NotFound
    );
    client
        .abort_reference(mutation(&env, "dst", "op-r"))
        .await
        .expect("abort");
    client
        .prepare_reference_delete(mutation(&env, "src", "op-d"))
        .await
        .expect("prepare");
    client
        .cancel_reference_delete(mutation(&env, "src", "op-d"))
        .await
        .expect("cancel");
    dev.stop().await.unwrap();
}

#[tokio::test]
async fn admin_rpcs_answer_with_the_specified_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure(&mut client, "b1").await.environment.expect("env");
    let revoke = |expected: u64, op: &str| pb::RevokeEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_grant_generation: expected,
        operation_id: op.into(),
    };
    let generation = client
        .revoke_environment(revoke(1, "rev-1"))
        .await
        .expect("revoke");
    assert_eq!(generation.into_inner().grant_generation, 2);
    let replay = client
        .revoke_environment(revoke(1, "rev-1"))
        .await
        .expect("replay");
    assert_eq!(replay.into_inner().grant_generation, 2);
    assert_eq!(
        code_of(client.revoke_environment(revoke(1, "rev-2")).await),
        (Code::Aborted, "conflict".into())
    );
    assert_eq!(
        code_of(client.revoke_environment(revoke(0, "rev-3")).await).0,
        Code::InvalidArgument
    );
    let mut foreign = revoke(2, "rev-4");
    foreign.owner = Some(pb::Owner {
        issuer: "https://issuer.test".into(),
        subject: "mallory".into(),
    });
    assert_eq!(
        code_of(client.revoke_environment(foreign).await).0,
        Code::NotFound
    );
    let retire = |epoch: u64| pb::RetireEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_execution_epoch: epoch,
        expected_pod_uid: "pod".into(),
        expected_pvc_uid: "pvc".into(),
        operation_id: "retire-1".into(),
    };
    assert_eq!(
        code_of(client.retire_environment(retire(0)).await).0,
        Code::PermissionDenied
    );
    assert_eq!(
        code_of(client.retire_environment(retire(1)).await).0,
        Code::Aborted
    );
    let migrate = |schema: Option<u32>| pb::MigrateEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_schema_version: schema,
        expected_pod_uid: "pod".into(),
        expected_pvc_uid: "pvc".into(),
        operation_id: "migrate-1".into(),
    };
    assert_eq!(
        code_of(client.migrate_environment(migrate(None)).await).0,
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(client.migrate_environment(migrate(Some(0))).await).0,
        Code::Aborted
    );
    let delete = pb::DeleteRetiredEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_pvc_uid: "pvc".into(),
        operation_id: "delete-1".into(),
    };
    assert_eq!(
        code_of(client.delete_retired_environment(delete).await).0,
        Code::Aborted
    );
    dev.stop().await.unwrap();
}
