//! Helpers of the security tests: a `dev` provider whose wall clock the test can move, a PKI
//! built with rcgen (roots, intermediates, leaves with chosen SANs and validity), and
//! rewriting the security directory and installing it as a reload would.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use execution_provider::cli::dev::{DevArgs, DevProvider};
use execution_provider::runtime::tls::Identity;
use execution_provider::runtime::{Clock, OsIds, Runtime, SystemClock};
use execution_provider::server::limiter::LimiterBounds;
use execution_provider::server::status::error_detail;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::common::helper_binary;

/// The operating-system clock shifted by an offset the test sets.
#[derive(Default)]
pub struct ShiftedClock {
    offset: Mutex<Duration>,
}

impl ShiftedClock {
    /// Moves the clock `by` into the future.
    pub fn advance(&self, by: Duration) {
        *self.offset.lock().unwrap() += by;
    }
}

impl Clock for ShiftedClock {
    fn wall(&self) -> SystemTime {
        SystemClock.wall() + *self.offset.lock().unwrap()
    }
}

/// `dev` on an ephemeral port reading its wall clock from `clock`.
pub async fn start_dev_with_clock(state_dir: &Path, clock: Arc<ShiftedClock>) -> DevProvider {
    start_dev_with(state_dir, clock, LimiterBounds::default()).await
}

/// `dev` on an ephemeral port reading its wall clock from `clock`, with limiter flags.
pub async fn start_dev_with(
    state_dir: &Path,
    clock: Arc<ShiftedClock>,
    limits: LimiterBounds,
) -> DevProvider {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = DevArgs {
        state_dir: state_dir.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        kube_listen: "127.0.0.1:0".parse().unwrap(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        helper: Some(helper_binary()),
        limits,
        connections: Default::default(),
        unsafe_no_isolation: false,
        telemetry: Default::default(),
    };
    let runtime = Runtime {
        clock,
        ids: Arc::new(OsIds),
    };
    execution_provider::cli::dev::start_with_runtime(&args, runtime)
        .await
        .expect("dev starts")
}

/// A CA: its certificate PEM and an issuer for more certificates.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl Ca {
    /// A new self-signed root.
    pub fn root(name: &str) -> Self {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params = ca_params(name);
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Self {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params = ca_params(name);
        let pem = params.signed_by(&key, &self.issuer).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A client leaf with exactly `sans`, valid until `not_after` (default: far future).
    /// `chain_extra` PEM is appended to the presented chain (an intermediate).
    pub fn leaf(
        &self,
        sans: Vec<SanType>,
        not_after: Option<SystemTime>,
        chain_extra: Option<&str>,
    ) -> Identity {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params
            .distinguished_name
            .push(DnType::CommonName, "spiffe://dev.local/ns/default/client");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if let Some(t) = not_after {
            params.not_before = (t - Duration::from_secs(2 * 24 * 3600)).into();
            params.not_after = t.into();
        }
        let mut chain = params.signed_by(&key, &self.issuer).unwrap().pem();
        if let Some(extra) = chain_extra {
            chain.push_str(extra);
        }
        Identity::from_pem(chain.as_bytes(), key.serialize_pem().as_bytes(), "leaf").unwrap()
    }

    /// A client leaf whose only URI SAN is `uri`.
    pub fn client(&self, uri: &str) -> Identity {
        self.leaf(vec![uri_san(uri)], None, None)
    }
}

/// A URI SAN.
pub fn uri_san(uri: &str) -> SanType {
    SanType::URI(uri.try_into().unwrap())
}

/// Rewrites the dev manifest with `edit` applied to its JSON, bumping the generation.
pub fn edit_manifest(state_dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = state_dir.join("security/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let generation = manifest["generation"].as_u64().unwrap();
    manifest["generation"] = (generation + 1).into();
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Writes `pem` as the client CA bundle.
pub fn write_client_cas(state_dir: &Path, pem: &str) {
    std::fs::write(state_dir.join("security/clients.pem"), pem).unwrap();
}

/// The dev CA's certificate PEM.
pub fn dev_ca_pem(state_dir: &Path) -> String {
    std::fs::read_to_string(state_dir.join("pki/ca.pem")).unwrap()
}

/// Reloads the security directory now (publishing it to the ledger), as the interval would.
pub async fn reload(dev: &DevProvider) {
    dev.security_manager
        .reload()
        .await
        .expect("the reload succeeds");
}

/// Asserts a refusal's gRPC code and its `ErrorDetail`.
pub fn assert_refused(status: &tonic::Status, code: tonic::Code, detail: &str, retryable: bool) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        status.message(),
        execution_provider::server::status::GENERIC_MESSAGE
    );
    let d = error_detail(status).expect("an ErrorDetail");
    assert_eq!(
        (d.code.as_str(), d.retryable),
        (detail, retryable),
        "{status:?}"
    );
}
