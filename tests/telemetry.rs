//! What the provider tells operators (src/telemetry): JSON log lines, and the audit line of
//! every data-plane call of a walk in `dev`, which names the client, the owner's hash, the
//! environment, the operation, the outcome and the duration, and nothing the call carried.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::store::naming::owner_hash;
use execution_provider::telemetry::{self, LogFormat, audit};
use tracing_subscriber::EnvFilter;

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).expect("log lines are UTF-8")
    }

    fn json_lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn json_log_lines_are_one_object_each_with_level_target_fields_and_span() {
    let captured = Captured::default();
    let subscriber =
        telemetry::subscriber(LogFormat::Json, EnvFilter::new("info"), captured.clone());
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("reconcile", environment = "exec-1");
        let _entered = span.enter();
        tracing::warn!(attempt = 3, "the API server answered slowly");
        tracing::debug!("below the filter");
    });
    let lines = captured.json_lines();
    assert_eq!(lines.len(), 1, "{}", captured.text());
    let line = &lines[0];
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["target"], "telemetry");
    assert_eq!(line["message"], "the API server answered slowly");
    assert_eq!(line["attempt"], 3, "fields sit at the top level");
    assert_eq!(line["span"]["name"], "reconcile");
    assert_eq!(line["span"]["environment"], "exec-1");
    assert!(line["timestamp"].is_string());
}

#[test]
fn text_log_lines_are_not_json() {
    let captured = Captured::default();
    let subscriber =
        telemetry::subscriber(LogFormat::Text, EnvFilter::new("info"), captured.clone());
    tracing::subscriber::with_default(subscriber, || tracing::info!("hello"));
    let text = captured.text();
    assert!(text.contains("INFO") && text.contains("hello"), "{text}");
    assert!(serde_json::from_str::<serde_json::Value>(text.trim()).is_err());
}

const FILE_SECRET: &str = "file-contents-that-must-not-be-logged";
const ENV_SECRET: &str = "variable-value-that-must-not-be-logged";
const COMMAND_SECRET: &str = "command-text-that-must-not-be-logged";

/// The walk runs on this thread alone (a current-thread runtime), so the subscriber set for
/// it here sees every handler's audit line.
#[tokio::test]
async fn every_data_plane_call_of_a_walk_writes_an_audit_line_without_what_it_carried() {
    let captured = Captured::default();
    let subscriber = telemetry::subscriber(
        LogFormat::Json,
        EnvFilter::new(format!("{}=info", audit::TARGET)),
        captured.clone(),
    );
    let _default = tracing::subscriber::set_default(subscriber);
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let allocation = ensure_ready(&mut client, "audit").await;
    let env = allocation.environment.clone().unwrap();
    let claim = acquire(&mut client, "audit", &env).await;
    let ctx = context("audit", &claim);
    let file = |operation: pb::FileOperation, data: &[u8]| pb::FileRequest {
        context: Some(ctx.clone()),
        operation: operation as i32,
        path: "notes.txt".into(),
        data: data.to_vec(),
        ..pb::FileRequest::default()
    };
    client
        .files(file(pb::FileOperation::Create, FILE_SECRET.as_bytes()))
        .await
        .unwrap();
    let read = client.files(file(pb::FileOperation::Read, b"")).await;
    assert_eq!(read.unwrap().into_inner().data, FILE_SECRET.as_bytes());
    let ran = client
        .start_command(pb::CommandStartRequest {
            context: Some(ctx.clone()),
            command: format!("echo {COMMAND_SECRET} >/dev/null"),
            timeout_millis: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.state, pb::CommandState::Succeeded as i32);
    let detached = client
        .start_command(pb::CommandStartRequest {
            context: Some(ctx.clone()),
            command: "printf %s \"$SECRET\"".into(),
            env: vec![pb::CommandEnvVar {
                name: "SECRET".into(),
                value: ENV_SECRET.into(),
            }],
            detach: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    client
        .command_status(pb::CommandQueryRequest {
            context: Some(ctx.clone()),
            command_id: detached.command_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .list_commands(pb::ListCommandsRequest {
            context: Some(ctx.clone()),
            limit: 8,
        })
        .await
        .unwrap();
    let mut forged = ctx.clone();
    forged.grant = format!("{}x", ctx.grant);
    let refused = client
        .files(pb::FileRequest {
            context: Some(forged),
            ..file(pb::FileOperation::Read, b"")
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    release(&mut client, "audit", &env, &claim).await;
    dev.stop().await.unwrap();

    let lines = captured.json_lines();
    let operations: Vec<(String, String, String)> = lines
        .iter()
        .map(|l| {
            let field = |name: &str| l[name].as_str().unwrap_or_default().to_owned();
            (field("operation"), field("action"), field("outcome"))
        })
        .collect();
    let expected = [
        ("AcquireRun", "-", "Ok"),
        ("Files", "file.create", "Ok"),
        ("Files", "file.read", "Ok"),
        ("StartCommand", "-", "Ok"),
        ("StartCommand", "-", "Ok"),
        ("CommandStatus", "-", "Ok"),
        ("ListCommands", "-", "Ok"),
        ("Files", "file.read", "PermissionDenied"),
        ("ReleaseRun", "-", "Ok"),
    ]
    .map(|(o, a, c)| (o.to_owned(), a.to_owned(), c.to_owned()));
    assert_eq!(operations, expected, "{}", captured.text());
    let hash = owner_hash(&owner().issuer, &owner().subject);
    for line in &lines {
        assert_eq!(line["target"], audit::TARGET);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["client"], DEV_CLIENT_URI, "{line}");
        assert_eq!(line["owner_hash"], hash.as_str(), "{line}");
        assert_eq!(line["environment"], env.id.as_str(), "{line}");
        let duration = line["duration_ms"].as_f64().expect("a duration");
        assert!(duration >= 0.0, "{line}");
    }
    let text = captured.text();
    for secret in [
        FILE_SECRET,
        ENV_SECRET,
        COMMAND_SECRET,
        claim.grant.as_str(),
        claim.claim_id.as_str(),
        owner().subject.as_str(),
    ] {
        assert!(!text.contains(secret), "{secret:?} is in the audit log");
    }
}
