//! Shared harness of the reconciler tests: the in-process API server with the classes and
//! ledger an operator provides, template registries built in code, environments as the store
//! creates them, and helpers that play the kubelet's part (Pod Ready, Pod terminated).

#![allow(dead_code)]

pub mod hooks;
pub mod supervised;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use execution_provider::kube::apiserver::ApiServer;
use execution_provider::kube::crd::{
    ConditionStatus, Desired, EnvironmentCondition, ExecutionEnvironment, ExecutionEnvironmentSpec,
    ExecutorResources, LEDGER_SHARDS, SCHEMA_VERSION, condition, ledger_key, ledger_shard_name,
    pod_name, pvc_name,
};
use execution_provider::reconciler::{DEFAULT_CACHE_SYNC_DEADLINE, Reconciler, ReconcilerConfig};
use execution_provider::runtime::{Runtime, SeededIds, clock::OffsetClock};
use execution_provider::templates::{ProfileSpec, TemplateRegistry, canonical_template_revision};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{Value, json};

pub const NAMESPACE: &str = "execution";
pub const EXECUTOR_ACCOUNT: &str = "execution-executor";
pub const ENV: &str = "exec-00112233445566778899aabbccddeeff00112233";
pub const TEMPLATE: &str = "sandbox";

/// The execution block of the test template; `edit` changes it before the key is computed.
pub fn execution(edit: impl FnOnce(&mut Value)) -> Value {
    let mut value = json!({
        "image": format!("registry.test/executor@sha256:{}", "a".repeat(64)),
        "storageClass": "standard",
        "storageSize": "1Gi",
        "cpuRequest": "100m",
        "cpuLimit": "1",
        "memoryRequest": "128Mi",
        "memoryLimit": "512Mi",
        "ephemeralStorageRequest": "256Mi",
        "ephemeralStorageLimit": "1Gi",
        "tmpSizeLimit": "256Mi",
        "runtimeClassName": "sandboxed",
        "maxFileBytes": 5_242_880,
        "maxCommandBytes": 1_048_576,
        "maxCommandDuration": "5m",
        "maxEnvironments": 100,
    });
    edit(&mut value);
    value
}

/// The revision key of an execution block.
pub fn key_of(execution: &Value) -> String {
    let spec: ProfileSpec = serde_json::from_value(execution.clone()).expect("profile spec");
    canonical_template_revision(&spec.validate().expect("valid spec"))
}

/// A registry whose template [`TEMPLATE`] has these revisions (the first is the default);
/// each entry is (execution, revoked).
pub fn registry_of(revisions: &[(Value, bool)]) -> TemplateRegistry {
    let mut map = serde_json::Map::new();
    for (execution, revoked) in revisions {
        let mut entry = json!({"execution": execution});
        if *revoked {
            entry["revoked"] = json!(true);
        }
        map.insert(key_of(execution), entry);
    }
    let default = revisions
        .iter()
        .find(|(_, revoked)| !revoked)
        .map(|(e, _)| key_of(e));
    let mut template = json!({"revisions": map});
    if let Some(default) = default {
        template["default"] = json!(default);
    }
    let file = json!({"templates": {TEMPLATE: template}});
    TemplateRegistry::from_yaml_str(&file.to_string(), "test templates").expect("registry")
}

/// The default test registry: one revision of [`execution`] unchanged.
pub fn registry() -> TemplateRegistry {
    registry_of(&[(execution(|_| {}), false)])
}

/// An API server, client, clock and the operator-provided objects. The test's own client
/// talks to the server directly; reconcilers talk through [`hooks::Hooked`], which records
/// their requests and applies the test's rules.
pub struct World {
    pub api: ApiServer,
    pub client: kube::Client,
    pub hooks: hooks::Hooked,
    pub runtime: Runtime,
}

impl World {
    /// An empty cluster with the `sandboxed` RuntimeClass, the `standard` StorageClass and the
    /// capacity ledger.
    pub async fn new() -> Self {
        let world = Self::bare();
        world.add_runtime_class("sandboxed", None).await;
        world.add_storage_class("standard").await;
        world.add_ledger(&[]).await;
        world
    }

    /// An empty cluster.
    pub fn bare() -> Self {
        let clock = Arc::new(OffsetClock::starting_at(
            UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        ));
        let ids = Arc::new(SeededIds::new(11));
        let api = ApiServer::in_memory(clock.clone(), ids.clone());
        let client = api.client(NAMESPACE);
        let hooks = hooks::Hooked::new(api.clone());
        Self {
            api,
            client,
            hooks,
            runtime: Runtime { clock, ids },
        }
    }

    pub fn now(&self) -> SystemTime {
        self.runtime.clock.wall()
    }

    pub async fn add_runtime_class(&self, name: &str, scheduling: Option<Value>) {
        let mut class = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": name}, "handler": "runsc"});
        if let Some(scheduling) = scheduling {
            class["scheduling"] = scheduling;
        }
        let class: RuntimeClass = serde_json::from_value(class).unwrap();
        Api::<RuntimeClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    pub async fn add_storage_class(&self, name: &str) {
        let class: StorageClass = serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass", "metadata": {"name": name}, "provisioner": "test"}))
        .unwrap();
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    /// The ledger with `names` reserved for [`TEMPLATE`], in the format before sharding (one
    /// JSON array in the root ConfigMap), and the empty shards beside it.
    pub async fn add_ledger(&self, names: &[&str]) {
        let data = BTreeMap::from([(ledger_key(TEMPLATE), serde_json::to_string(names).unwrap())]);
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), NAMESPACE);
        for index in 0..LEDGER_SHARDS {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(ledger_shard_name(index)),
                    ..ObjectMeta::default()
                },
                data: (index == 0).then(|| data.clone()),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &map).await.unwrap();
        }
    }

    /// Every name holding a slot of [`TEMPLATE`], in any format and shard.
    pub async fn ledger_names(&self) -> Vec<String> {
        let ledger = execution_provider::store::ledger::Ledger::new(
            Api::namespaced(self.client.clone(), NAMESPACE),
            Api::namespaced(self.client.clone(), NAMESPACE),
        );
        ledger
            .entries(TEMPLATE)
            .await
            .unwrap()
            .into_iter()
            .collect()
    }

    pub fn reconciler(&self, templates: &TemplateRegistry, account: &str) -> Arc<Reconciler> {
        self.reconciler_with(templates, account, DEFAULT_CACHE_SYNC_DEADLINE)
    }

    /// A reconciler whose caches must fill within `deadline`.
    pub fn reconciler_syncing_within(
        &self,
        templates: &TemplateRegistry,
        deadline: Duration,
    ) -> Arc<Reconciler> {
        self.reconciler_with(templates, EXECUTOR_ACCOUNT, deadline)
    }

    fn reconciler_with(
        &self,
        templates: &TemplateRegistry,
        account: &str,
        cache_sync_deadline: Duration,
    ) -> Arc<Reconciler> {
        Reconciler::new(
            self.hooks.client(NAMESPACE),
            ReconcilerConfig {
                namespace: NAMESPACE.to_owned(),
                executor_service_account: account.to_owned(),
                cache_sync_deadline,
            },
            Arc::new(templates.clone()),
            self.runtime.clone(),
        )
    }

    pub fn envs(&self) -> Api<ExecutionEnvironment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// How many executor Pods the namespace holds.
    pub async fn pod_count(&self) -> usize {
        self.pods()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len()
    }

    /// How many PVCs the namespace holds.
    pub async fn pvc_count(&self) -> usize {
        self.pvcs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len()
    }

    /// Creates [`ENV`] on the default revision of `templates`, as the store does (finalizer,
    /// then status schema 2, epoch 1), reserved in the ledger.
    pub async fn create_env(&self, templates: &TemplateRegistry) -> ExecutionEnvironment {
        let revision = templates.default_template(TEMPLATE).unwrap();
        self.create_env_on(
            revision.revision(),
            revision.digest(),
            revision.execution().image(),
        )
        .await
    }

    pub async fn create_env_on(
        &self,
        revision: &str,
        digest: &str,
        image: &str,
    ) -> ExecutionEnvironment {
        self.create_uninitialized(revision, digest, image, None)
            .await;
        self.edit_status(|s| {
            s.schema_version = Some(SCHEMA_VERSION);
            s.epoch = Some(1);
            s.grant_generation = Some(1);
        })
        .await
    }

    /// Creates the environment as the store's create does, before its status is initialized,
    /// with `create_deadline` in its spec.
    pub async fn create_uninitialized(
        &self,
        revision: &str,
        digest: &str,
        image: &str,
        create_deadline: Option<execution_provider::kube::crd::RfcTime>,
    ) -> ExecutionEnvironment {
        let hex = "0".repeat(64);
        let object = ExecutionEnvironment {
            metadata: ObjectMeta {
                name: Some(ENV.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                finalizers: Some(vec!["execution.mecatl.dev/retain-workspace".to_owned()]),
                ..ObjectMeta::default()
            },
            spec: ExecutionEnvironmentSpec {
                schema_version: SCHEMA_VERSION,
                allocation_id: ENV.to_owned(),
                revision: "0123456789abcdef0123456789abcdef".to_owned(),
                owner_hash: hex.clone(),
                owner_issuer: None,
                owner_subject: None,
                client_hash: hex.clone(),
                binding_id: "binding".to_owned(),
                request_fingerprint: hex,
                template_id: TEMPLATE.to_owned(),
                template_revision: revision.to_owned(),
                template_digest: digest.to_owned(),
                image: image.to_owned(),
                storage_class: "standard".to_owned(),
                storage_size: "1Gi".to_owned(),
                resources: ExecutorResources {
                    cpu_request: "100m".to_owned(),
                    memory_request: "128Mi".to_owned(),
                    cpu_limit: "1".to_owned(),
                    memory_limit: "512Mi".to_owned(),
                },
                desired: Desired::Active,
                create_deadline,
            },
            status: None,
        };
        self.envs()
            .create(&PostParams::default(), &object)
            .await
            .unwrap()
    }

    /// Changes the status directly (playing the store's part).
    pub async fn edit_status(
        &self,
        edit: impl FnOnce(&mut execution_provider::kube::crd::ExecutionEnvironmentStatus),
    ) -> ExecutionEnvironment {
        let mut env = self.env().await;
        edit(env.status.get_or_insert_with(Default::default));
        self.envs()
            .replace_status(ENV, &PostParams::default(), &env)
            .await
            .unwrap()
    }

    pub async fn env(&self) -> ExecutionEnvironment {
        self.envs().get(ENV).await.unwrap()
    }

    pub async fn pod(&self) -> Option<Pod> {
        self.pods().get_opt(&pod_name(ENV)).await.unwrap()
    }

    pub async fn pvc(&self) -> Option<PersistentVolumeClaim> {
        self.pvcs().get_opt(&pvc_name(ENV)).await.unwrap()
    }

    /// Plays the kubelet: the executor Pod runs and is Ready.
    pub async fn mark_pod_ready(&self) {
        self.set_pod_status(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "executor", "ready": true, "restartCount": 0,
                "image": "x", "imageID": "x", "state": {"running": {}}}]}))
            .await;
    }

    /// Plays the kubelet: the executor container exited and the Pod is terminal.
    pub async fn mark_pod_terminated(&self, phase: &str) {
        self.set_pod_status(json!({"phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "executor", "ready": false, "restartCount": 0,
                "image": "x", "imageID": "x", "state": {"terminated": {"exitCode": 0}}}]}))
            .await;
    }

    async fn set_pod_status(&self, status: Value) {
        let mut pod = self.pod().await.expect("pod exists");
        pod.status = Some(serde_json::from_value(status).unwrap());
        self.pods()
            .replace_status(&pod_name(ENV), &PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// Replaces the Pod object (for shape tampering); keeps its status.
    pub async fn replace_pod(&self, edit: impl FnOnce(&mut Pod)) {
        let mut pod = self.pod().await.expect("pod exists");
        edit(&mut pod);
        self.pods()
            .replace(&pod_name(ENV), &PostParams::default(), &pod)
            .await
            .unwrap();
    }
}

/// The condition `type_` of `env`.
pub fn cond(env: &ExecutionEnvironment, type_: &str) -> Option<EnvironmentCondition> {
    env.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// (status, reason) of the Ready condition.
pub fn ready(env: &ExecutionEnvironment) -> Option<(ConditionStatus, String)> {
    cond(env, condition::READY).map(|c| (c.status, c.reason))
}

/// A reconciler running its watch-driven work queue until [`Running::stop`].
pub struct Running {
    pub reconciler: Arc<Reconciler>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), execution_provider::reconciler::InitError>>,
}

impl Running {
    /// Starts `reconciler` and waits (polling, with a deadline) until its caches are filled.
    pub async fn start(reconciler: Arc<Reconciler>) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(reconciler.clone().run(async move {
            let _ = stopped.await;
        }));
        let running = Self {
            reconciler,
            stop: Some(stop),
            task,
        };
        let reconciler = running.reconciler.clone();
        wait_until("the reconciler becomes ready", || {
            let ready = reconciler.is_ready();
            async move { ready }
        })
        .await;
        running
    }

    /// Stops the work queue and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

/// Polls `condition` every 10 ms (tokio time) until it holds; panics after 120 s.
pub async fn wait_until<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(
        what,
        Duration::from_millis(10),
        Duration::from_secs(120),
        condition,
    )
    .await;
}

/// Polls `condition` every `period` (tokio time) until it holds; panics after `limit`.
pub async fn poll_until<F, Fut>(what: &str, period: Duration, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(period).await;
    }
}

/// Lets every task run until nothing is left to do (under paused time, a sleep only ends once
/// all other tasks are idle, then the clock jumps).
pub async fn settle() {
    tokio::time::sleep(Duration::from_secs(5)).await;
}

/// One Event on the environment as read back from the API: (type, reason, action).
pub type EventSeen = (String, String, String);

impl World {
    /// Publishes `reconciler`'s Events (and those of stores that take them) to this cluster.
    pub fn record_events(
        &self,
        reconciler: &Reconciler,
    ) -> execution_provider::telemetry::events::EventRecorder {
        let events = execution_provider::telemetry::events::EventRecorder::new(
            self.hooks.client(NAMESPACE),
            NAMESPACE,
            Some("replica-a".to_owned()),
        );
        reconciler.record_events(events.clone());
        events
    }

    /// The Events about [`ENV`] in the order written, once there are at least `count` of them
    /// (their writes are asynchronous; polled with a 10 s deadline). Each regards the
    /// environment by name, kind and namespace, and is reported by the provider.
    pub async fn events(&self, count: usize) -> Vec<EventSeen> {
        use k8s_openapi::api::events::v1::Event;
        let api = Api::<Event>::namespaced(self.client.clone(), NAMESPACE);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut listed = api.list(&Default::default()).await.unwrap().items;
            listed.retain(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(ENV));
            if listed.len() >= count || tokio::time::Instant::now() >= deadline {
                listed.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
                for e in &listed {
                    let regarding = e.regarding.as_ref().unwrap();
                    assert_eq!(regarding.kind.as_deref(), Some("ExecutionEnvironment"));
                    assert_eq!(regarding.namespace.as_deref(), Some(NAMESPACE));
                    assert_eq!(
                        e.reporting_controller.as_deref(),
                        Some("execution-provider")
                    );
                    assert!(e.note.as_ref().is_some_and(|n| !n.is_empty()), "{e:?}");
                }
                return listed
                    .into_iter()
                    .map(|e| {
                        let field = |v: Option<String>| v.unwrap_or_default();
                        (field(e.type_), field(e.reason), field(e.action))
                    })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// An expected Event: (type, reason, action).
pub fn event(type_: &str, reason: &str, action: &str) -> EventSeen {
    (type_.to_owned(), reason.to_owned(), action.to_owned())
}
