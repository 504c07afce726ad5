//! Signed grants over real mTLS (DECISIONS 4; api-security §4.4 step 5, §5, §9.37): minted on
//! AcquireRun/RenewRun, required beside the durable run claim on every data-plane call,
//! bound exactly to the claim, expiring by the injected clock, and rotated or revoked through
//! the manifest's keyring with the connection held open. Also replays the committed fuzz
//! regressions of grant decoding and manifest parsing (`fuzz/regressions/`, docs/testing.md).

mod common;
mod security;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::runtime::OsIds;
use execution_provider::security::grant;
use execution_provider::security::keys;
use security::*;

type Client = common::Client;

async fn read(client: &mut Client, context: pb::RequestContext) -> Result<Vec<u8>, tonic::Status> {
    let response = client
        .files(pb::FileRequest {
            context: Some(context),
            operation: pb::FileOperation::Read as i32,
            path: "note.txt".into(),
            ..pb::FileRequest::default()
        })
        .await?;
    Ok(response.into_inner().data)
}

async fn write(client: &mut Client, context: pb::RequestContext) -> Result<(), tonic::Status> {
    client
        .files(pb::FileRequest {
            context: Some(context),
            operation: pb::FileOperation::Create as i32,
            path: "note.txt".into(),
            data: b"note".to_vec(),
            ..pb::FileRequest::default()
        })
        .await
        .map(drop)
}

fn kid(token: &str) -> String {
    grant::decode(token).unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_plane_call_needs_a_grant_bound_exactly_to_its_current_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "grants")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "grants", &env).await;
    assert_eq!(kid(&claim.grant), "dev-grant");

    let denied = |s: tonic::Status| {
        assert_refused(
            &s,
            tonic::Code::PermissionDenied,
            "permission_denied",
            false,
        )
    };
    let mut missing = context("grants", &claim);
    missing.grant.clear();
    denied(write(&mut client, missing).await.unwrap_err());
    let mut tampered = context("grants", &claim);
    tampered.grant.push('A');
    denied(write(&mut client, tampered).await.unwrap_err());
    let mut oversized = context("grants", &claim);
    oversized.grant = "a".repeat(grant::MAX_GRANT_BYTES + 1);
    denied(write(&mut client, oversized).await.unwrap_err());
    // A grant checked against another run or epoch is refused before the claim is looked at.
    let mut other_run = context("grants", &claim);
    other_run.run_id = "run-2".into();
    denied(write(&mut client, other_run).await.unwrap_err());
    let mut other_epoch = context("grants", &claim);
    other_epoch.epoch += 1;
    denied(write(&mut client, other_epoch).await.unwrap_err());
    // Nothing was dispatched by the refused calls.
    let absent = read(&mut client, context("grants", &claim))
        .await
        .unwrap_err();
    assert_refused(&absent, tonic::Code::NotFound, "not_found", false);

    write(&mut client, context("grants", &claim)).await.unwrap();
    assert_eq!(
        read(&mut client, context("grants", &claim)).await.unwrap(),
        b"note"
    );

    // A valid grant without a current durable claim does not dispatch either.
    common::release(&mut client, "grants", &env, &claim).await;
    let stale = read(&mut client, context("grants", &claim))
        .await
        .unwrap_err();
    assert_refused(&stale, tonic::Code::Aborted, "conflict", false);
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_grant_is_unauthenticated_and_retryable_and_renewal_mints_a_fresh_one() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Arc::new(ShiftedClock::default());
    let dev = start_dev_with_clock(tmp.path(), clock.clone()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "expiry")
        .await
        .environment
        .unwrap();
    let claim = client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: "expiry".into(),
            run_id: "run-1".into(),
            operation_id: "acquire-1".into(),
            ttl_millis: 300_000,
        })
        .await
        .unwrap()
        .into_inner();
    let (_, claims) = grant::decode(&claim.grant).unwrap();
    let expires_at = claim.expires_at.unwrap();
    assert!(
        expires_at.seconds <= claims.expires_at.0.as_second(),
        "the response never promises more than the grant allows"
    );

    clock.advance(Duration::from_secs(299));
    let renewed = client
        .renew_run(pb::RenewRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: "expiry".into(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: "renew-1".into(),
            ttl_millis: 300_000,
            grant_generation: claim.grant_generation,
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(renewed.grant, claim.grant, "renewal mints a new grant");
    clock.advance(Duration::from_secs(2));
    let expired = read(&mut client, context("expiry", &claim))
        .await
        .unwrap_err();
    assert_refused(
        &expired,
        tonic::Code::Unauthenticated,
        "unauthenticated",
        true,
    );
    let absent = read(&mut client, context("expiry", &renewed))
        .await
        .unwrap_err();
    assert_refused(&absent, tonic::Code::NotFound, "not_found", false);
    dev.stop().await.unwrap();
}

/// Adds a new active key `id` to the dev security directory and makes it the signer, with
/// `old_state` for the dev key.
fn rotate_to(state_dir: &std::path::Path, id: &str, version: u64, old_state: &str) {
    let (pem, print) = keys::generate(&OsIds);
    std::fs::write(state_dir.join(format!("security/{id}.key")), pem).unwrap();
    edit_manifest(state_dir, |m| {
        m["keys"][0]["state"] = old_state.into();
        let mut key = m["keys"][0].clone();
        key["id"] = id.into();
        key["version"] = version.into();
        key["file"] = format!("{id}.key").into();
        key["publicKeySHA256"] = print.into();
        key["state"] = "active".into();
        m["keys"].as_array_mut().unwrap().push(key);
        m["activeKeyID"] = id.into();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_keeps_old_grants_until_their_key_is_revoked_on_an_open_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "rotation")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "rotation", &env).await;
    write(&mut client, context("rotation", &claim))
        .await
        .unwrap();

    rotate_to(tmp.path(), "second", 2, "verify-only");
    reload(&dev).await;
    assert_eq!(
        read(&mut client, context("rotation", &claim))
            .await
            .unwrap(),
        b"note"
    );
    let renew = |operation_id: &str| pb::RenewRunRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        binding_id: "rotation".into(),
        run_id: claim.run_id.clone(),
        claim_id: claim.claim_id.clone(),
        epoch: claim.epoch,
        operation_id: operation_id.into(),
        ttl_millis: 60_000,
        grant_generation: claim.grant_generation,
    };
    let renewed = client
        .renew_run(renew("renew-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kid(&renewed.grant), "second", "only the active key signs");

    edit_manifest(tmp.path(), |m| m["keys"][0]["state"] = "revoked".into());
    reload(&dev).await;
    let revoked = read(&mut client, context("rotation", &claim))
        .await
        .unwrap_err();
    assert_refused(
        &revoked,
        tonic::Code::PermissionDenied,
        "permission_denied",
        false,
    );
    assert_eq!(
        read(&mut client, context("rotation", &renewed))
            .await
            .unwrap(),
        b"note"
    );
    dev.stop().await.unwrap();
}

/// §9.37: a grant minted before `RevokeEnvironment` stops authorizing at once: with its own
/// generation the durable claim is no longer current (ABORTED), and claiming the new
/// generation does not match what the grant binds (PERMISSION_DENIED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_minted_before_a_revocation_is_refused_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "revoked")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "revoked", &env).await;
    write(&mut client, context("revoked", &claim))
        .await
        .unwrap();
    let revoke = pb::RevokeEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        expected_grant_generation: claim.grant_generation,
        operation_id: "revoke-1".into(),
    };
    client.revoke_environment(revoke).await.unwrap();
    let stale = read(&mut client, context("revoked", &claim))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::Aborted, "{stale:?}");
    let mut forged = context("revoked", &claim);
    forged.grant_generation += 1;
    let forged = read(&mut client, forged).await.unwrap_err();
    assert_refused(
        &forged,
        tonic::Code::PermissionDenied,
        "permission_denied",
        false,
    );
    dev.stop().await.unwrap();
}

/// §9.37: new key material under the same generation is drift: the replica stops until a
/// higher generation carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_generation_key_material_drift_poisons_the_replica_until_a_higher_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let path = tmp.path().join("security/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let (pem, print) = keys::generate(&OsIds);
    std::fs::write(tmp.path().join("security/grant.key"), pem).unwrap();
    manifest["keys"][0]["publicKeySHA256"] = print.into();
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let err = dev.security_manager.reload().await.unwrap_err();
    assert!(err.to_string().contains("drift"), "{err}");
    assert!(
        dev.security_manager.reload().await.is_err(),
        "a retry does not heal it"
    );
    assert!(!dev.security.ready());
    // The ledger recorded the old fingerprint under this key version, so the higher
    // generation must also give the new material a higher version (§6.4 key reuse).
    edit_manifest(tmp.path(), |m| {
        let version = m["keys"][0]["version"].as_u64().unwrap();
        m["keys"][0]["version"] = (version + 1).into();
    });
    reload(&dev).await;
    assert!(dev.security.ready());
    dev.stop().await.unwrap();
}

/// §9.37: an acquisition refused while the signing authority is out is retried explicitly
/// with the same operation id once it is back, and converges to the same durable claim with
/// a fresh grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_retried_after_an_outage_converges_to_the_same_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "outage")
        .await
        .environment
        .unwrap();
    let first = acquire(&mut client, "outage", &env).await;
    let path = tmp.path().join("security/manifest.json");
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, br#"{"version":2}"#).unwrap();
    assert!(dev.security_manager.reload().await.is_err());
    let request = pb::AcquireRunRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        binding_id: "outage".into(),
        run_id: "run-1".into(),
        operation_id: "acquire-1".into(),
        ttl_millis: 60_000,
    };
    let refused = client.acquire_run(request.clone()).await.unwrap_err();
    assert_refused(&refused, tonic::Code::Unavailable, "not_ready", true);
    std::fs::write(&path, good).unwrap();
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    let retried = client.acquire_run(request).await.unwrap().into_inner();
    assert_eq!(
        (&retried.run_id, &retried.claim_id, retried.epoch),
        (&first.run_id, &first.claim_id, first.epoch),
        "the same durable claim"
    );
    assert_ne!(retried.grant, first.grant, "signed afresh");
    write(&mut client, context("outage", &retried))
        .await
        .unwrap();
    dev.stop().await.unwrap();
}

#[path = "../fuzz/checks/replay.rs"]
mod fuzz_replay;
#[path = "../fuzz/checks/grant_decode.rs"]
mod grant_decode;
#[path = "../fuzz/checks/manifest_parse.rs"]
mod manifest_parse;

/// Every input in `fuzz/regressions/grant_decode/` passes the fuzz target's own check.
#[test]
fn the_grant_decode_fuzz_regressions_pass_the_fuzz_check() {
    fuzz_replay::replay("grant_decode", grant_decode::check);
}

/// Every input in `fuzz/regressions/manifest_parse/` passes the fuzz target's own check.
#[test]
fn the_manifest_parse_fuzz_regressions_pass_the_fuzz_check() {
    fuzz_replay::replay("manifest_parse", manifest_parse::check);
}
