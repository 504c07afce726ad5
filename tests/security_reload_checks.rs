//! The security reload applies every rule `security check` applies (issue 15, item 2): a
//! server leaf outside its validity window or without serverAuth and a client CA bundle
//! holding a leaf are refused and withdraw the authority in force (an expired server
//! certificate is not kept), and a projected volume's `..data` swap seen mid-read is retried
//! once.

mod common;
mod security;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use execution_provider::runtime::Clock;
use execution_provider::security::{SecurityError, load_directory, read_consistently};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};
use security::*;

/// A self-signed `localhost` leaf with `usage`, valid from `not_before` to `not_after`.
fn server_leaf(
    usage: ExtendedKeyUsagePurpose,
    not_before: SystemTime,
    not_after: SystemTime,
) -> (String, String) {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![SanType::DnsName("localhost".try_into().unwrap())];
    params
        .distinguished_name
        .push(DnType::CommonName, "execution-provider");
    params.extended_key_usages = vec![usage];
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn write_server(state: &Path, (cert, key): (String, String)) {
    std::fs::write(state.join("security/server.pem"), cert).unwrap();
    std::fs::write(state.join("security/server.key"), key).unwrap();
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Writes a new generation of the directory with `change`, reloads, and expects a refusal
/// naming `problem` that withdraws the authority: not ready, and no TLS config for new
/// handshakes.
async fn assert_reload_refused(change: impl FnOnce(&Path), problem: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    assert!(dev.security.ready());
    change(tmp.path());
    edit_manifest(tmp.path(), |_| {});
    let refused = dev.security_manager.reload().await.unwrap_err();
    assert!(refused.to_string().contains(problem), "{refused}");
    assert!(!dev.security.ready(), "the authority is withdrawn");
    assert!(
        dev.security.server_tls().acceptor().is_none(),
        "no server certificate is kept for new handshakes"
    );
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused_and_not_kept() {
    let now = execution_provider::runtime::SystemClock.wall();
    assert_reload_refused(
        |state| {
            write_server(
                state,
                server_leaf(
                    ExtendedKeyUsagePurpose::ServerAuth,
                    now - 3 * DAY,
                    now - DAY,
                ),
            );
        },
        "is not valid now",
    )
    .await;
}

#[tokio::test]
async fn a_server_certificate_not_yet_valid_is_refused() {
    let now = execution_provider::runtime::SystemClock.wall();
    assert_reload_refused(
        |state| {
            write_server(
                state,
                server_leaf(
                    ExtendedKeyUsagePurpose::ServerAuth,
                    now + DAY,
                    now + 3 * DAY,
                ),
            );
        },
        "is not valid now",
    )
    .await;
}

#[tokio::test]
async fn a_server_certificate_without_server_auth_is_refused() {
    let now = execution_provider::runtime::SystemClock.wall();
    assert_reload_refused(
        |state| {
            write_server(
                state,
                server_leaf(ExtendedKeyUsagePurpose::ClientAuth, now - DAY, now + DAY),
            );
        },
        "lacks the serverAuth usage",
    )
    .await;
}

#[tokio::test]
async fn a_leaf_in_the_client_ca_bundle_is_refused() {
    assert_reload_refused(
        |state| {
            let leaf = std::fs::read_to_string(state.join("client/client.pem")).unwrap();
            write_client_cas(state, &format!("{}{leaf}", dev_ca_pem(state)));
        },
        "certificate 2 is not a CA",
    )
    .await;
}

#[tokio::test]
async fn an_expiry_while_installed_is_refused_by_the_next_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(ShiftedClock::default());
    let now = execution_provider::runtime::SystemClock.wall();
    let dev = start_dev_with_clock(tmp.path(), clock.clone()).await;
    write_server(
        tmp.path(),
        server_leaf(ExtendedKeyUsagePurpose::ServerAuth, now - DAY, now + DAY),
    );
    edit_manifest(tmp.path(), |_| {});
    reload(&dev).await;
    clock.advance(2 * DAY);
    let refused = dev.security_manager.reload().await.unwrap_err();
    assert!(
        refused.to_string().contains("is not valid now"),
        "{refused}"
    );
    assert!(dev.security.server_tls().acceptor().is_none());
}

/// A projected-volume layout: `name` → `..data/name`, `..data` → `..<version>`.
fn project(root: &Path, version: &str, files: &Path) {
    let dir = root.join(format!("..{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(files).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        let link = root.join(entry.file_name());
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(entry.file_name()), link).unwrap();
        }
    }
}

/// Points `..data` at `..<version>` in one rename, as the kubelet does.
fn swap_to(root: &Path, version: &str) {
    let next = root.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &next).unwrap();
    std::fs::rename(next, root.join("..data")).unwrap();
}

fn projected_volume(tmp: &Path) -> PathBuf {
    let state = tmp.join("state");
    execution_provider::cli::state_dir::StateDir::open_or_init(&state).unwrap();
    let volume = tmp.join("volume");
    std::fs::create_dir_all(&volume).unwrap();
    project(&volume, "v1", &state.join("security"));
    edit_manifest(&state, |_| {});
    project(&volume, "v2", &state.join("security"));
    swap_to(&volume, "v1");
    volume
}

fn generation_of(volume: &Path) -> Result<u64, SecurityError> {
    load_directory(&volume.join("manifest.json"), volume).map(|l| l.manifest.generation)
}

#[test]
fn a_projected_volume_loads_through_its_links() {
    let tmp = tempfile::tempdir().unwrap();
    let volume = projected_volume(tmp.path());
    let first = generation_of(&volume).unwrap();
    swap_to(&volume, "v2");
    assert_eq!(generation_of(&volume).unwrap(), first + 1);
}

#[test]
fn a_swap_seen_mid_read_is_read_again_once() {
    let tmp = tempfile::tempdir().unwrap();
    let volume = projected_volume(tmp.path());
    let links = [volume.join("..data")];
    let mut reads = 0;
    let generation = read_consistently(&links, || {
        reads += 1;
        let read = generation_of(&volume);
        if reads == 1 {
            swap_to(&volume, "v2");
        }
        read
    })
    .unwrap();
    assert_eq!(reads, 2);
    assert_eq!(
        generation,
        generation_of(&volume).unwrap(),
        "the new version"
    );
}

#[test]
fn a_second_swap_mid_read_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let volume = projected_volume(tmp.path());
    let links = [volume.join("..data")];
    let mut reads = 0;
    let refused = read_consistently(&links, || {
        reads += 1;
        let read = generation_of(&volume);
        swap_to(&volume, if reads % 2 == 1 { "v2" } else { "v1" });
        read
    });
    assert_eq!(reads, 2);
    assert!(matches!(refused, Err(SecurityError::Swapped)));
}
