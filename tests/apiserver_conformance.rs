//! Conformance of the in-process API server: the production kube-rs client (`Api`, watches,
//! `kube::runtime::watcher`) against it, checking the real Kubernetes API semantics.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use execution_provider::{
    kube::apiserver::{ApiServer, ApiServerError, LEGACY_STATE_FILE, STATE_FILE},
    runtime::{SeededIds, clock::OffsetClock},
};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Container, Pod, PodSpec, PodStatus},
        node::v1::RuntimeClass,
        storage::v1::StorageClass,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, CustomResource, ResourceExt,
    api::{
        DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
        WatchParams,
    },
    runtime::watcher,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A minimal stand-in for the provider's custom resource, enough to exercise CR semantics.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "execution.mecatl.dev",
    version = "v1alpha1",
    kind = "ExecutionEnvironment",
    namespaced,
    status = "EnvironmentStatus"
)]
struct EnvironmentSpec {
    owner: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
struct EnvironmentStatus {
    phase: String,
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn server() -> ApiServer {
    let clock = OffsetClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    ApiServer::in_memory(Arc::new(clock), Arc::new(SeededIds::new(7)))
}

fn open(dir: &std::path::Path) -> Result<ApiServer, ApiServerError> {
    let clock = OffsetClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    ApiServer::open(dir, Arc::new(clock), Arc::new(SeededIds::new(9)))
}

fn config_map(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..ConfigMap::default()
    }
}

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".to_string(),
                image: Some("busybox".to_string()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            ..PodStatus::default()
        }),
    }
}

fn environment(name: &str, owner: &str) -> ExecutionEnvironment {
    let mut env = ExecutionEnvironment::new(
        name,
        EnvironmentSpec {
            owner: owner.to_string(),
        },
    );
    env.status = Some(EnvironmentStatus {
        phase: "Forged".to_string(),
    });
    env
}

/// The HTTP code and reason of an API error.
fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv<K: ResourceExt>(object: &K) -> u64 {
    object
        .resource_version()
        .expect("stored objects have a resourceVersion")
        .parse()
        .expect("resourceVersions are numbers here")
}

fn names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(ResourceExt::name_any).collect()
}

/// The next non-bookmark watch event, within the deadline.
async fn next_event<K, S>(stream: &mut S) -> WatchEvent<K>
where
    S: Stream<Item = Result<WatchEvent<K>, kube::Error>> + Unpin,
    K: std::fmt::Debug,
{
    tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                Some(event) => return event.expect("watch event"),
                None => panic!("watch stream ended"),
            }
        }
    })
    .await
    .expect("a watch event before the deadline")
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_answers_409_conflict() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let mut fresh = created.clone();
    fresh.data = Some([("k".to_string(), "new".to_string())].into());
    let replaced = api
        .replace("a", &PostParams::default(), &fresh)
        .await
        .expect("replace");
    assert!(rv(&replaced) > rv(&created));

    let mut stale = created;
    stale.data = Some([("k".to_string(), "lost".to_string())].into());
    let result = api.replace("a", &PostParams::default(), &stale).await;
    assert_eq!(api_error(result), (409, "Conflict".to_string()));
    let data = api.get("a").await.expect("get").data.expect("data");
    assert_eq!(data["k"], "new");
}

#[tokio::test]
async fn creating_the_same_object_twice_answers_409_already_exists() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    api.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("first create");
    let again = api
        .create(&PostParams::default(), &config_map("a", &[]))
        .await;
    assert_eq!(api_error(again), (409, "AlreadyExists".to_string()));
}

#[tokio::test]
async fn created_objects_get_uid_timestamp_generation_and_generated_names() {
    let server = server();
    let api: Api<ExecutionEnvironment> = Api::default_namespaced(server.client("default"));
    let mut env = environment("", "alice");
    env.metadata.name = None;
    env.metadata.generate_name = Some("env-".to_string());
    let created = api
        .create(&PostParams::default(), &env)
        .await
        .expect("create");
    let name = created.name_any();
    assert!(name.starts_with("env-") && name.len() == 9, "{name}");
    assert_eq!(created.uid().expect("uid").len(), 36);
    assert_eq!(created.metadata.generation, Some(1));
    let created_at = created.metadata.creation_timestamp.expect("timestamp");
    assert_eq!(created_at.0.as_second(), 1_800_000_000);
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    let unnamed = api
        .create(&PostParams::default(), &environment("", "bob"))
        .await;
    assert_eq!(api_error(unnamed), (422, "Invalid".to_string()));
}

#[tokio::test]
async fn get_of_a_missing_object_is_404_not_found() {
    let server = server();
    let api: Api<Pod> = Api::default_namespaced(server.client("default"));
    assert_eq!(
        api_error(api.get("nope").await),
        (404, "NotFound".to_string())
    );
    assert!(api.get_opt("nope").await.expect("get_opt").is_none());
    let deleted = api.delete("nope", &DeleteParams::default()).await;
    assert_eq!(api_error(deleted), (404, "NotFound".to_string()));
}

#[tokio::test]
async fn watch_events_arrive_in_order_with_increasing_resource_versions() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let list = api.list(&ListParams::default()).await.expect("list");
    let start = list
        .metadata
        .resource_version
        .expect("list resourceVersion");
    let mut stream = api
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch")
        .boxed();

    api.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let patch = Patch::Merge(json!({"data": {"k": "changed"}}));
    api.patch("a", &PatchParams::default(), &patch)
        .await
        .expect("patch");
    api.delete("a", &DeleteParams::default())
        .await
        .expect("delete");

    let mut seen = Vec::new();
    for _ in 0..3 {
        let (kind, object) = match next_event(&mut stream).await {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("unexpected {other:?}"),
        };
        seen.push((kind, rv(&object)));
    }
    let kinds: Vec<_> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, vec!["ADDED", "MODIFIED", "DELETED"]);
    assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "{seen:?}");
    assert!(seen[0].1 > start.parse().expect("number"));
}

#[tokio::test]
async fn a_watch_without_resource_version_starts_with_the_current_objects() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    api.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    assert!(matches!(next_event(&mut stream).await, WatchEvent::Added(o) if o.name_any() == "a"));
    api.create(&PostParams::default(), &config_map("b", &[]))
        .await
        .expect("create");
    assert!(matches!(next_event(&mut stream).await, WatchEvent::Added(o) if o.name_any() == "b"));
}

#[tokio::test]
async fn a_finalizer_holds_a_delete_until_it_is_removed_then_the_object_is_deleted() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let mut held = config_map("held", &[]);
    held.metadata.finalizers = Some(vec!["mecatl.dev/hold".to_string()]);
    let created = api
        .create(&PostParams::default(), &held)
        .await
        .expect("create");
    let mut stream = api
        .watch(&WatchParams::default(), &rv(&created).to_string())
        .await
        .expect("watch")
        .boxed();

    let answer = api
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = answer.left().expect("the held object is returned");
    assert!(marked.metadata.deletion_timestamp.is_some());
    let still = api.get("held").await.expect("still readable");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(still.metadata.deletion_grace_period_seconds, Some(0));
    match next_event(&mut stream).await {
        WatchEvent::Modified(o) => assert!(o.metadata.deletion_timestamp.is_some()),
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    let more = Patch::Merge(json!({"metadata": {"finalizers": ["mecatl.dev/hold", "new"]}}));
    let refused = api.patch("held", &PatchParams::default(), &more).await;
    assert_eq!(api_error(refused), (422, "Invalid".to_string()));

    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("held", &PatchParams::default(), &release)
        .await
        .expect("remove finalizers");
    assert!(api.get_opt("held").await.expect("get").is_none());
    assert!(
        matches!(next_event(&mut stream).await, WatchEvent::Deleted(o) if o.name_any() == "held")
    );
}

#[tokio::test]
async fn delete_with_a_wrong_uid_precondition_answers_409_conflict() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-4000-8000-000000000000".to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("a", &wrong).await),
        (409, "Conflict".to_string())
    );
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("999".to_string()),
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("a", &stale).await),
        (409, "Conflict".to_string())
    );
    assert!(api.get_opt("a").await.expect("get").is_some());
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: created.resource_version(),
        }),
        ..DeleteParams::default()
    };
    let status = api.delete("a", &right).await.expect("delete");
    assert!(status.is_right(), "a ConfigMap delete answers a Status");
    assert!(api.get_opt("a").await.expect("get").is_none());
}

#[tokio::test]
async fn lists_filter_by_label_selector_and_field_selector() {
    let server = server();
    let client = server.client("default");
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    for (name, labels) in [
        ("a", vec![("app", "web"), ("tier", "fe")]),
        ("b", vec![("app", "web"), ("tier", "db")]),
        ("c", vec![("app", "db")]),
    ] {
        api.create(&PostParams::default(), &config_map(name, &labels))
            .await
            .expect("create");
    }
    other
        .create(&PostParams::default(), &config_map("d", &[("app", "web")]))
        .await
        .expect("create");

    let select = |labels: &str| ListParams::default().labels(labels);
    let cases = [
        ("app=web", vec!["a", "b"]),
        ("app=web,tier!=db", vec!["a"]),
        ("tier in (fe,db)", vec!["a", "b"]),
        ("tier notin (fe)", vec!["b", "c"]),
        ("!tier", vec!["c"]),
        ("tier", vec!["a", "b"]),
    ];
    for (selector, expected) in cases {
        let list = api.list(&select(selector)).await.expect("list");
        assert_eq!(names(&list.items), expected, "{selector}");
    }
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .expect("list");
    assert_eq!(names(&by_name.items), vec!["b"]);
    let everywhere: Api<ConfigMap> = Api::all(client);
    let web = everywhere.list(&select("app=web")).await.expect("list all");
    assert_eq!(names(&web.items), vec!["a", "b", "d"]);
    let in_other = everywhere
        .list(&ListParams::default().fields("metadata.namespace=other"))
        .await
        .expect("list");
    assert_eq!(names(&in_other.items), vec!["d"]);
    assert!(web.metadata.resource_version.is_some());
    let bad = api.list(&select("app in web")).await;
    assert_eq!(api_error(bad), (400, "BadRequest".to_string()));
    let unsupported = api.list(&ListParams::default().fields("data.k=v")).await;
    assert_eq!(api_error(unsupported), (400, "BadRequest".to_string()));
}

#[tokio::test]
async fn a_label_selector_watch_sees_objects_enter_and_leave_as_added_and_deleted() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &config_map("a", &[("app", "db")]))
        .await
        .expect("create");
    let params = WatchParams::default().labels("app=web");
    let mut stream = api
        .watch(&params, &rv(&created).to_string())
        .await
        .expect("watch")
        .boxed();
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    for app in ["web", "db"] {
        api.patch("a", &PatchParams::default(), &relabel(app))
            .await
            .expect("patch");
    }
    assert!(matches!(
        next_event(&mut stream).await,
        WatchEvent::Added(_)
    ));
    assert!(matches!(
        next_event(&mut stream).await,
        WatchEvent::Deleted(_)
    ));
}

#[tokio::test]
async fn a_watch_from_a_too_old_resource_version_gets_410_gone_and_one_from_the_future_504() {
    let server = server();
    server.set_watch_history_limit(2);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    for name in ["a", "b", "c", "d"] {
        api.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .expect("create");
    }
    let mut stream = api
        .watch(&WatchParams::default(), "1")
        .await
        .expect("watch")
        .boxed();
    match next_event(&mut stream).await {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the error"
    );
    let mut future = api
        .watch(&WatchParams::default(), "99")
        .await
        .expect("watch")
        .boxed();
    match next_event(&mut future).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (504, "Timeout"))
        }
        other => panic!("expected a 504 ERROR event, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_watcher_sees_objects_and_converges_after_a_410_relist() {
    let server = server();
    server.set_watch_history_limit(3);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    api.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = BTreeSet::new();
    let mut expired = 0;
    tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitApply(o)) => {
                    seen.insert(o.name_any());
                }
                Ok(watcher::Event::InitDone) => break,
                Ok(_) => {}
                Err(e) => panic!("unexpected {e}"),
            }
        }
    })
    .await
    .expect("initial list");
    assert_eq!(seen, BTreeSet::from(["a".to_string()]));

    // While the watcher is not polled, more changes happen than the history keeps.
    let wanted: BTreeSet<String> = (0..10)
        .map(|i| format!("n{i}"))
        .chain(["a".into()])
        .collect();
    for name in wanted.iter().filter(|n| *n != "a") {
        api.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .expect("create");
    }
    seen.clear();
    tokio::time::timeout(TIMEOUT, async {
        while seen != wanted {
            match stream.next().await.expect("the watcher runs forever") {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    seen.insert(o.name_any());
                }
                Ok(watcher::Event::Init) => seen.clear(),
                Ok(_) => {}
                Err(watcher::Error::WatchError(status)) if status.code == 410 => expired += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    })
    .await
    .expect("the watcher converges");
    assert_eq!(expired, 1);

    api.create(&PostParams::default(), &config_map("late", &[]))
        .await
        .expect("create");
    let late = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Ok(watcher::Event::Apply(o)) = stream.next().await.expect("event") {
                return o;
            }
        }
    })
    .await
    .expect("the resumed watch delivers new objects");
    assert_eq!(late.name_any(), "late");
}

#[tokio::test(start_paused = true)]
async fn a_watcher_lists_in_pages_or_as_a_streaming_list() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .expect("create");
    }
    let configs = [
        watcher::Config::default().page_size(1),
        watcher::Config::default().streaming_lists(),
    ];
    for config in configs {
        let mut stream = watcher(api.clone(), config).boxed();
        let mut seen = Vec::new();
        tokio::time::timeout(TIMEOUT, async {
            loop {
                match stream.next().await.expect("the watcher runs") {
                    Ok(watcher::Event::InitApply(o)) => seen.push(o.name_any()),
                    Ok(watcher::Event::InitDone) => break,
                    Ok(_) => {}
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        })
        .await
        .expect("the initial list completes");
        assert_eq!(seen, vec!["a", "b", "c"]);
    }
}

#[tokio::test(start_paused = true)]
async fn bookmarks_arrive_when_allowed_and_carry_the_current_resource_version() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let mut stream = api
        .watch(&WatchParams::default(), &rv(&created).to_string())
        .await
        .expect("watch")
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(120), stream.try_next())
        .await
        .expect("a bookmark within two minutes")
        .expect("no error")
        .expect("stream open");
    match event {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.resource_version, rv(&created).to_string())
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn the_status_subresource_changes_status_only_and_the_main_endpoint_ignores_status() {
    let server = server();
    let api: Api<Pod> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &pod("p"))
        .await
        .expect("create");
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase(&created).as_deref(),
        Some("Pending"),
        "create ignores status"
    );

    let status_patch = Patch::Merge(json!({
        "status": {"phase": "Running"},
        "metadata": {"labels": {"ignored": "yes"}},
        "spec": {"containers": [{"name": "main", "image": "other"}]},
    }));
    let patched = api
        .patch_status("p", &PatchParams::default(), &status_patch)
        .await
        .expect("status patch");
    assert_eq!(phase(&patched).as_deref(), Some("Running"));
    assert!(patched.labels().is_empty());
    let image = |p: &Pod| p.spec.as_ref().expect("spec").containers[0].image.clone();
    assert_eq!(image(&patched).as_deref(), Some("busybox"));

    let main_patch =
        Patch::Merge(json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}}));
    let patched = api
        .patch("p", &PatchParams::default(), &main_patch)
        .await
        .expect("main patch");
    assert_eq!(phase(&patched).as_deref(), Some("Running"));
    assert_eq!(patched.labels()["x"], "y");

    let envs: Api<ExecutionEnvironment> = Api::default_namespaced(server.client("default"));
    let env = envs
        .create(&PostParams::default(), &environment("e", "alice"))
        .await
        .expect("create CR");
    assert_eq!(
        env.status, None,
        "a CR with a status subresource drops status on create"
    );
    let mut with_status = env.clone();
    with_status.status = Some(EnvironmentStatus {
        phase: "Ready".to_string(),
    });
    let replaced = envs
        .replace_status("e", &PostParams::default(), &with_status)
        .await
        .expect("replace status");
    assert_eq!(replaced.status.expect("status").phase, "Ready");
    let stale = envs
        .replace_status("e", &PostParams::default(), &with_status)
        .await;
    assert_eq!(api_error(stale), (409, "Conflict".to_string()));
}

#[tokio::test]
async fn generation_bumps_on_spec_changes_only() {
    let server = server();
    let api: Api<ExecutionEnvironment> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &environment("e", "alice"))
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    let params = PatchParams::default();
    let labelled = api
        .patch(
            "e",
            &params,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(labelled.metadata.generation, Some(1));
    let status = api
        .patch_status(
            "e",
            &params,
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .expect("status");
    assert_eq!(status.metadata.generation, Some(1));
    let json_patch = Patch::Json::<()>(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/owner", "value": "alice"},
            {"op": "replace", "path": "/spec/owner", "value": "bob"},
        ]))
        .expect("json patch"),
    );
    let respecced = api.patch("e", &params, &json_patch).await.expect("spec");
    assert_eq!(respecced.metadata.generation, Some(2));
    assert_eq!(respecced.spec.owner, "bob");

    let unchanged = api
        .replace("e", &PostParams::default(), &respecced)
        .await
        .expect("no-op replace");
    assert_eq!(unchanged.metadata.generation, Some(2));
    assert_eq!(
        rv(&unchanged),
        rv(&respecced),
        "a no-op write keeps the resourceVersion"
    );

    let failed_test = api.patch("e", &params, &json_patch).await;
    assert_eq!(api_error(failed_test), (422, "Invalid".to_string()));
    let mut unconditional = respecced.clone();
    unconditional.metadata.resource_version = None;
    unconditional.spec.owner = "carol".to_string();
    let refused = api
        .replace("e", &PostParams::default(), &unconditional)
        .await;
    assert_eq!(api_error(refused), (422, "Invalid".to_string()));
}

#[tokio::test]
async fn a_stale_resource_version_in_a_merge_patch_is_a_conflict() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let created = api
        .create(&PostParams::default(), &config_map("a", &[]))
        .await
        .expect("create");
    let current = rv(&created).to_string();
    let guarded =
        |rv: &str| Patch::Merge(json!({"metadata": {"resourceVersion": rv}, "data": {"k": rv}}));
    api.patch("a", &PatchParams::default(), &guarded(&current))
        .await
        .expect("fresh precondition");
    let stale = api
        .patch("a", &PatchParams::default(), &guarded(&current))
        .await;
    assert_eq!(api_error(stale), (409, "Conflict".to_string()));
    let strategic = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {}})),
        )
        .await;
    assert_eq!(
        api_error(strategic),
        (415, "UnsupportedMediaType".to_string())
    );
}

#[tokio::test]
async fn dry_run_writes_answer_but_store_nothing() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let before = server.resource_version();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let answer = api
        .create(&dry, &config_map("a", &[]))
        .await
        .expect("dry create");
    assert_eq!(answer.name_any(), "a");
    assert!(api.get_opt("a").await.expect("get").is_none());
    assert_eq!(server.resource_version(), before);
}

#[tokio::test]
async fn cluster_scoped_runtime_classes_and_storage_classes_can_be_seeded_and_read() {
    let server = server();
    let client = server.client("default");
    let runtime_classes: Api<RuntimeClass> = Api::all(client.clone());
    let gvisor = RuntimeClass {
        metadata: ObjectMeta {
            name: Some("gvisor".to_string()),
            ..ObjectMeta::default()
        },
        handler: "runsc".to_string(),
        ..RuntimeClass::default()
    };
    let created = runtime_classes
        .create(&PostParams::default(), &gvisor)
        .await
        .expect("create runtime class");
    assert_eq!(created.metadata.namespace, None);
    assert_eq!(
        runtime_classes.get("gvisor").await.expect("get").handler,
        "runsc"
    );

    let storage_classes: Api<StorageClass> = Api::all(client);
    let standard = StorageClass {
        metadata: ObjectMeta {
            name: Some("standard".to_string()),
            ..ObjectMeta::default()
        },
        provisioner: "example.com/local".to_string(),
        ..StorageClass::default()
    };
    storage_classes
        .create(&PostParams::default(), &standard)
        .await
        .expect("create storage class");
    let list = storage_classes
        .list(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(names(&list.items), vec!["standard"]);
}

/// Reopens `dir` once the previous server's last clone (held by its client's buffer task,
/// which ends asynchronously after the client is dropped) has released the directory lock.
async fn reopen_when_released(
    dir: &std::path::Path,
    first_try: Result<ApiServer, ApiServerError>,
) -> ApiServer {
    let mut attempt = first_try;
    tokio::time::timeout(TIMEOUT, async {
        loop {
            match attempt {
                Ok(server) => return server,
                Err(ApiServerError::Locked { .. }) => tokio::task::yield_now().await,
                Err(e) => panic!("reopen failed: {e}"),
            }
            attempt = open(dir);
        }
    })
    .await
    .expect("the previous server releases the directory")
}

#[tokio::test]
async fn a_state_directory_in_use_by_a_live_server_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = open(dir.path()).expect("open");
    let second = open(dir.path()).expect_err("in use");
    assert!(matches!(second, ApiServerError::Locked { .. }), "{second}");
    assert!(second.to_string().contains("in use"), "{second}");
    drop(first);
    open(dir.path()).expect("free again");
}

#[tokio::test]
async fn persisted_state_survives_reopening_the_same_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (uid, last_rv) = {
        let server = open(dir.path()).expect("open empty");
        assert_eq!(
            server.state_file(),
            Some(dir.path().join(STATE_FILE).as_path())
        );
        let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
        let kept = api
            .create(&PostParams::default(), &config_map("kept", &[]))
            .await
            .expect("create");
        api.create(&PostParams::default(), &config_map("gone", &[]))
            .await
            .expect("create");
        api.delete("gone", &DeleteParams::default())
            .await
            .expect("delete");
        (kept.uid().expect("uid"), server.resource_version())
    };

    let second = open(dir.path());
    let server = reopen_when_released(dir.path(), second).await;
    assert_eq!(server.resource_version(), last_rv);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let kept = api.get("kept").await.expect("kept survives");
    assert_eq!(kept.uid(), Some(uid));
    assert!(api.get_opt("gone").await.expect("get").is_none());
    let next = api
        .create(&PostParams::default(), &config_map("next", &[]))
        .await
        .expect("create");
    assert!(rv(&next) > last_rv, "the counter continues");
    let mut old = api
        .watch(&WatchParams::default(), "1")
        .await
        .expect("watch")
        .boxed();
    assert!(matches!(next_event(&mut old).await, WatchEvent::Error(s) if s.code == 410));
}

#[tokio::test]
async fn a_corrupt_state_file_is_a_clear_error_naming_the_file_and_is_left_untouched() {
    for (file, content) in [
        (
            STATE_FILE,
            "not a database, although long enough to hold a header of sorts",
        ),
        (
            LEGACY_STATE_FILE,
            "{\"format\": \"execution-provider/apiserver-state\", \"vers",
        ),
        (LEGACY_STATE_FILE, "{\"some\": \"other tool\"}"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(file);
        std::fs::write(&path, content).expect("write");
        let err = open(dir.path()).expect_err("refused");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("left untouched"), "{message}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), content);
    }
}

#[tokio::test]
async fn a_hyper_http1_connection_can_serve_the_api_server() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use tower::Service;

    let server = server();
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let service = hyper::service::service_fn(move |request| {
        let mut server = server.clone();
        async move { server.call(request).await }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(server_io), service);
    tokio::spawn(connection);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .expect("handshake");
    tokio::spawn(connection);

    let body = serde_json::to_vec(&config_map("over-hyper", &[])).expect("json");
    let request = http::Request::post("/api/v1/namespaces/default/configmaps")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), http::StatusCode::CREATED);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let created: ConfigMap = serde_json::from_slice(&bytes).expect("a ConfigMap");
    assert_eq!(created.name_any(), "over-hyper");
}
