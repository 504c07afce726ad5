//! Durability of the persisted API server. A writer process (this test binary re-run as a
//! child) creates, updates and deletes ConfigMaps through the kube client and prints each
//! acknowledged write; it is killed (SIGKILL) at a different point each round, mostly in the
//! middle of a write, and the reopened state must hold every acknowledged write (and at most
//! the one write that was in flight). A state directory written by the JSON-file version is
//! migrated on the first start.

use std::{
    collections::BTreeMap,
    path::Path,
    process::Stdio,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use execution_provider::{
    kube::apiserver::{
        ApiServer, ApiServerError, LEGACY_STATE_FILE, MIGRATED_LEGACY_STATE_FILE, STATE_FILE,
    },
    runtime::{SeededIds, clock::OffsetClock},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const TIMEOUT: Duration = Duration::from_secs(60);
/// Set in the child: the state directory it writes to.
const WRITER_DIR_ENV: &str = "EXECUTION_PROVIDER_TEST_CRASH_WRITER_DIR";
/// What the writer prints, followed by ` N RV`, once its N-th write is acknowledged.
const ACK: &str = "acknowledged-write";
const WRITER_TEST: &str = "acknowledged_writes_survive_a_kill_at_any_point";

fn try_open(dir: &Path) -> Result<ApiServer, ApiServerError> {
    let clock = OffsetClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    ApiServer::open(dir, Arc::new(clock), Arc::new(SeededIds::new(9)))
}

/// Opens `dir` once an earlier server in this process (kept alive by its client's buffer task
/// for a moment after the client is dropped) has released the directory lock.
async fn open(dir: &Path) -> ApiServer {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            match try_open(dir) {
                Ok(server) => return server,
                Err(ApiServerError::Locked { .. }) => tokio::task::yield_now().await,
                Err(e) => panic!("cannot open {}: {e}", dir.display()),
            }
        }
    })
    .await
    .expect("the directory is released")
}

/// The n-th write of the writer: mostly creates, with updates of and deletes of earlier
/// objects, so every kind of change is in flight at some kill.
enum Op {
    Create(String),
    Update(String, u64),
    Delete(String),
}

fn op(n: u64) -> Op {
    match n % 4 {
        0 | 1 => Op::Create(format!("cm-{n}")),
        2 => Op::Update(format!("cm-{}", n - 2), n),
        _ => Op::Delete(format!("cm-{}", n - 2)),
    }
}

/// What the ConfigMaps hold after the first `count` writes: name → `data.n`.
fn model(count: u64) -> BTreeMap<String, u64> {
    let mut state = BTreeMap::new();
    for n in 0..count {
        match op(n) {
            Op::Create(name) => state.insert(name, n),
            Op::Update(name, value) => state.insert(name, value),
            Op::Delete(name) => state.remove(&name),
        };
    }
    state
}

fn config_map(name: &str, n: u64) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"n": n.to_string()}}))
        .expect("a ConfigMap")
}

/// The child: writes until killed, printing `acknowledged-write N RV` after the N-th write is
/// acknowledged. Each write waits for a line on stdin, so the parent knows exactly which write
/// can be in flight when it kills (its output is read through a pipe, and under load the
/// parent reads it late: a writer running ahead would have landed writes it never saw).
async fn write_forever(dir: &Path) {
    let server = open(dir).await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let mut go = BufReader::new(tokio::io::stdin()).lines();
    for n in 0.. {
        if go.next_line().await.expect("stdin").is_none() {
            return;
        }
        let answer = match op(n) {
            Op::Create(name) => {
                api.create(&PostParams::default(), &config_map(&name, n))
                    .await
            }
            Op::Update(name, value) => {
                let patch = Patch::Merge(json!({"data": {"n": value.to_string()}}));
                api.patch(&name, &PatchParams::default(), &patch).await
            }
            Op::Delete(name) => api
                .delete(&name, &DeleteParams::default())
                .await
                .map(|either| either.left().unwrap_or_default()),
        };
        answer.expect("the write is acknowledged");
        println!("{ACK} {n} {}", server.resource_version());
    }
}

async fn stored(dir: &Path) -> (BTreeMap<String, u64>, u64) {
    let server = open(dir).await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client("default"));
    let list = api.list(&ListParams::default()).await.expect("list");
    let state = list
        .items
        .iter()
        .map(|cm| {
            let n = cm.data.as_ref().expect("data")["n"]
                .parse()
                .expect("a number");
            (cm.name_any(), n)
        })
        .collect();
    (state, server.resource_version())
}

/// Runs the writer until it acknowledged `acks` writes, kills it, and returns the last
/// acknowledged write's number and resourceVersion.
async fn run_writer_and_kill(dir: &Path, acks: u64) -> (u64, u64) {
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", WRITER_TEST, "--nocapture", "--test-threads=1"])
        .env(WRITER_DIR_ENV, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the writer starts");
    let mut go = child.stdin.take().expect("stdin");
    go.write_all(b"go\n").await.expect("the writer reads");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let last = tokio::time::timeout(TIMEOUT, async {
        let mut seen = 0;
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read")
                .expect("the writer runs until killed");
            // libtest may print its own words before the first line on the same line.
            let Some((_, ack)) = line.split_once(ACK) else {
                continue;
            };
            let ack = ack.trim_start();
            let (n, rv) = ack.split_once(' ').expect("N RV");
            seen += 1;
            // One more write goes ahead in every case: after the last acknowledged one it is
            // the write in flight when the kill lands.
            go.write_all(b"go\n").await.expect("the writer reads");
            if seen == acks {
                return (n.parse().expect("N"), rv.parse().expect("RV"));
            }
        }
    })
    .await
    .expect("the writer acknowledges writes");
    child.kill().await.expect("kill");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_kill_at_any_point() {
    if let Some(dir) = std::env::var_os(WRITER_DIR_ENV) {
        write_forever(Path::new(&dir)).await;
        return;
    }
    for acks in [1, 2, 3, 4, 7, 18, 41, 100] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (last, last_rv) = run_writer_and_kill(tmp.path(), acks).await;
        assert_eq!(last + 1, acks);
        let (state, rv) = stored(tmp.path()).await;
        // Every acknowledged write is there; the write in flight at the kill may be too.
        let acknowledged = model(acks);
        let with_in_flight = model(acks + 1);
        assert!(
            state == acknowledged || state == with_in_flight,
            "after {acks} acknowledged writes the store holds {state:?}, expected {acknowledged:?} \
             (or {with_in_flight:?})"
        );
        assert!(
            rv >= last_rv,
            "the counter went back from {last_rv} to {rv}"
        );
    }
}

#[tokio::test]
async fn a_state_directory_of_the_json_file_version_is_migrated_on_first_start() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/legacy_apiserver")
        .join(LEGACY_STATE_FILE);
    let legacy: Value =
        serde_json::from_slice(&std::fs::read(&fixture).expect("fixture")).expect("json");
    let expected: BTreeMap<(String, String), Value> = legacy["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().expect("name").to_string();
            (
                (o["kind"].as_str().expect("kind").to_string(), name),
                o.clone(),
            )
        })
        .collect();
    let counter: u64 = legacy["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("number");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&fixture, tmp.path().join(LEGACY_STATE_FILE)).expect("copy");

    let read_all = |server: &ApiServer| {
        let mut found = BTreeMap::new();
        for kind in [
            "ConfigMap",
            "ExecutionEnvironment",
            "PersistentVolumeClaim",
            "Pod",
            "RuntimeClass",
            "StorageClass",
        ] {
            for object in server.objects_of_kind(kind) {
                let name = object["metadata"]["name"].as_str().expect("name");
                found.insert((kind.to_string(), name.to_string()), object);
            }
        }
        found
    };
    {
        let server = open(tmp.path()).await;
        assert_eq!(
            server.state_file(),
            Some(tmp.path().join(STATE_FILE).as_path())
        );
        assert_eq!(server.resource_version(), counter);
        assert_eq!(read_all(&server), expected);
        assert!(!tmp.path().join(LEGACY_STATE_FILE).exists());
        assert!(tmp.path().join(MIGRATED_LEGACY_STATE_FILE).exists());
        let api: Api<ConfigMap> = Api::namespaced(server.client("execution"), "execution");
        let created = api
            .create(&PostParams::default(), &config_map("after-migration", 1))
            .await
            .expect("writes continue");
        assert_eq!(created.resource_version(), Some((counter + 1).to_string()));
    }
    let server = open(tmp.path()).await;
    assert_eq!(server.resource_version(), counter + 1);
    let mut after = read_all(&server);
    assert!(
        after
            .remove(&("ConfigMap".to_string(), "after-migration".to_string()))
            .is_some()
    );
    assert_eq!(
        after, expected,
        "the database, not the JSON file, is read now"
    );
}
