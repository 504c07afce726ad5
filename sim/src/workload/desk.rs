//! The administrator's desk: the lifecycle calls a hand-driven race makes on one environment
//! (recover, release its references, retire, delete the retired environment), from a host of
//! its own, naming the exact identities the stored status shows when each call is made.

use std::sync::{Arc, Mutex};

use execution_provider::api::pb;
use execution_provider::kube::apiserver::ApiServer;
use execution_provider::runtime::tls::Identity;
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;

use super::{Client, Record, channel, definitively_refused, outcome};

/// A lifecycle call a script makes as the administrator, on one environment, naming the
/// exact identities its stored status shows when the call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminCall {
    /// RecoverEnvironment (exact epoch, Pod UID, PVC UID).
    Recover,
    /// ReleaseReference of every Published reference the environment holds, as its platform
    /// does before retiring it.
    ReleaseReferences,
    /// RetireEnvironment (exact epoch, Pod UID, PVC UID).
    Retire,
    /// DeleteRetiredEnvironment naming its PVC UID.
    DeleteRetired,
}

/// The admin host's queue: a call and the environment it names.
type Queue = mpsc::UnboundedSender<(AdminCall, String)>;

/// The administrator's client host.
pub const ADMIN_HOST: &str = "admin";

/// The owners the client hosts attest (`world::add_clients` gives them these subjects under
/// this issuer); the desk finds an environment's owner among them by its `ownerHash`.
const OWNER_ISSUER: &str = "https://issuer.sim";
const OWNER_SUBJECTS: [&str; 2] = ["alice", "bob"];

/// The administrator's desk: the host [`ADMIN_HOST`], added to the run at the first call a
/// script makes (so that runs without one keep their hosts and their random draws), makes
/// each call in turn over mTLS, as the platform client that created the environment (found
/// by its `clientHash`), to the replicas in turn. Every call is traced by the admin host as
/// `WHAT NAME eEPOCH -> OUTCOME [DETAIL CODE]`; a definitive refusal is recorded for the §10.6
/// check, an acknowledged deletion for the history.
#[derive(Clone)]
pub struct AdminDesk {
    /// The admitted platform clients: URI and certificate.
    clients: Vec<(String, Identity)>,
    server_cas: Vec<CertificateDer<'static>>,
    api: ApiServer,
    replicas: u32,
    record: Record,
    /// The admin host's queue of calls, once the host exists.
    calls: Arc<Mutex<Option<Queue>>>,
}

impl AdminDesk {
    /// A desk presenting the certificates of `clients` (URI, identity), trusting
    /// `server_cas`, reading statuses from `api`.
    pub fn new(
        clients: Vec<(String, Identity)>,
        server_cas: Vec<CertificateDer<'static>>,
        api: ApiServer,
        replicas: u32,
        record: Record,
    ) -> Self {
        Self {
            clients,
            server_cas,
            api,
            replicas,
            record,
            calls: Arc::new(Mutex::new(None)),
        }
    }

    /// Makes `call` on environment `name` from the admin host (added to `sim` first if it is
    /// not there yet).
    pub fn issue(&self, sim: &mut turmoil::Sim<'_>, call: AdminCall, name: &str) {
        let mut calls = self.calls.lock().expect("admin calls lock");
        let sender = calls.get_or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel::<(AdminCall, String)>();
            let receiver = Arc::new(Mutex::new(Some(receiver)));
            let desk = self.clone();
            sim.host(ADMIN_HOST, move || {
                let receiver = receiver.lock().expect("admin queue lock").take();
                let desk = desk.clone();
                async move {
                    let Some(mut receiver) = receiver else {
                        return Ok(());
                    };
                    let mut made = 0;
                    while let Some((call, name)) = receiver.recv().await {
                        made += 1;
                        desk.make(call, &name, made).await;
                    }
                    Ok(())
                }
            });
            sender
        });
        sender
            .send((call, name.to_owned()))
            .expect("the admin host takes calls for the whole run");
    }

    /// A connection to the next replica as the client whose hash is `client_hash` (the
    /// first client when none matches: the call is then refused as a stranger's).
    fn client(&self, made: u32, client_hash: &str) -> Client {
        let host = crate::world::replica_host(made % self.replicas);
        let identity = self
            .clients
            .iter()
            .find(|(uri, _)| execution_provider::store::naming::client_hash(uri) == client_hash)
            .or(self.clients.first())
            .map(|(_, identity)| identity)
            .expect("an admitted client");
        channel(&host, identity, &self.server_cas)
    }

    fn trace(&self, event: String) {
        self.record.trace.record(ADMIN_HOST, event);
        *self.record.calls.lock().expect("calls lock") += 1;
    }

    async fn make(&self, call: AdminCall, name: &str, made: u32) {
        let stored = self
            .api
            .objects_of_kind("ExecutionEnvironment")
            .into_iter()
            .find(|o| o.pointer("/metadata/name").and_then(|n| n.as_str()) == Some(name));
        let Some(stored) = stored else {
            return self.trace(format!("{call:?} {name}: no such environment"));
        };
        let exact = Exact::of(&stored);
        let env = Some(pb::EnvironmentRef {
            id: name.to_owned(),
            revision: exact.revision.clone(),
        });
        let owner = owner_of(&exact.owner_hash);
        if call == AdminCall::ReleaseReferences {
            return self.release_references(&stored, env, owner, made).await;
        }
        let operation_id = format!("{ADMIN_HOST}-{call:?}-{made}").to_lowercase();
        let client = self.client(made, &exact.client_hash);
        let result = send(client, call, env.clone(), owner, &exact, &operation_id).await;
        let epoch = exact.epoch;
        self.trace(format!("{call:?} {name} e{epoch} -> {}", traced(&result)));
        if definitively_refused(&result) {
            let mut refused = self.record.refused.lock().expect("refused lock");
            refused.insert(operation_id);
        }
        if call == AdminCall::DeleteRetired
            && result.is_ok()
            && let Some(env) = &env
        {
            self.record.note_deleted(env);
        }
    }

    async fn release_references(
        &self,
        stored: &serde_json::Value,
        environment: Option<pb::EnvironmentRef>,
        owner: Option<pb::Owner>,
        made: u32,
    ) {
        let client_hash = stored
            .pointer("/spec/clientHash")
            .and_then(|h| h.as_str())
            .unwrap_or_default();
        let references = stored
            .pointer("/status/references")
            .and_then(|r| r.as_array())
            .cloned()
            .unwrap_or_default();
        let name = environment.as_ref().map_or("", |e| e.id.as_str());
        for reference in references.iter().filter(|r| r["state"] == "Published") {
            let binding = reference["bindingID"].as_str().unwrap_or_default();
            let request = pb::ReleaseReferenceRequest {
                context: Some(pb::RequestContext {
                    environment: environment.clone(),
                    owner: owner.clone(),
                    binding_id: binding.to_owned(),
                    ..pb::RequestContext::default()
                }),
            };
            // One connection per call, as every client makes them.
            let mut client = self.client(made, client_hash);
            let result = client.release_reference(request).await;
            self.trace(format!(
                "ReleaseReference {name} {binding} -> {}",
                traced(&result)
            ));
        }
    }
}

/// What an administrator reads from an environment's stored status and spec before a call.
struct Exact {
    revision: String,
    owner_hash: String,
    client_hash: String,
    epoch: u64,
    pod_uid: String,
    pvc_uid: String,
}

impl Exact {
    fn of(stored: &serde_json::Value) -> Self {
        let text = |pointer: &str| {
            stored
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            revision: text("/spec/revision"),
            owner_hash: text("/spec/ownerHash"),
            client_hash: text("/spec/clientHash"),
            epoch: stored
                .pointer("/status/epoch")
                .and_then(|e| e.as_u64())
                .unwrap_or(0),
            pod_uid: text("/status/pod/uid"),
            pvc_uid: text("/status/pvc/uid"),
        }
    }
}

/// Sends the lifecycle request of `call` (not [`AdminCall::ReleaseReferences`]).
async fn send(
    mut client: Client,
    call: AdminCall,
    environment: Option<pb::EnvironmentRef>,
    owner: Option<pb::Owner>,
    exact: &Exact,
    operation_id: &str,
) -> Result<(), tonic::Status> {
    let (epoch, pod, pvc) = (exact.epoch, exact.pod_uid.clone(), exact.pvc_uid.clone());
    let operation_id = operation_id.to_owned();
    match call {
        AdminCall::Recover => {
            let request = pb::RecoverEnvironmentRequest {
                environment,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            };
            client.recover_environment(request).await.map(drop)
        }
        AdminCall::Retire => {
            let request = pb::RetireEnvironmentRequest {
                environment,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id,
            };
            client.retire_environment(request).await.map(drop)
        }
        AdminCall::DeleteRetired => {
            let request = pb::DeleteRetiredEnvironmentRequest {
                environment,
                owner,
                expected_pvc_uid: pvc,
                operation_id,
            };
            client.delete_retired_environment(request).await.map(drop)
        }
        AdminCall::ReleaseReferences => unreachable!("references are released one by one"),
    }
}

/// The owner whose hash is `owner_hash`, among the clients' owners.
fn owner_of(owner_hash: &str) -> Option<pb::Owner> {
    OWNER_SUBJECTS
        .iter()
        .find(|subject| {
            execution_provider::store::naming::owner_hash(OWNER_ISSUER, subject) == owner_hash
        })
        .map(|subject| pb::Owner {
            issuer: OWNER_ISSUER.into(),
            subject: (*subject).into(),
        })
}

/// [`outcome`], followed by the refusal's `ErrorDetail` code when it has one.
fn traced<T>(result: &Result<T, tonic::Status>) -> String {
    let detail = result
        .as_ref()
        .err()
        .and_then(execution_provider::server::status::error_detail)
        .map(|d| format!(" {}", d.code))
        .unwrap_or_default();
    format!("{}{detail}", outcome(result))
}
