//! Client hosts: each plays a platform client (one of two admitted client identities) with one
//! owner over a few bindings, issuing a seeded random sequence of valid and invalid calls to
//! random replicas over mTLS, ensuring each binding with one of two templates. Every call goes
//! into the trace (invoke, then ok / the gRPC code / unknown) and acknowledged data-plane calls
//! go to the checker. RPCs answering UNIMPLEMENTED are recorded as skips.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use execution_provider::runtime::tls::{self, Identity, MtlsConnector};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rustls::pki_types::{CertificateDer, ServerName};
use tonic::transport::{Channel, Endpoint};

use crate::clock::SkewedClock;
use crate::invariants::{Acknowledged, History, Incarnation, Revoked};
use crate::net::SimNet;
use crate::scenario::Mix;
use crate::trace::Trace;

mod admin;
mod allocation;
mod claims;
mod desk;
mod detached;
pub use desk::{ADMIN_HOST, AdminCall, AdminDesk};
pub mod scripted;

type Client = ExecutionProviderServiceClient<Channel>;

/// How often a deliberately invalid request is followed by the §10.5 probes with another
/// platform's claim.
const FOREIGN_PROBE_RATE: f64 = 0.5;

/// What every client host shares with the harness.
#[derive(Clone, Default)]
pub struct Record {
    /// The trace.
    pub trace: Trace,
    /// Acknowledged data-plane calls.
    pub acknowledged: Arc<Mutex<Vec<Acknowledged>>>,
    /// Environment incarnations whose ensure was acknowledged.
    pub ensured: Arc<Mutex<BTreeSet<Incarnation>>>,
    /// Requests that must fail but succeeded.
    pub violations: Arc<Mutex<Vec<String>>>,
    /// Calls issued.
    pub calls: Arc<Mutex<u64>>,
    /// Acknowledged revocations.
    pub revoked: Arc<Mutex<Vec<Revoked>>>,
    /// Operation ids of requests refused with a definitive code.
    pub refused: Arc<Mutex<BTreeSet<String>>>,
    /// Environment incarnations whose DeleteRetiredEnvironment was acknowledged.
    pub deleted: Arc<Mutex<BTreeSet<Incarnation>>>,
    /// Run claims by `platform/owner/binding`, shared by every client host of that platform
    /// and owner (workers of one platform passing a claim around), oldest first.
    pub claims: Arc<Mutex<BTreeMap<String, Vec<pb::RunClaimResponse>>>>,
}

impl Record {
    /// Records that the ensure of environment `env` was acknowledged.
    pub(crate) fn note_ensured(&self, env: &pb::EnvironmentRef) {
        self.ensured
            .lock()
            .expect("ensured lock")
            .insert(Incarnation::of(env));
    }

    /// Records that the DeleteRetiredEnvironment of `env` was acknowledged.
    pub(crate) fn note_deleted(&self, env: &pb::EnvironmentRef) {
        self.deleted
            .lock()
            .expect("deleted lock")
            .insert(Incarnation::of(env));
    }

    /// What the clients recorded, for the checker.
    pub fn history(&self) -> History {
        History {
            acknowledged: self.acknowledged.lock().expect("lock").clone(),
            revoked: self.revoked.lock().expect("lock").clone(),
            ensured: self.ensured.lock().expect("lock").clone(),
            refused: self.refused.lock().expect("lock").clone(),
            deleted: self.deleted.lock().expect("lock").clone(),
        }
    }
}

/// One client host's parameters.
#[derive(Clone)]
pub struct ClientSpec {
    /// The turmoil host name.
    pub host: String,
    /// Which platform it belongs to (the index of its admitted client identity).
    pub platform: usize,
    /// Its certificate (its platform's).
    pub identity: Identity,
    /// A certificate the provider does not admit.
    pub stranger: Identity,
    /// The CA of the replicas' server certificate.
    pub server_cas: Vec<CertificateDer<'static>>,
    /// The attested owner.
    pub owner: pb::Owner,
    /// The bindings it works on.
    pub bindings: Vec<String>,
    /// How many actions it takes.
    pub steps: u32,
    /// Its random seed.
    pub seed: u64,
    /// How many replicas exist.
    pub replicas: u32,
    /// The action mix.
    pub mix: Mix,
    /// Chance of reusing an old claim.
    pub stale_claim_rate: f64,
    /// Chance of a deliberately invalid request.
    pub invalid_rate: f64,
    /// Chance that an ensure names the other template than its binding's usual one.
    pub competing_template_rate: f64,
    /// The API server, read the way an administrator reads an environment's status (for
    /// the exact identities lifecycle calls must name).
    pub api: execution_provider::kube::apiserver::ApiServer,
}

#[derive(Default)]
struct Binding {
    env: Option<pb::EnvironmentRef>,
    /// An ensure of this binding was tried and not confirmed (its answer may be lost).
    unconfirmed: bool,
    /// The template of the last ensure tried (an unconfirmed one is retried with it).
    template: Option<pb::TemplateSelector>,
    versions: BTreeMap<String, Vec<u8>>,
    /// Detached commands started on it, newest last.
    detached: Vec<detached::Started>,
}

struct Session {
    spec: ClientSpec,
    record: Record,
    rng: StdRng,
    /// Draws added after the original workload (the template of an ensure, cross-platform
    /// probes): decisions from a stream of their own (the calls they add still draw replicas
    /// from `rng`).
    side_rng: StdRng,
    /// The templates (`default`, then the second one), once listed.
    templates: Vec<pb::TemplateSelector>,
    bindings: BTreeMap<String, Binding>,
    counter: u64,
}

fn channel(host: &str, identity: &Identity, cas: &[CertificateDer<'static>]) -> Client {
    let config = tls::client_config(Some(identity), cas, Arc::new(SkewedClock::exact()))
        .expect("the simulator's client TLS config is valid");
    let name = ServerName::try_from("localhost").expect("a valid server name");
    let connector = MtlsConnector::new(SimNet, config, Some(name));
    let channel = Endpoint::from_shared(format!("http://{host}:{}", crate::world::GRPC_PORT))
        .expect("a valid endpoint")
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        // h2 remembers a stream it reset (a call that timed out) for a span of the *OS* clock
        // and answers a late frame for it only once it has forgotten it: remembering none
        // makes that answer independent of how fast the machine runs (see sim/README.md).
        .http2_max_concurrent_reset_streams(0)
        .connect_with_connector_lazy(connector);
    ExecutionProviderServiceClient::new(channel)
}

/// Runs one client host to completion.
pub async fn run(spec: ClientSpec, record: Record) -> turmoil::Result {
    let bindings = spec
        .bindings
        .iter()
        .map(|b| (b.clone(), Binding::default()))
        .collect();
    let mut session = Session {
        rng: StdRng::seed_from_u64(spec.seed),
        side_rng: StdRng::seed_from_u64(spec.seed ^ 0x7e4a_91a7),
        spec,
        record,
        templates: Vec::new(),
        bindings,
        counter: 0,
    };
    for _ in 0..session.spec.steps {
        let pause = session.rng.random_range(0..400);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        session.step().await;
    }
    session.retry_unconfirmed_ensures().await;
    Ok(())
}

/// Simulated milliseconds now.
fn now_ms() -> u128 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis()
}

/// Whether `result` is a refusal that proves the request changed nothing (not an outcome
/// the client cannot know, and not a failure a lost answer may have caused).
fn definitively_refused<T>(result: &Result<T, tonic::Status>) -> bool {
    use tonic::Code;
    matches!(
        result,
        Err(status) if matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition
                | Code::Aborted
                | Code::OutOfRange
                | Code::ResourceExhausted
                | Code::Unauthenticated
        )
    )
}

/// How a call ended, as the trace shows it.
fn outcome<T>(result: &Result<T, tonic::Status>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(status) => match status.code() {
            tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Cancelled => {
                "unknown".to_owned()
            }
            tonic::Code::Unimplemented => "skip (unimplemented)".to_owned(),
            code => format!("{code:?}"),
        },
    }
}

/// A well-formed reference to an environment that does not exist (the twin of a §10.5 probe).
fn absent_environment() -> pb::EnvironmentRef {
    pb::EnvironmentRef {
        id: format!("exec-{}", "0".repeat(40)),
        revision: "0".repeat(32),
    }
}

/// Whether a refusal proves nothing about the environment it names (§10.5): the answer was
/// lost (unavailable, deadline, cancelled, unknown), or the replica could not reach the API
/// server (internal), which it would have answered alike for an absent environment.
fn proves_nothing(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
            | tonic::Code::Internal
    )
}

/// Whether two refusals are identical: code, message and details.
fn same_refusal(a: &tonic::Status, b: &tonic::Status) -> bool {
    a.code() == b.code() && a.message() == b.message() && a.details() == b.details()
}

impl Session {
    fn next_id(&mut self, what: &str) -> String {
        self.counter += 1;
        format!("{}-{what}-{}", self.spec.host, self.counter)
    }

    /// A connection to a random replica, for one call. Every call has its own connection: an
    /// abandoned call then closes its connection instead of resetting an HTTP/2 stream, whose
    /// expiry h2 judges by the OS clock (which would make runs depend on the machine's speed).
    fn client(&mut self) -> Client {
        let i = self.rng.random_range(0..self.spec.replicas);
        let host = crate::world::replica_host(i);
        channel(&host, &self.spec.identity, &self.spec.server_cas)
    }

    /// A connection presenting the unadmitted certificate.
    fn stranger(&self) -> Client {
        let host = crate::world::replica_host(0);
        channel(&host, &self.spec.stranger, &self.spec.server_cas)
    }

    fn trace(&self, event: String) {
        self.record.trace.record(&self.spec.host, event);
        *self.record.calls.lock().expect("calls lock") += 1;
    }

    /// Records `operation_id` as refused when `result` is a definitive refusal.
    fn note_refusal<T>(&self, operation_id: &str, result: &Result<T, tonic::Status>) {
        if definitively_refused(result) {
            self.record
                .refused
                .lock()
                .expect("refused lock")
                .insert(operation_id.to_owned());
        }
    }

    fn unexpected(&self, what: String) {
        self.record
            .violations
            .lock()
            .expect("violations lock")
            .push(what);
    }

    async fn step(&mut self) {
        let binding = {
            let i = self.rng.random_range(0..self.spec.bindings.len());
            self.spec.bindings[i].clone()
        };
        if self.rng.random_bool(self.spec.invalid_rate) {
            self.invalid(&binding).await;
            if self.side_rng.random_bool(FOREIGN_PROBE_RATE) {
                self.foreign_probe().await;
            }
            return;
        }
        let mix = self.spec.mix;
        let weights = [
            mix.ensure,
            mix.acquire,
            mix.renew,
            mix.files,
            mix.commands,
            mix.release,
            mix.revoke,
            mix.lifecycle,
            mix.release_reference,
        ];
        let total: u32 = weights.iter().sum();
        let mut pick = self.rng.random_range(0..total);
        let mut action = 0;
        for (i, w) in weights.iter().enumerate() {
            if pick < *w {
                action = i;
                break;
            }
            pick -= w;
        }
        if self.bindings[&binding].env.is_none() {
            action = 0;
        }
        match action {
            0 => self.ensure(&binding).await,
            1 => self.acquire(&binding).await,
            2 => self.renew(&binding).await,
            3 => self.file(&binding).await,
            4 => self.command(&binding).await,
            5 => self.release(&binding).await,
            6 => self.revoke(&binding).await,
            7 => self.lifecycle(&binding).await,
            _ => self.release_reference(&binding).await,
        }
    }

    fn acknowledge(&self, claim: &pb::RunClaimResponse, sent_ms: u128, what: String) {
        self.record
            .acknowledged
            .lock()
            .expect("acknowledged lock")
            .push(Acknowledged::under(claim, sent_ms, what));
    }

    async fn file(&mut self, binding: &str) {
        let Some(claim) = self.claim(binding) else {
            return self.acquire(binding).await;
        };
        let path = format!("f{}.txt", self.rng.random_range(0..3));
        let known = self.bindings[binding].versions.get(&path).cloned();
        let (operation, data, version) = match (self.rng.random_range(0..3), known) {
            (0, _) => (pb::FileOperation::Read, Vec::new(), Vec::new()),
            (1, Some(version)) => (
                pb::FileOperation::Replace,
                self.next_id("data").into_bytes(),
                version,
            ),
            _ => (
                pb::FileOperation::Create,
                self.next_id("data").into_bytes(),
                Vec::new(),
            ),
        };
        let request = pb::FileRequest {
            context: Some(self.context(binding, &claim)),
            operation: operation as i32,
            path: path.clone(),
            data,
            version,
            ..pb::FileRequest::default()
        };
        let what = format!("file {:?} {path}", operation);
        let sent_ms = now_ms();
        let result = self.client().files(request).await;
        self.trace(format!(
            "{what} {binding} e{} -> {}",
            claim.epoch,
            outcome(&result)
        ));
        if let Ok(response) = result {
            let version = response.into_inner().version;
            if !version.is_empty() {
                let state = self.bindings.get_mut(binding).expect("known binding");
                state.versions.insert(path, version);
            }
            self.acknowledge(&claim, sent_ms, what);
        }
    }

    async fn command(&mut self, binding: &str) {
        let Some(claim) = self.claim(binding) else {
            return self.acquire(binding).await;
        };
        let command = match self.rng.random_range(0..3) {
            0 => "echo hello".to_owned(),
            1 => format!("exit {}", self.rng.random_range(0..3)),
            _ => "true".to_owned(),
        };
        // No draw at 0%, so that such a scenario's side stream stays as it was.
        let detached = self.spec.mix.detached_percent;
        if detached > 0
            && self
                .side_rng
                .random_bool(f64::from(detached.min(100)) / 100.0)
        {
            return self.detached(binding, claim).await;
        }
        let request = pb::CommandStartRequest {
            context: Some(self.context(binding, &claim)),
            command: command.clone(),
            timeout_millis: 10_000,
            ..Default::default()
        };
        let sent_ms = now_ms();
        let result = self.client().start_command(request).await;
        self.trace(format!(
            "command `{command}` {binding} e{} -> {}",
            claim.epoch,
            outcome(&result)
        ));
        if result.is_ok() {
            self.acknowledge(&claim, sent_ms, format!("command `{command}`"));
        }
    }
}
