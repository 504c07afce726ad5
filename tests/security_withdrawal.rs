//! Withdrawal of authority over real mTLS (api-security §4.5, §6.5; §9.21, §9.35 and the
//! era-A grant scenarios of §9.37): a peer replica publishing a newer authority stops this
//! replica before its own reload, a command whose authority is withdrawn while it runs ends
//! `fence_unknown` with the fence persisted, a key revocation seen first by a peer refuses
//! the data plane with nothing dispatched until this replica reloads, projection skew between
//! the manifest and key files converges, and an active key expiring between reloads makes the
//! replica unready.

mod common;
mod security;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::DevProvider;
use execution_provider::kube::crd::{ExecutionEnvironment, FenceState, RfcTime};
use execution_provider::runtime::{Clock, OsIds};
use execution_provider::security::SecurityManifest;
use execution_provider::security::keys;
use execution_provider::security::ledger::{AuthorityLedger, LedgerRecord};
use execution_provider::security::manager::DEFAULT_AUTHORITY_CONFIGMAP;
use kube::Api;
use security::*;
use tonic::Code;

fn manifest_path(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("security/manifest.json")
}

/// The current manifest with its generation bumped and `edit` applied, not yet written.
fn next_manifest(
    dir: &std::path::Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> serde_json::Value {
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest_path(dir)).unwrap()).unwrap();
    m["generation"] = (m["generation"].as_u64().unwrap() + 1).into();
    edit(&mut m);
    m
}

fn write(dir: &std::path::Path, m: &serde_json::Value) {
    std::fs::write(manifest_path(dir), serde_json::to_vec_pretty(m).unwrap()).unwrap();
}

/// A peer replica publishes `m` to the ledger; this replica notices on its next refresh.
async fn peer_publishes(dev: &DevProvider, m: &serde_json::Value) {
    let parsed = SecurityManifest::parse(&serde_json::to_vec(m).unwrap()).unwrap();
    let ledger = AuthorityLedger::new(dev.kube.clone(), "execution", DEFAULT_AUTHORITY_CONFIGMAP);
    ledger.publish(&LedgerRecord::of(&parsed)).await.unwrap();
    dev.security_manager.refresh().await;
}

/// Writes a new key file and returns its manifest entry (active, verifying until `until`).
fn new_key(dir: &std::path::Path, id: &str, version: u64, until: &str) -> serde_json::Value {
    let (pem, print) = keys::generate(&OsIds);
    std::fs::write(dir.join(format!("security/{id}.key")), pem).unwrap();
    serde_json::json!({"id": id, "version": version, "file": format!("{id}.key"),
        "publicKeySHA256": print, "activateAt": "2020-01-01T00:00:00Z",
        "verifyUntil": until, "state": "active"})
}

fn switch_to(m: &mut serde_json::Value, key: serde_json::Value, old_state: &str) {
    m["keys"][0]["state"] = old_state.into();
    m["activeKeyID"] = key["id"].clone();
    m["keys"].as_array_mut().unwrap().push(key);
}

fn file(context: pb::RequestContext, operation: pb::FileOperation, data: &[u8]) -> pb::FileRequest {
    pb::FileRequest {
        context: Some(context),
        operation: operation as i32,
        path: "note.txt".into(),
        data: data.to_vec(),
        ..Default::default()
    }
}

async fn renew(
    client: &mut Client,
    binding: &str,
    claim: &pb::RunClaimResponse,
    op: &str,
) -> pb::RunClaimResponse {
    let request = pb::RenewRunRequest {
        environment: claim.environment.clone(),
        owner: Some(owner()),
        binding_id: binding.into(),
        run_id: claim.run_id.clone(),
        claim_id: claim.claim_id.clone(),
        epoch: claim.epoch,
        operation_id: op.into(),
        ttl_millis: 60_000,
        grant_generation: claim.grant_generation,
    };
    client
        .renew_run(request)
        .await
        .expect("renewed")
        .into_inner()
}

/// §9.21: a peer publishes a generation without `mayAttestOwner`; this replica refuses
/// before its own reload (UNAVAILABLE) and applies the new policy after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_withdrawing_attestation_is_refused_before_this_replica_reloads_and_applied_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure(&mut client, "b1").await.environment.unwrap();
    let withdrawn = next_manifest(dir, |m| {
        m["clients"][0]["mayAttestOwner"] = false.into();
        m["clients"][0]
            .as_object_mut()
            .unwrap()
            .remove("executionTemplates");
    });
    peer_publishes(&dev, &withdrawn).await;
    let acquire = pb::AcquireRunRequest {
        environment: Some(env),
        owner: Some(owner()),
        binding_id: "b1".into(),
        run_id: "run-1".into(),
        operation_id: "acquire-1".into(),
        ttl_millis: 60_000,
    };
    let before = client.acquire_run(acquire.clone()).await.unwrap_err();
    assert_refused(&before, Code::Unavailable, "not_ready", true);
    write(dir, &withdrawn);
    reload(&dev).await;
    let after = client.acquire_run(acquire).await.unwrap_err();
    assert_refused(&after, Code::InvalidArgument, "invalid_argument", false);
    dev.stop().await.unwrap();
}

/// §9.35: the ledger generation advances while a command runs: the call ends
/// `fence_unknown`, the fence is persisted, and the next call is refused without dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_withdrawal_while_a_command_runs_ends_it_fence_unknown_and_persists_the_fence() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "b1").await.environment.unwrap();
    let claim = acquire(&mut client, "b1", &env).await;
    let start = pb::CommandStartRequest {
        context: Some(context("b1", &claim)),
        command: "touch started && sleep 2".into(),
        timeout_millis: 0,
        ..Default::default()
    };
    let running = {
        let mut client = client.clone();
        let start = start.clone();
        tokio::spawn(async move { client.start_command(start).await })
    };
    let api = Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution");
    let marker = dev.state.workspaces_dir().join(&env.id).join("started");
    eventually(Duration::from_secs(10), "the command is running", || {
        let found = marker.exists();
        async move { found.then_some(()) }
    })
    .await;
    peer_publishes(&dev, &next_manifest(dir, |_| {})).await;
    let ended = running.await.unwrap().unwrap_err();
    assert_eq!(ended.code(), Code::FailedPrecondition, "{ended:?}");
    assert_eq!(
        execution_provider::server::status::error_detail(&ended)
            .unwrap()
            .code,
        "fence_unknown"
    );
    let status = api.get(&env.id).await.unwrap().status.unwrap();
    assert_eq!(
        status.fence_state,
        Some(FenceState::FenceUnknown),
        "the fence is persisted"
    );
    let refused = client.start_command(start).await.unwrap_err();
    assert_refused(&refused, Code::Unavailable, "not_ready", true);
    dev.stop().await.unwrap();
}

/// §9.35: the client's CA is removed while its command runs (no new generation needed): the
/// call ends `fence_unknown` and the fence is persisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_removal_while_a_command_runs_ends_it_fence_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let root = Ca::root("second root");
    write_client_cas(dir, &format!("{}{}", dev_ca_pem(dir), root.pem));
    reload(&dev).await;
    let identity = root.client("spiffe://dev.local/ns/default/client");
    let mut client = connect(dev.addr, dir, Some(&identity)).await;
    let env = ensure_ready(&mut client, "b1").await.environment.unwrap();
    let claim = acquire(&mut client, "b1", &env).await;
    let start = pb::CommandStartRequest {
        context: Some(context("b1", &claim)),
        command: "touch started && sleep 2".into(),
        timeout_millis: 0,
        ..Default::default()
    };
    let running = {
        let mut client = client.clone();
        tokio::spawn(async move { client.start_command(start).await })
    };
    let marker = dev.state.workspaces_dir().join(&env.id).join("started");
    eventually(Duration::from_secs(10), "the command is running", || {
        let found = marker.exists();
        async move { found.then_some(()) }
    })
    .await;
    write_client_cas(dir, &dev_ca_pem(dir));
    reload(&dev).await;
    let ended = running.await.unwrap().unwrap_err();
    assert_eq!(ended.code(), Code::FailedPrecondition, "{ended:?}");
    let api = Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution");
    let status = api.get(&env.id).await.unwrap().status.unwrap();
    assert_eq!(status.fence_state, Some(FenceState::FenceUnknown));
    dev.stop().await.unwrap();
}

/// §9.37: a peer publishes the generation revoking the key that signed this client's grant;
/// this lagging replica refuses the data plane UNAVAILABLE retryable with nothing dispatched,
/// and after its own reload the old grant is refused and a renewed one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_after_a_key_revocation_is_unavailable_without_dispatch_until_it_reloads()
{
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "b1").await.environment.unwrap();
    let claim = acquire(&mut client, "b1", &env).await;
    let revoking = next_manifest(dir, |m| {
        switch_to(
            m,
            new_key(dir, "second", 2, "2100-01-01T00:00:00Z"),
            "revoked",
        )
    });
    peer_publishes(&dev, &revoking).await;
    let create = file(context("b1", &claim), pb::FileOperation::Create, b"note");
    let lagging = client.files(create.clone()).await.unwrap_err();
    assert_refused(&lagging, Code::Unavailable, "not_ready", true);

    write(dir, &revoking);
    reload(&dev).await;
    let old = client.files(create).await.unwrap_err();
    assert_refused(&old, Code::PermissionDenied, "permission_denied", false);
    let renewed = renew(&mut client, "b1", &claim, "renew-1").await;
    let read = file(context("b1", &renewed), pb::FileOperation::Read, b"");
    assert_eq!(
        client.files(read.clone()).await.unwrap_err().code(),
        Code::NotFound,
        "nothing was dispatched"
    );
    client
        .files(file(
            context("b1", &renewed),
            pb::FileOperation::Create,
            b"note",
        ))
        .await
        .unwrap();
    assert_eq!(client.files(read).await.unwrap().into_inner().data, b"note");
    dev.stop().await.unwrap();
}

/// §9.37: projection skew with immutable file names converges: a manifest naming a key file
/// not yet projected fails its reload (not ready) until the file arrives; a key file arriving
/// before its manifest changes nothing until the manifest follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_first_and_material_first_projection_skew_converges() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "b1").await.environment.unwrap();
    let claim = acquire(&mut client, "b1", &env).await;

    let key = new_key(dir, "second", 2, "2100-01-01T00:00:00Z");
    let held = std::fs::read(dir.join("security/second.key")).unwrap();
    std::fs::remove_file(dir.join("security/second.key")).unwrap();
    write(
        dir,
        &next_manifest(dir, |m| switch_to(m, key, "verify-only")),
    );
    assert!(
        dev.security_manager.reload().await.is_err(),
        "manifest first"
    );
    assert!(!dev.security.ready());
    std::fs::write(dir.join("security/second.key"), held).unwrap();
    reload(&dev).await;
    let renewed = renew(&mut client, "b1", &claim, "renew-1").await;
    assert_eq!(
        execution_provider::security::grant::decode(&renewed.grant)
            .unwrap()
            .0,
        "second"
    );

    let third = new_key(dir, "third", 3, "2100-01-01T00:00:00Z");
    reload(&dev).await;
    let unchanged = renew(&mut client, "b1", &renewed, "renew-2").await;
    assert_eq!(
        execution_provider::security::grant::decode(&unchanged.grant)
            .unwrap()
            .0,
        "second",
        "material first"
    );
    write(
        dir,
        &next_manifest(dir, |m| switch_to(m, third, "verify-only")),
    );
    reload(&dev).await;
    let last = renew(&mut client, "b1", &unchanged, "renew-3").await;
    assert_eq!(
        execution_provider::security::grant::decode(&last.grant)
            .unwrap()
            .0,
        "third"
    );
    dev.stop().await.unwrap();
}

/// §9.37: the active key's window ends between reload ticks: the replica is unready at once
/// (every RPC UNAVAILABLE, so nothing is signed) without any reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_key_expiring_between_reloads_makes_the_replica_unready_and_stops_signing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let clock = Arc::new(ShiftedClock::default());
    let dev = start_dev_with_clock(dir, clock.clone()).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure(&mut client, "b1").await.environment.unwrap();
    let until = RfcTime::from_system_time(clock.wall() + Duration::from_secs(3600)).whole_seconds();
    let key = new_key(dir, "short", 2, &until.to_string());
    write(
        dir,
        &next_manifest(dir, |m| switch_to(m, key, "verify-only")),
    );
    reload(&dev).await;
    assert!(dev.security.ready());
    clock.advance(Duration::from_secs(2 * 3600));
    assert!(!dev.security.ready(), "no reload was needed");
    let acquire = pb::AcquireRunRequest {
        environment: Some(env),
        owner: Some(owner()),
        binding_id: "b1".into(),
        run_id: "run-1".into(),
        operation_id: "acquire-1".into(),
        ttl_millis: 60_000,
    };
    let refused = client.acquire_run(acquire).await.unwrap_err();
    assert_refused(&refused, Code::Unavailable, "not_ready", true);
    dev.stop().await.unwrap();
}
