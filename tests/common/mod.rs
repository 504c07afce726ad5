//! Shared helpers of the integration tests: a `dev` provider on an ephemeral port, mTLS
//! clients with chosen identities, and polling with deadlines.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use execution_provider::cli::dev::{DevArgs, DevProvider};
use execution_provider::cli::pki::{DEV_CA_NAME, DevCa};
use execution_provider::runtime::SystemClock;
use execution_provider::runtime::net::TokioNet;
use execution_provider::runtime::tls::{self, Identity, MtlsConnector};
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

pub type Client = ExecutionProviderServiceClient<Channel>;

/// The helper binary cargo built for this test run.
pub fn helper_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_execution-helper"))
}

/// Starts `dev` in-process on an ephemeral port with its state in `state_dir`.
pub async fn start_dev(state_dir: &Path) -> DevProvider {
    start_dev_with(state_dir, false).await
}

/// Starts `dev` with `--unsafe-no-isolation`: the helper and the supervisors run as plain
/// processes (what detached commands need until the sandbox hosts the supervisor).
pub async fn start_dev_unisolated(state_dir: &Path) -> DevProvider {
    start_dev_with(state_dir, true).await
}

async fn start_dev_with(state_dir: &Path, unsafe_no_isolation: bool) -> DevProvider {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = DevArgs {
        state_dir: state_dir.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        kube_listen: "127.0.0.1:0".parse().unwrap(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        helper: Some(helper_binary()),
        limits: Default::default(),
        connections: Default::default(),
        unsafe_no_isolation,
        telemetry: Default::default(),
    };
    execution_provider::cli::dev::start(&args)
        .await
        .expect("dev starts")
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The CA that signs the dev server certificate.
pub fn server_ca(state_dir: &Path) -> Vec<u8> {
    read(state_dir.join("client/ca.pem"))
}

/// The dev client's certificate and key.
pub fn dev_identity(state_dir: &Path) -> Identity {
    let dir = state_dir.join("client");
    Identity::from_pem(
        &read(dir.join("client.pem")),
        &read(dir.join("client.key")),
        "dev client",
    )
    .unwrap()
}

/// A certificate for `uri` issued by the dev CA.
pub fn identity_from_dev_ca(state_dir: &Path, uri: &str) -> Identity {
    let pki = state_dir.join("pki");
    let cert = String::from_utf8(read(pki.join("ca.pem"))).unwrap();
    let key = String::from_utf8(read(pki.join("ca.key"))).unwrap();
    let leaf = DevCa::load(DEV_CA_NAME, &cert, &key)
        .unwrap()
        .client(uri)
        .unwrap();
    Identity::from_pem(leaf.cert.as_bytes(), leaf.key.as_bytes(), "test client").unwrap()
}

/// A certificate for `uri` issued by a CA the provider does not trust.
pub fn identity_from_foreign_ca(uri: &str) -> Identity {
    let leaf = DevCa::generate("some other CA")
        .unwrap()
        .client(uri)
        .unwrap();
    Identity::from_pem(leaf.cert.as_bytes(), leaf.key.as_bytes(), "foreign client").unwrap()
}

/// An mTLS channel presenting `identity` (or no certificate).
pub fn channel(addr: SocketAddr, state_dir: &Path, identity: Option<&Identity>) -> Channel {
    let cas = tls::certificates_from_pem(&server_ca(state_dir), "ca").unwrap();
    let config = tls::client_config(identity, &cas, Arc::new(SystemClock)).unwrap();
    let connector = MtlsConnector::new(
        TokioNet,
        config,
        Some(ServerName::try_from("localhost").unwrap()),
    );
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector_lazy(connector)
}

/// An mTLS client presenting `identity` (or no certificate).
pub async fn connect(addr: SocketAddr, state_dir: &Path, identity: Option<&Identity>) -> Client {
    ExecutionProviderServiceClient::new(channel(addr, state_dir, identity))
}

/// Polls `check` until it returns `Some` or `limit` passes.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The attested end user of the tests.
pub fn owner() -> pb::Owner {
    pb::Owner {
        issuer: "https://issuer.test".into(),
        subject: "alice".into(),
    }
}

/// The default template's selector, as the catalogue offers it.
pub async fn default_template(client: &mut Client) -> pb::TemplateSelector {
    let list = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap()
        .into_inner();
    list.items
        .into_iter()
        .filter_map(|i| i.template)
        .find(|t| t.id == "default")
        .expect("the default template is offered")
}

/// Ensures the environment of `binding` (operation id derived from it) and commits its
/// reference; returns the allocation.
pub async fn ensure(client: &mut Client, binding: &str) -> pb::EnsureEnvironmentResponse {
    let template = default_template(client).await;
    let request = pb::EnsureTemplateRequest {
        binding_id: binding.into(),
        template: Some(template),
        owner: Some(owner()),
        operation_id: format!("op-{binding}"),
    };
    let allocation = client.ensure_template(request).await.unwrap().into_inner();
    client
        .commit_reference(pb::ReferenceMutationRequest {
            environment: allocation.environment.clone(),
            owner: Some(owner()),
            binding_id: binding.into(),
            operation_id: format!("op-{binding}"),
        })
        .await
        .unwrap();
    allocation
}

/// Ensures and then polls until the environment reports ready.
pub async fn ensure_ready(client: &mut Client, binding: &str) -> pb::EnsureEnvironmentResponse {
    ensure(client, binding).await;
    eventually(Duration::from_secs(30), "environment readiness", || {
        let mut client = client.clone();
        async move {
            let template = default_template(&mut client).await;
            let request = pb::EnsureTemplateRequest {
                binding_id: binding.into(),
                template: Some(template),
                owner: Some(owner()),
                operation_id: format!("op-{binding}"),
            };
            let allocation = client.ensure_template(request).await.ok()?.into_inner();
            allocation.ready.then_some(allocation)
        }
    })
    .await
}

/// The data-plane context of a claim.
pub fn context(binding: &str, claim: &pb::RunClaimResponse) -> pb::RequestContext {
    pb::RequestContext {
        environment: claim.environment.clone(),
        owner: Some(owner()),
        binding_id: binding.into(),
        epoch: claim.epoch,
        grant: claim.grant.clone(),
        run_id: claim.run_id.clone(),
        claim_id: claim.claim_id.clone(),
        grant_generation: claim.grant_generation,
    }
}

/// Releases `claim` (operation id `release-1`), which must succeed.
pub async fn release(
    client: &mut Client,
    binding: &str,
    env: &pb::EnvironmentRef,
    claim: &pb::RunClaimResponse,
) {
    client
        .release_run(pb::ReleaseRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: "release-1".into(),
            grant_generation: claim.grant_generation,
        })
        .await
        .unwrap();
}

/// Takes a run claim.
pub async fn acquire(
    client: &mut Client,
    binding: &str,
    env: &pb::EnvironmentRef,
) -> pb::RunClaimResponse {
    client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: "run-1".into(),
            operation_id: "acquire-1".into(),
            ttl_millis: 60_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Initialises `state_dir` as `dev` would, with its default template's revision set to
/// `recovery: manual` (the revision key recomputed): a fence a test sets by hand then stays
/// until the test clears it, instead of being recovered automatically by the reconciler.
pub fn init_state_dir_with_manual_recovery(state_dir: &Path) {
    init_state_dir_with_default_setting(state_dir, "recovery", "manual");
}

/// Initialises `state_dir` as `dev` would, with its default template's revision set to
/// `network: outbound` (the revision key recomputed).
pub fn init_state_dir_with_outbound_network(state_dir: &Path) {
    init_state_dir_with_default_setting(state_dir, "network", "outbound");
}

/// Initialises `state_dir` as `dev` would, with `setting: value` in its default template's
/// execution block (the revision key recomputed).
fn init_state_dir_with_default_setting(state_dir: &Path, setting: &str, value: &str) {
    use execution_provider::templates::revision::canonical_template_revision;
    use execution_provider::templates::spec::ProfileSpec;
    let dir = execution_provider::cli::state_dir::StateDir::open_or_init(state_dir).unwrap();
    let path = dir.templates_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut file: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let template = &mut file["templates"]["default"];
    let old = template["default"].as_str().unwrap().to_owned();
    let mut revision = template["revisions"][&old].take();
    revision["execution"][setting] = value.into();
    let profile: ProfileSpec = serde_json::from_value(revision["execution"].clone()).unwrap();
    let new = canonical_template_revision(&profile.validate().unwrap());
    let revisions = template["revisions"].as_object_mut().unwrap();
    revisions.remove(&old);
    revisions.insert(new.clone(), revision);
    template["default"] = new.into();
    // JSON is YAML: the registry reads it back as written.
    std::fs::write(&path, serde_json::to_vec_pretty(&file).unwrap()).unwrap();
}
