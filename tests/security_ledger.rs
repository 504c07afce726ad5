//! The era-A key fingerprints of the authority ledger over a real `dev` provider
//! (api-security §6.4, §9.37): every published key is recorded and kept as a tombstone, a
//! freshly started replica whose manifest has a higher generation but an older key version
//! is refused (and does not serve), and a key version republished with another public key
//! stops the replica (RPCs UNAVAILABLE) until a valid higher generation is loaded.

mod common;
mod security;

use std::path::Path;
use std::sync::Arc;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::DevProvider;
use execution_provider::runtime::{OsIds, SystemClock};
use execution_provider::security::ledger::{AuthorityLedger, LedgerRecord};
use execution_provider::security::manager::{self, SecurityManager, SecuritySettings};
use execution_provider::security::{Security, keys, load_directory};
use security::*;

async fn templates(client: &mut Client) -> Result<usize, tonic::Status> {
    let list = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await?;
    Ok(list.into_inner().items.len())
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("security/manifest.json")).unwrap()).unwrap()
}

/// `m` at the next generation with a fresh key file `<file>` as its only key, `id` at
/// `version`.
fn with_key(
    dir: &Path,
    m: &serde_json::Value,
    id: &str,
    version: u64,
    file: &str,
) -> serde_json::Value {
    let (pem, print) = keys::generate(&OsIds);
    std::fs::write(dir.join(format!("security/{file}")), pem).unwrap();
    let mut m = m.clone();
    m["generation"] = (m["generation"].as_u64().unwrap() + 1).into();
    let key = &mut m["keys"][0];
    key["id"] = id.into();
    key["version"] = version.into();
    key["file"] = file.into();
    key["publicKeySHA256"] = print.into();
    m["activeKeyID"] = id.into();
    m
}

/// Rewrites the dev manifest with a fresh key `id` at `version` (next generation).
fn replace_key(dir: &Path, id: &str, version: u64, file: &str) {
    write(
        dir,
        "manifest.json",
        &with_key(dir, &manifest(dir), id, version, file),
    );
}

fn write(dir: &Path, name: &str, m: &serde_json::Value) {
    std::fs::write(
        dir.join("security").join(name),
        serde_json::to_vec_pretty(m).unwrap(),
    )
    .unwrap();
}

async fn recorded(dev: &DevProvider) -> LedgerRecord {
    let ledger = AuthorityLedger::new(
        dev.kube.clone(),
        "execution",
        manager::DEFAULT_AUTHORITY_CONFIGMAP,
    );
    ledger.read_record().await.unwrap().expect("a ledger")
}

/// A freshly started replica sharing `dev`'s ledger, whose manifest is `security/<name>`.
fn fresh_replica(dev: &DevProvider, dir: &Path, name: &str) -> SecurityManager {
    let manifest_path = dir.join("security").join(name);
    let tls_dir = dir.join("security");
    let loaded = load_directory(&manifest_path, &tls_dir).unwrap();
    let security = Security::new(&loaded, Arc::new(SystemClock)).unwrap();
    let settings = SecuritySettings {
        manifest_path,
        tls_dir,
        namespace: "execution".to_owned(),
        configmap: manager::DEFAULT_AUTHORITY_CONFIGMAP.to_owned(),
        reload_interval: manager::DEFAULT_RELOAD_INTERVAL,
        staleness: manager::DEFAULT_STALENESS,
    };
    SecurityManager::new(security, dev.kube.clone(), settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_a_higher_generation_but_an_older_key_version_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let first = manifest(dir)["keys"][0].clone();
    let id = first["id"].as_str().unwrap().to_owned();
    let old_version = first["version"].as_u64().unwrap();
    replace_key(dir, &id, old_version + 2, "rotated.key");
    reload(&dev).await;
    let rotated = recorded(&dev).await;
    let old_key = format!("{id}:{old_version}");
    assert_eq!(
        rotated.fingerprints.get(&old_key).map(String::as_str),
        first["publicKeySHA256"].as_str(),
        "the rotated-out key stays recorded as a tombstone"
    );
    assert_eq!(rotated.fingerprints.len(), 2);

    // A replica restarts on a newer generation whose key version is older.
    let older = with_key(dir, &manifest(dir), &id, old_version + 1, "older.key");
    write(dir, "restarted.json", &older);
    let replica = fresh_replica(&dev, dir, "restarted.json");
    let err = replica.reload().await.unwrap_err();
    assert!(
        err.to_string().contains("version rollback rejected"),
        "{err}"
    );
    assert!(
        !replica.security().ready(),
        "the restarted replica does not serve"
    );
    assert_eq!(recorded(&dev).await, rotated, "nothing was written");

    // Only a valid higher generation recovers, and the ledger keeps every key it recorded.
    let newer = with_key(dir, &manifest(dir), &id, old_version + 3, "newest.key");
    write(dir, "restarted.json", &newer);
    replica
        .reload()
        .await
        .expect("a newer key version is accepted");
    assert!(replica.security().ready());
    let now = recorded(&dev).await;
    assert_eq!(now.state.generation, rotated.state.generation + 1);
    assert_eq!(now.fingerprints.len(), 3, "{:?}", now.fingerprints);
    assert!(
        !now.fingerprints
            .contains_key(&format!("{id}:{}", old_version + 1))
    );
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_version_republished_with_another_public_key_stops_the_replica() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    assert_eq!(templates(&mut client).await.unwrap(), 1);
    let first = manifest(dir)["keys"][0].clone();
    let id = first["id"].as_str().unwrap().to_owned();
    let version = first["version"].as_u64().unwrap();
    let before = recorded(&dev).await;

    replace_key(dir, &id, version, "impostor.key");
    let err = dev.security_manager.reload().await.unwrap_err();
    assert!(err.to_string().contains("key reuse rejected"), "{err}");
    assert!(!dev.security.ready());
    let status = templates(&mut client).await.unwrap_err();
    assert_refused(&status, tonic::Code::Unavailable, "not_ready", true);
    assert_eq!(recorded(&dev).await, before, "nothing was written");

    replace_key(dir, &id, version + 1, "successor.key");
    reload(&dev).await;
    assert_eq!(
        templates(&mut client).await.unwrap(),
        1,
        "the same connection recovers"
    );
    dev.stop().await.unwrap();
}
