//! Shared harness of the store tests: the in-process API server behind a fault-injecting,
//! request-counting tower layer, template registries with small capacities, a scripted
//! executor, and helpers that play the reconciler's part (Ready, Pod identity).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use execution_provider::executor::protocol::{ExecutorRequest, Operation};
use execution_provider::kube::apiserver::{ApiServer, ResponseBody};
use execution_provider::kube::crd::{
    ConditionStatus, EnvironmentCondition, ExecutionEnvironment, LEDGER_SHARDS, ObjectIdentity,
    RfcTime, ledger_shard_name, ledger_slots_key,
};
use execution_provider::reconciler::status::fence_expired;
use execution_provider::reconciler::{
    DEFAULT_CACHE_SYNC_DEADLINE, ReconcileError, Reconciler, ReconcilerConfig,
};
use execution_provider::runtime::{Runtime, SeededIds, clock::OffsetClock};
use execution_provider::store::claims::AcquireRequest;
use execution_provider::store::ensure::EnsureRequest;
use execution_provider::store::ledger::{Ledger, ShardEntry};
use execution_provider::store::naming::owner_hash;
use execution_provider::store::{Caller, Store};
use execution_provider::store::{ClaimContext, EnvRef};
use execution_provider::templates::{ProfileSpec, TemplateRegistry, canonical_template_revision};
use http::{Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};

pub const NAMESPACE: &str = "execution";
pub const CLIENT: &str = "spiffe://test.local/ns/default/client";
pub const OTHER_CLIENT: &str = "spiffe://test.local/ns/default/other";
pub const ISSUER: &str = "https://issuer.test";

mod executor;
mod interleave;
#[allow(unused_imports)]
pub use executor::{Script, ScriptedExecutor};
#[allow(unused_imports)]
pub use interleave::Gate;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How an injected fault fails a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request never gets an answer and was not applied.
    Transport,
    /// The request is applied, then its answer is lost (the ambiguous case a caller cannot
    /// tell from [`Fault::Transport`]).
    LostAnswer,
    /// The request never gets an answer and is held back: [`World::deliver_delayed`] applies
    /// it later (an API server that applies a delayed request).
    Delayed,
    /// The API server answers with this status; nothing is applied.
    Status(u16),
    /// The API server answers with this status, Kubernetes reason and message; nothing is
    /// applied.
    StatusWith(u16, &'static str, &'static str),
}

/// What a peer replica does just before a matching write is served (a race between
/// replicas): it runs once, against the API server directly, not through the fault layer.
pub type PeerWrite = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A [`PeerWrite`] armed for the next write whose path contains the filter.
pub struct BeforeWrite(pub &'static str, pub PeerWrite);

impl std::fmt::Debug for BeforeWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BeforeWrite({:?})", self.0)
    }
}

/// What the fault layer saw and what it is told to break.
#[derive(Debug, Default)]
pub struct Faults {
    /// A peer write to run just before the next matching write is served.
    pub before_write: Option<BeforeWrite>,
    /// Requests by `METHOD kind`, e.g. `GET executionenvironments`.
    pub counts: BTreeMap<String, usize>,
    /// Writes seen so far (POST, PUT, PATCH, DELETE).
    pub writes: usize,
    /// Fail the write with this 1-based number (counted over writes whose path contains the
    /// filter).
    pub fail_write: Option<(usize, Fault, &'static str)>,
    filtered_writes: usize,
    /// Requests held back by [`Fault::Delayed`], in arrival order.
    pub delayed: Vec<(http::request::Parts, Bytes)>,
    /// How many armed faults were applied (a step that never wrote leaves it unchanged).
    pub fired: usize,
}

impl Faults {
    /// Total requests with `method` on paths containing `kind`.
    pub fn count(&self, method: &str, kind: &str) -> usize {
        self.counts
            .iter()
            .filter(|(k, _)| k.starts_with(method) && k.contains(kind))
            .map(|(_, v)| *v)
            .sum()
    }

    /// Forgets the counts.
    pub fn reset_counts(&mut self) {
        self.counts.clear();
        self.writes = 0;
        self.filtered_writes = 0;
    }
}

/// The API server behind a counting, fault-injecting layer.
#[derive(Clone)]
pub struct FaultyApi {
    inner: ApiServer,
    faults: Arc<Mutex<Faults>>,
}

fn resource_of(path: &str) -> &str {
    for kind in [
        "executionenvironments",
        "configmaps",
        "pods",
        "persistentvolumeclaims",
    ] {
        if path.contains(kind) {
            return kind;
        }
    }
    "other"
}

impl<B> tower::Service<Request<B>> for FaultyApi
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let path = request.uri().path().to_owned();
        let (fault, peer) = {
            let mut faults = self.faults.lock().expect("faults");
            *faults
                .counts
                .entry(format!("{method} {}", resource_of(&path)))
                .or_default() += 1;
            let write = method != "GET";
            let mut fault = None;
            let mut peer = None;
            if write {
                faults.writes += 1;
                if faults
                    .before_write
                    .as_ref()
                    .is_some_and(|BeforeWrite(filter, _)| path.contains(filter))
                {
                    peer = faults.before_write.take().map(|BeforeWrite(_, run)| run);
                }
                if let Some((n, f, filter)) = faults.fail_write
                    && path.contains(filter)
                {
                    faults.filtered_writes += 1;
                    if faults.filtered_writes == n {
                        fault = Some(f);
                        faults.fired += 1;
                    }
                }
            }
            (fault, peer)
        };
        let mut inner = self.inner.clone();
        let faults = self.faults.clone();
        Box::pin(async move {
            if let Some(peer) = peer {
                peer().await;
            }
            match fault {
                Some(Fault::Transport) => Err::<_, BoxError>("injected transport failure".into()),
                Some(Fault::Delayed) => {
                    let (parts, body) = request.into_parts();
                    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
                    faults.lock().expect("faults").delayed.push((parts, bytes));
                    Err("injected delay: the request is held back".into())
                }
                Some(Fault::Status(code)) => Ok(status_response(code)),
                Some(Fault::StatusWith(code, reason, message)) => {
                    Ok(status_response_with(code, reason, message))
                }
                Some(Fault::LostAnswer) => {
                    tower::Service::call(&mut inner, request)
                        .await
                        .map_err(|e: Infallible| -> BoxError { match e {} })?;
                    Err("injected loss of an applied write's answer".into())
                }
                None => {
                    let response = tower::Service::call(&mut inner, request)
                        .await
                        .map_err(|e: Infallible| -> BoxError { match e {} })?;
                    Ok(response)
                }
            }
        })
    }
}

/// [`FaultyApi`] behind a [`Gate`]: each request of caller `caller` waits for the gate's
/// release before the fault layer sees it (so faults and counts follow the chosen order).
#[derive(Clone)]
pub struct GatedApi {
    inner: FaultyApi,
    gate: Arc<Gate>,
    caller: usize,
}

impl<B> tower::Service<Request<B>> for GatedApi
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let wait = self.gate.arrive(self.caller);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            if let Some(wait) = wait {
                wait.await
                    .map_err(|_| -> BoxError { "the gate closed".into() })?;
            }
            tower::Service::call(&mut inner, request).await
        })
    }
}

fn status_response(code: u16) -> Response<ResponseBody> {
    status_response_with(code, "Forbidden", "injected failure")
}

fn status_response_with(code: u16, reason: &str, message: &str) -> Response<ResponseBody> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    });
    let bytes = Bytes::from(serde_json::to_vec(&body).expect("json"));
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(bytes)
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("response")
}

/// One test world: a server, a clock, the fault layer and the templates.
pub struct World {
    pub server: ApiServer,
    pub clock: Arc<OffsetClock>,
    pub faults: Arc<Mutex<Faults>>,
    pub templates: Arc<TemplateRegistry>,
    pub executor: Arc<ScriptedExecutor>,
    seed: Mutex<u64>,
}

/// The wall-clock origin of every test world.
pub fn origin() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn execution(max_environments: i64, image_byte: char) -> Value {
    let digest: String = std::iter::repeat_n(image_byte, 64).collect();
    json!({
        "image": format!("registry.example/execution/executor@sha256:{digest}"),
        "storageClass": "standard", "storageSize": "1Gi",
        "cpuRequest": "100m", "cpuLimit": "1", "memoryRequest": "128Mi", "memoryLimit": "512Mi",
        "ephemeralStorageRequest": "256Mi", "ephemeralStorageLimit": "1Gi", "tmpSizeLimit": "64Mi",
        "runtimeClassName": "gvisor", "maxFileBytes": 1024, "maxCommandBytes": 1024,
        "maxCommandDuration": "5m", "maxEnvironments": max_environments
    })
}

fn key_of(execution: &Value) -> String {
    let spec: ProfileSpec = serde_json::from_value(execution.clone()).expect("profile spec");
    canonical_template_revision(&spec.validate().expect("valid spec"))
}

/// The revision id of template `id` in [`registry`] (its default revision).
pub fn revision_of(registry: &TemplateRegistry, id: &str) -> String {
    registry.default_revision(id).expect("default").to_owned()
}

/// Templates: `roomy` (limit 100), `small` (two revisions, limits 1 and 2: capacity 1),
/// `pair` (limit 2), `other` (limit 100) and `vast` (limit 1,040: the sharded ledger).
fn registry_json() -> String {
    let one = |limit: i64, byte: char| {
        let e = execution(limit, byte);
        let key = key_of(&e);
        (
            key.clone(),
            json!({"default": key, "revisions": {key: {"execution": e}}}),
        )
    };
    let small_a = execution(1, 'b');
    let small_b = execution(2, 'c');
    let (ka, kb) = (key_of(&small_a), key_of(&small_b));
    let file = json!({"templates": {
        "roomy": one(100, 'a').1,
        "small": {"default": kb, "revisions": {ka: {"execution": small_a}, kb: {"execution": small_b}}},
        "pair": one(2, 'd').1,
        "other": one(100, 'e').1,
        "vast": one(1_040, '1').1,
    }});
    file.to_string()
}

/// The registry of [`registry_json`].
pub fn registry() -> TemplateRegistry {
    TemplateRegistry::from_yaml_str(&registry_json(), "store-tests").expect("registry")
}

/// [`registry`] where the revision `roomy` allocates from has been marked `flag`
/// (`deprecated` or `revoked`) and a new revision became the default.
pub fn registry_with_roomy(flag: &str) -> TemplateRegistry {
    let (old, new) = (execution(100, 'a'), execution(100, 'f'));
    let (ko, kn) = (key_of(&old), key_of(&new));
    let mut file: Value = serde_json::from_str(&registry_json()).expect("json");
    file["templates"]["roomy"] = json!({"default": kn, "revisions": {
        ko: {"execution": old, flag: true},
        kn: {"execution": new},
    }});
    TemplateRegistry::from_yaml_str(&file.to_string(), "store-tests").expect("registry")
}

impl World {
    /// A store instance over this world with another template registry (a reloaded one).
    pub fn store_with(&self, templates: TemplateRegistry) -> Store {
        let runtime = Runtime {
            clock: self.clock.clone(),
            ids: Arc::new(SeededIds::new(7_000)),
        };
        Store::new(
            self.client(),
            NAMESPACE,
            Arc::new(templates),
            self.executor.clone(),
            runtime,
        )
    }

    /// A fresh world with the capacity ledger ConfigMap present.
    pub async fn new() -> World {
        let world = World::without_ledger();
        world.create_ledger().await;
        world
    }

    /// A fresh world without the capacity ledger ConfigMap.
    pub fn without_ledger() -> World {
        let clock = Arc::new(OffsetClock::starting_at(origin()));
        let server = ApiServer::in_memory(clock.clone(), Arc::new(SeededIds::new(1)));
        World {
            server,
            clock,
            faults: Arc::default(),
            templates: Arc::new(registry()),
            executor: Arc::new(ScriptedExecutor::default()),
            seed: Mutex::new(100),
        }
    }

    /// A client through the fault layer.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(
            FaultyApi {
                inner: self.server.clone(),
                faults: self.faults.clone(),
            },
            NAMESPACE,
        )
    }

    /// A store replica whose requests pass `gate` as caller `caller` (then the fault layer).
    pub fn gated_store(&self, gate: Arc<Gate>, caller: usize) -> Store {
        let client = kube::Client::new(
            GatedApi {
                inner: FaultyApi {
                    inner: self.server.clone(),
                    faults: self.faults.clone(),
                },
                gate,
                caller,
            },
            NAMESPACE,
        );
        let runtime = Runtime {
            clock: self.clock.clone(),
            ids: Arc::new(SeededIds::new(500 + caller as u64)),
        };
        Store::new(
            client,
            NAMESPACE,
            self.templates.clone(),
            self.executor.clone(),
            runtime,
        )
    }

    /// A fresh store instance (a new replica, or the same one after a crash).
    pub fn store(&self) -> Store {
        let seed = {
            let mut s = self.seed.lock().expect("seed");
            *s += 1;
            *s
        };
        let runtime = Runtime {
            clock: self.clock.clone(),
            ids: Arc::new(SeededIds::new(seed)),
        };
        Store::new(
            self.client(),
            NAMESPACE,
            self.templates.clone(),
            self.executor.clone(),
            runtime,
        )
    }

    /// The production reconciler over this world (through the fault layer), as a replica
    /// runs it: its fence of an expired operation lease is the only one production has.
    pub fn reconciler(&self) -> Arc<Reconciler> {
        let runtime = Runtime {
            clock: self.clock.clone(),
            ids: Arc::new(SeededIds::new(9_000)),
        };
        Reconciler::new(
            self.client(),
            ReconcilerConfig {
                namespace: NAMESPACE.to_owned(),
                executor_service_account: "executor".to_owned(),
                cache_sync_deadline: DEFAULT_CACHE_SYNC_DEADLINE,
            },
            self.templates.clone(),
            runtime,
        )
    }

    /// The reconciler's expiry fence (`reconciler::status::fence_expired`, what a reconcile
    /// calls when it finds an operation past its deadline) decided on `observed`, an earlier
    /// read of the environment: the write must find that exact operation still on record.
    pub async fn fence_expired_as_observed(
        &self,
        observed: &ExecutionEnvironment,
    ) -> Result<(), ReconcileError> {
        let reconciler = self.reconciler();
        let expired = observed
            .status
            .as_ref()
            .and_then(|s| s.active_operation.clone())
            .expect("the observation records an operation");
        fence_expired(
            &Api::namespaced(self.client(), NAMESPACE),
            reconciler.context(),
            observed,
            &expired,
            "operation holder lease expired; operation identity retained for recovery",
        )
        .await
    }

    pub fn environments(&self) -> Api<ExecutionEnvironment> {
        Api::namespaced(self.server.client(NAMESPACE), NAMESPACE)
    }

    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.server.client(NAMESPACE), NAMESPACE)
    }

    /// Applies every request held back by [`Fault::Delayed`] now, directly on the API server;
    /// the HTTP status of each.
    pub async fn deliver_delayed(&self) -> Vec<u16> {
        let held = std::mem::take(&mut self.faults.lock().expect("faults").delayed);
        let mut statuses = Vec::new();
        for (parts, bytes) in held {
            let request = Request::from_parts(parts, http_body_util::Full::new(bytes));
            let mut inner = self.server.clone();
            let response = tower::Service::call(&mut inner, request)
                .await
                .unwrap_or_else(|e: Infallible| match e {});
            statuses.push(response.status().as_u16());
        }
        statuses
    }

    /// Creates every capacity-ledger shard, empty (what the chart and `dev` provide).
    pub async fn create_ledger(&self) {
        for index in 0..LEDGER_SHARDS {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(ledger_shard_name(index)),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            self.config_maps()
                .create(&PostParams::default(), &map)
                .await
                .expect("create ledger");
        }
    }

    /// The names holding a slot of `template_id`, sorted (every shard, every format).
    pub async fn ledger(&self, template_id: &str) -> Vec<String> {
        self.ledger_view()
            .entries(template_id)
            .await
            .expect("ledger")
            .into_iter()
            .collect()
    }

    /// The ledger through the fault layer (its requests are counted).
    pub fn ledger_through_faults(&self) -> Ledger {
        Ledger::new(
            Api::namespaced(self.client(), NAMESPACE),
            Api::namespaced(self.client(), NAMESPACE),
        )
    }

    /// The ledger read directly (not through the fault layer).
    pub fn ledger_view(&self) -> Ledger {
        Ledger::new(self.config_maps(), self.environments())
    }

    /// `template_id`'s slots with their recorded create deadlines (every shard).
    pub async fn ledger_slots(&self, template_id: &str) -> BTreeMap<String, u64> {
        let mut slots = BTreeMap::new();
        for index in 0..LEDGER_SHARDS {
            let Some(map) = self
                .config_maps()
                .get_opt(&ledger_shard_name(index))
                .await
                .expect("get")
            else {
                continue;
            };
            let key = ledger_slots_key(template_id);
            let text = map.data.and_then(|d| d.get(&key).cloned());
            let entry = ShardEntry::decode(text.as_deref()).expect("entry");
            slots.extend(entry.slots);
        }
        slots
    }

    pub async fn get(&self, name: &str) -> ExecutionEnvironment {
        self.environments().get(name).await.expect("environment")
    }

    pub async fn names(&self) -> Vec<String> {
        self.environments()
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect()
    }

    /// Plays the reconciler: records a Pod and PVC identity and sets Ready=True.
    pub async fn make_ready(&self, name: &str) {
        let api = self.environments();
        let mut o = api.get(name).await.expect("environment");
        let now = RfcTime::from_system_time(self.clock_now());
        let status = o.status.get_or_insert_with(Default::default);
        status.pod = Some(ObjectIdentity {
            name: format!("executor-{name}"),
            uid: format!("pod-uid-{name}"),
        });
        status.pvc = Some(ObjectIdentity {
            name: format!("workspace-{name}"),
            uid: format!("pvc-uid-{name}"),
        });
        status.conditions.retain(|c| c.type_ != "Ready");
        status.conditions.push(EnvironmentCondition {
            type_: "Ready".to_owned(),
            status: ConditionStatus::True,
            reason: "Reconciled".to_owned(),
            message: String::new(),
            observed_generation: 1,
            last_transition_time: now,
        });
        api.replace_status(name, &PostParams::default(), &o)
            .await
            .expect("ready");
    }

    pub fn clock_now(&self) -> SystemTime {
        use execution_provider::runtime::Clock;
        self.clock.wall()
    }

    pub fn fail_write(&self, n: usize, fault: Fault, filter: &'static str) {
        let mut f = self.faults.lock().expect("faults");
        f.filtered_writes = 0;
        f.fail_write = Some((n, fault, filter));
    }

    /// Runs `peer` (once) just before the next write whose path contains `filter` is served.
    pub fn before_write<F>(&self, filter: &'static str, peer: impl FnOnce() -> F + Send + 'static)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let run: PeerWrite = Box::new(move || Box::pin(peer()));
        self.faults.lock().expect("faults").before_write = Some(BeforeWrite(filter, run));
    }

    pub fn clear_faults(&self) {
        self.faults.lock().expect("faults").fail_write = None;
    }
}

/// The caller `subject` of `client`.
pub fn caller_of(client: &str, subject: &str) -> Caller {
    Caller {
        client: client.to_owned(),
        owner_hash: owner_hash(ISSUER, subject),
    }
}

/// An allocation request of `binding` on template `template_id` for `subject`.
pub fn ensure_request(
    world: &World,
    client: &str,
    subject: &str,
    binding: &str,
    template_id: &str,
    operation_id: &str,
) -> EnsureRequest {
    EnsureRequest {
        caller: caller_of(client, subject),
        owner_issuer: ISSUER.to_owned(),
        owner_subject: subject.to_owned(),
        binding_id: binding.to_owned(),
        template_id: template_id.to_owned(),
        template_revision: revision_of(&world.templates, template_id),
        operation_id: operation_id.to_owned(),
    }
}

/// An environment made by `subject`'s `binding`, committed, Ready, with a live claim of
/// `ttl`: what every data-plane test starts from.
pub struct Claimed {
    pub caller: Caller,
    pub env: EnvRef,
    pub rc: ClaimContext,
}

pub async fn claimed(world: &World, store: &Store, subject: &str, binding: &str) -> Claimed {
    claimed_for(world, store, subject, binding, Duration::from_secs(300)).await
}

pub async fn claimed_for(
    world: &World,
    store: &Store,
    subject: &str,
    binding: &str,
    ttl: Duration,
) -> Claimed {
    let req = ensure_request(world, CLIENT, subject, binding, "roomy", "op-ensure");
    let a = store.ensure_template(&req).await.expect("ensure");
    store
        .commit_reference(&a.env, &req.caller, binding, "op-ensure")
        .await
        .expect("commit");
    world.make_ready(&a.env.id).await;
    let claim = store
        .acquire_run(&AcquireRequest {
            env: a.env.clone(),
            caller: req.caller.clone(),
            binding_id: binding.to_owned(),
            run_id: "run-1".to_owned(),
            operation_id: "op-acquire".to_owned(),
            ttl,
        })
        .await
        .expect("acquire");
    Claimed {
        caller: req.caller,
        env: a.env.clone(),
        rc: ClaimContext {
            env: a.env,
            binding_id: binding.to_owned(),
            run_id: claim.run_id,
            claim_id: claim.claim_id,
            epoch: claim.epoch,
            grant_generation: claim.grant_generation,
        },
    }
}

/// A `file.stat` of `path`.
pub fn stat(path: &str) -> ExecutorRequest {
    ExecutorRequest::at(Operation::FileStat, path)
}
