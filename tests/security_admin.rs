//! Scoped administration over real mTLS (api-security §4.3 admin subject rules; §9.28, §9.31,
//! §9.33, §9.36): every admin route refuses a non-admin with PERMISSION_DENIED, answers an
//! admin outside its scope exactly as for an absent environment, refuses a wrong owner or
//! revision with NOT_FOUND and a stale runtime identity with ABORTED; successful calls
//! persist and replay, receipts stay bound to owner, scope and actor, and a scoped admin
//! never reaches another creator's data plane or intents.

mod common;
mod security;

use common::*;
use execution_provider::api::pb;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::server::status::error_detail;
use kube::Api;
use security::*;
use tonic::Code;

const CREATOR: &str = "spiffe://dev.local/ns/default/client";
const ADMIN: &str = "spiffe://dev.local/ns/ops/admin";
const UNSCOPED: &str = "spiffe://dev.local/ns/ops/unscoped";
const VIEWER: &str = "spiffe://dev.local/ns/default/viewer";

#[derive(Clone, Copy, Debug)]
enum Route {
    Retire,
    Replace,
    Recover,
    Delete,
    Migrate,
    Revoke,
}

const ROUTES: [Route; 6] = [
    Route::Retire,
    Route::Replace,
    Route::Recover,
    Route::Delete,
    Route::Migrate,
    Route::Revoke,
];

/// What an admin call names: the environment, its owner and its exact runtime identity.
#[derive(Clone, Debug)]
struct Target {
    env: pb::EnvironmentRef,
    owner: pb::Owner,
    epoch: u64,
    pod: String,
    pvc: String,
    schema: u32,
    generation: u64,
}

async fn call(
    client: &mut Client,
    route: Route,
    t: &Target,
    op: &str,
) -> Result<(), tonic::Status> {
    let (environment, owner, operation_id) =
        (Some(t.env.clone()), Some(t.owner.clone()), op.to_owned());
    let (epoch, pod, pvc) = (t.epoch, t.pod.clone(), t.pvc.clone());
    match route {
        Route::Retire => client
            .retire_environment(pb::RetireEnvironmentRequest {
                environment,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            })
            .await
            .map(drop),
        Route::Replace => client
            .replace_executor(pb::ReplaceExecutorRequest {
                environment,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            })
            .await
            .map(drop),
        Route::Recover => client
            .recover_environment(pb::RecoverEnvironmentRequest {
                environment,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            })
            .await
            .map(drop),
        Route::Delete => client
            .delete_retired_environment(pb::DeleteRetiredEnvironmentRequest {
                environment,
                owner,
                expected_pvc_uid: pvc,
                operation_id,
            })
            .await
            .map(drop),
        Route::Migrate => client
            .migrate_environment(pb::MigrateEnvironmentRequest {
                environment,
                owner,
                expected_schema_version: Some(t.schema),
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            })
            .await
            .map(drop),
        Route::Revoke => client
            .revoke_environment(pb::RevokeEnvironmentRequest {
                environment,
                owner,
                expected_grant_generation: t.generation,
                operation_id,
            })
            .await
            .map(drop),
    }
}

/// Code, message and detail of a refusal.
fn refusal(result: Result<(), tonic::Status>) -> (Code, String, String) {
    let status = result.expect_err("refused");
    let detail = error_detail(&status).map(|d| d.code).unwrap_or_default();
    (status.code(), status.message().to_owned(), detail)
}

async fn environment(
    dev: &execution_provider::cli::dev::DevProvider,
    id: &str,
) -> ExecutionEnvironment {
    Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution")
        .get(id)
        .await
        .expect("the environment exists")
}

async fn target(
    dev: &execution_provider::cli::dev::DevProvider,
    env: &pb::EnvironmentRef,
) -> Target {
    let o = environment(dev, &env.id).await;
    let s = o.status.expect("a status");
    Target {
        env: env.clone(),
        owner: owner(),
        epoch: s.epoch.expect("an epoch"),
        pod: s.pod.expect("a pod").uid,
        pvc: s.pvc.expect("a pvc").uid,
        schema: 0,
        generation: s.grant_generation.expect("a grant generation"),
    }
}

/// The policy of the scenarios: the creator is not an admin, ADMIN administers the creator,
/// UNSCOPED administers nobody, VIEWER is a plain client.
fn scoped_policy(m: &mut serde_json::Value, creator_admin: bool, admin_scope: &[&str]) {
    m["clients"] = serde_json::json!([
        {"uri": CREATOR, "mayAttestOwner": true, "administrator": creator_admin,
         "executionTemplates": ["default"]},
        {"uri": ADMIN, "administrator": true, "administratorFor": admin_scope},
        {"uri": UNSCOPED, "administrator": true},
        {"uri": VIEWER, "mayAttestOwner": true, "executionTemplates": ["default"]},
    ]);
}

/// The refusals every route gives before touching state (§9.28 first bullets).
async fn assert_route_refusals(
    dev: &execution_provider::cli::dev::DevProvider,
    t: &Target,
    dir: &std::path::Path,
) {
    let mut creator = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, CREATOR))).await;
    let mut admin = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, ADMIN))).await;
    let mut unscoped = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, UNSCOPED))).await;
    let mut viewer = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, VIEWER))).await;
    let absent = Target {
        env: pb::EnvironmentRef {
            id: "ee-absent".into(),
            revision: t.env.revision.clone(),
        },
        ..t.clone()
    };
    for route in ROUTES {
        let denied = refusal(call(&mut viewer, route, t, "op-x").await);
        assert_eq!(
            (denied.0, denied.2.as_str()),
            (Code::PermissionDenied, "permission_denied"),
            "{route:?}"
        );
        let denied = refusal(call(&mut creator, route, t, "op-x").await);
        assert_eq!(
            denied.0,
            Code::PermissionDenied,
            "creator without admin: {route:?}"
        );
        let hidden = refusal(call(&mut unscoped, route, t, "op-x").await);
        let missing = refusal(call(&mut admin, route, &absent, "op-x").await);
        assert_eq!(hidden, missing, "out of scope looks absent: {route:?}");
        assert_eq!(hidden.0, Code::NotFound, "{route:?}");
        let mut wrong_owner = t.clone();
        wrong_owner.owner.subject = "mallory".into();
        assert_eq!(
            refusal(call(&mut admin, route, &wrong_owner, "op-x").await),
            missing,
            "{route:?}"
        );
        let mut stale_revision = t.clone();
        stale_revision.env.revision = "stale-revision".into();
        assert_eq!(
            refusal(call(&mut admin, route, &stale_revision, "op-x").await),
            missing,
            "{route:?}"
        );
        for stale in stale_identities(route, t) {
            let aborted = refusal(call(&mut admin, route, &stale, "op-x").await);
            assert_eq!(aborted.0, Code::Aborted, "{route:?} {stale:?}");
        }
    }
}

/// Targets with one stale runtime identity each, as the route checks them.
fn stale_identities(route: Route, t: &Target) -> Vec<Target> {
    let epoch = Target {
        epoch: t.epoch + 1,
        ..t.clone()
    };
    let pod = Target {
        pod: "stale-pod".into(),
        ..t.clone()
    };
    let pvc = Target {
        pvc: "stale-pvc".into(),
        ..t.clone()
    };
    match route {
        Route::Retire | Route::Replace | Route::Recover => vec![epoch, pod, pvc],
        Route::Delete => vec![pvc],
        Route::Migrate => vec![
            Target {
                schema: 1,
                ..t.clone()
            },
            pod,
            pvc,
        ],
        Route::Revoke => vec![Target {
            generation: t.generation + 5,
            ..t.clone()
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_checks_gate_scope_owner_revision_and_exact_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "b1")
        .await
        .environment
        .expect("env");
    edit_manifest(dir, |m| scoped_policy(m, false, &[CREATOR]));
    reload(&dev).await;
    let t = target(&dev, &env).await;
    let before = environment(&dev, &env.id).await;
    assert_route_refusals(&dev, &t, dir).await;
    let after = environment(&dev, &env.id).await;
    assert_eq!(before.status, after.status, "no refusal changed anything");
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_admin_receipts_persist_replay_and_stay_bound_to_owner_scope_and_actor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "b1")
        .await
        .environment
        .expect("env");
    edit_manifest(dir, |m| scoped_policy(m, false, &[CREATOR]));
    reload(&dev).await;
    let mut admin = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, ADMIN))).await;
    let t = target(&dev, &env).await;
    let spec_before = environment(&dev, &env.id).await.spec;

    // Revocation: one receipt, generation + 1, and an exact replay answers the same.
    call(&mut admin, Route::Revoke, &t, "revoke-a")
        .await
        .expect("revoke");
    call(&mut admin, Route::Revoke, &t, "revoke-a")
        .await
        .expect("replay");
    let status = environment(&dev, &env.id).await.status.unwrap();
    assert_eq!(status.grant_generation, Some(t.generation + 1));
    assert_eq!(status.revocation_receipts.len(), 1);

    // Replacement: admitted with the exact identity, replayed exactly; a replay with another
    // owner is NOT_FOUND.
    call(&mut admin, Route::Replace, &t, "replace-a")
        .await
        .expect("replace");
    call(&mut admin, Route::Replace, &t, "replace-a")
        .await
        .expect("replace replay");
    let mut foreign = t.clone();
    foreign.owner.subject = "mallory".into();
    assert_eq!(
        refusal(call(&mut admin, Route::Replace, &foreign, "replace-a").await).0,
        Code::NotFound
    );
    let spec_after = environment(&dev, &env.id).await.spec;
    assert_eq!(
        (
            &spec_after.client_hash,
            &spec_after.owner_hash,
            &spec_after.revision
        ),
        (
            &spec_before.client_hash,
            &spec_before.owner_hash,
            &spec_before.revision
        ),
        "admin calls never change who created or owns the environment"
    );

    // The creator made administrator (no scope) may administer its own environment, but a
    // receipt of another actor is not its receipt.
    edit_manifest(dir, |m| scoped_policy(m, true, &[CREATOR]));
    reload(&dev).await;
    let mut creator = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let replayed_by_other = refusal(call(&mut creator, Route::Revoke, &t, "revoke-a").await);
    assert_eq!(
        replayed_by_other.0,
        Code::Aborted,
        "the receipt fingerprint binds the actor"
    );
    let current = Target {
        generation: t.generation + 1,
        ..t.clone()
    };
    call(&mut creator, Route::Revoke, &current, "revoke-self")
        .await
        .expect("self-administer");

    // Scope removed: even exact receipt replays are NOT_FOUND.
    edit_manifest(dir, |m| scoped_policy(m, true, &[UNSCOPED]));
    reload(&dev).await;
    assert_eq!(
        refusal(call(&mut admin, Route::Revoke, &t, "revoke-a").await).0,
        Code::NotFound
    );
    assert_eq!(
        refusal(call(&mut admin, Route::Replace, &t, "replace-a").await).0,
        Code::NotFound
    );
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_admin_with_attestation_never_reaches_another_creators_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    // Ready first: the reconciler's own writes must not count as a change made by a refusal.
    let env = ensure_ready(&mut client, "b1")
        .await
        .environment
        .expect("env");
    edit_manifest(dir, |m| {
        scoped_policy(m, false, &[CREATOR]);
        m["clients"][1]["mayAttestOwner"] = true.into();
        m["clients"][1]["executionTemplates"] = serde_json::json!(["default"]);
    });
    reload(&dev).await;
    let before = environment(&dev, &env.id).await;
    let mut admin = connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, ADMIN))).await;
    let acquire = admin
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: "b1".into(),
            run_id: "run-1".into(),
            operation_id: "acquire-1".into(),
            ttl_millis: 60_000,
        })
        .await;
    assert_eq!(acquire.unwrap_err().code(), Code::NotFound);
    let attach = admin
        .attach_environment(pb::AttachEnvironmentRequest {
            context: Some(pb::RequestContext {
                environment: Some(env.clone()),
                owner: Some(owner()),
                binding_id: "b1".into(),
                ..Default::default()
            }),
            purpose: "session".into(),
        })
        .await;
    assert_eq!(attach.unwrap_err().code(), Code::NotFound);
    let exact = admin
        .list_reference_intents(pb::ListReferenceIntentsRequest {
            owner: Some(owner()),
            limit: 0,
            environment: Some(env.clone()),
            binding_id: "b1".into(),
        })
        .await;
    assert_eq!(exact.unwrap_err().code(), Code::NotFound);
    for owner in [Some(owner()), None] {
        let listed = admin
            .list_reference_intents(pb::ListReferenceIntentsRequest {
                owner,
                ..Default::default()
            })
            .await
            .expect("discovery")
            .into_inner();
        assert!(
            listed.intents.is_empty(),
            "foreign intents are never listed"
        );
    }
    assert_eq!(
        environment(&dev, &env.id).await.status,
        before.status,
        "nothing changed"
    );
    let own = ensure(&mut admin, "admin-own")
        .await
        .environment
        .expect("its own environment");
    assert_ne!(own.id, env.id);
    dev.stop().await.unwrap();
}
