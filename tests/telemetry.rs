//! What the provider tells operators (src/telemetry): JSON log lines, and the audit line of
//! every data-plane call of a walk in `dev`, which names the client, the owner's hash, the
//! environment, the operation, the outcome and the duration, and nothing the call carried.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use clap::Parser as _;
use common::*;
use execution_provider::api::{SERVICE_NAME, pb};
use execution_provider::cli::dev::DevArgs;
use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::cli::{Cli, Command};
use execution_provider::store::naming::owner_hash;
use execution_provider::telemetry::{self, LogFormat, audit, traces};
use opentelemetry_proto::tonic::collector::trace::v1 as otlp_collector;
use opentelemetry_proto::tonic::common::v1 as otlp_common;
use opentelemetry_proto::tonic::trace::v1 as otlp_trace;
use tracing::Subscriber as _;
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

/// An OTLP/gRPC trace receiver on 127.0.0.1 inside the test: every exported span, and a
/// notification at each export.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
    exported: Arc<tokio::sync::Notify>,
}

/// A received span with the `service.name` of its resource.
#[derive(Clone, Debug)]
struct ExportedSpan {
    service: String,
    span: otlp_trace::Span,
}

#[tonic::async_trait]
impl otlp_collector::trace_service_server::TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<otlp_collector::ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<otlp_collector::ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(a.value.as_ref()))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                received.extend(scope.spans.into_iter().map(|span| ExportedSpan {
                    service: service.clone(),
                    span,
                }));
            }
        }
        self.spans.lock().unwrap().extend(received);
        self.exported.notify_waiters();
        Ok(tonic::Response::new(
            otlp_collector::ExportTraceServiceResponse::default(),
        ))
    }
}

impl Receiver {
    /// Serves the receiver on an ephemeral loopback port; returns its `http://` endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let service = otlp_collector::trace_service_server::TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        endpoint
    }

    /// The received spans once `done` holds for them; fails after `limit`.
    async fn wait_for(
        &self,
        limit: std::time::Duration,
        done: impl Fn(&[ExportedSpan]) -> bool,
    ) -> Vec<ExportedSpan> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let exported = self.exported.notified();
            let spans = self.spans.lock().unwrap().clone();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, exported).await.is_err() {
                panic!("the expected spans were not exported in {limit:?}: {spans:#?}");
            }
        }
    }
}

/// A string attribute value (other kinds as their debug text).
fn text(value: Option<&otlp_common::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(otlp_common::any_value::Value::StringValue(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attribute(span: &otlp_trace::Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .map(|a| text(a.value.as_ref()))
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

/// A `Files` request whose metadata carries the caller's W3C trace context.
fn traced_request(file: pb::FileRequest) -> tonic::Request<pb::FileRequest> {
    let mut request = tonic::Request::new(file);
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    request
        .metadata_mut()
        .insert("tracestate", "caller=abc".parse().unwrap());
    request
}

/// `dev` as the command line starts it with `flags` added, on ephemeral loopback ports.
fn dev_args(state_dir: &std::path::Path, flags: &[&str]) -> DevArgs {
    let helper = helper_binary();
    let mut argv = vec![
        "execution-provider",
        "dev",
        "--state-dir",
        state_dir.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--kube-listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
        "--helper",
        helper.to_str().unwrap(),
        "--unsafe-no-isolation",
    ];
    argv.extend_from_slice(flags);
    match Cli::try_parse_from(argv).expect("the flags parse").command {
        Command::Dev(args) => args,
        other => panic!("parsed {other:?}"),
    }
}

/// Starts `dev` with `args`, its telemetry started as `serve` and `dev` start it (no
/// `OTEL_*` variables), the subscriber set for this thread; the walk runs on it alone (a
/// current-thread runtime).
async fn start_traced_dev(
    args: &DevArgs,
) -> (
    execution_provider::cli::dev::DevProvider,
    telemetry::Telemetry,
    tracing::subscriber::DefaultGuard,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = telemetry::Telemetry::start(&args.telemetry, |_| None).expect("telemetry starts");
    let subscriber = telemetry::traced_subscriber(
        LogFormat::Json,
        EnvFilter::new("warn"),
        std::io::sink,
        started.traces(),
    );
    let guard = tracing::subscriber::set_default(subscriber);
    let dev = execution_provider::cli::dev::start(args)
        .await
        .expect("dev starts");
    (dev, started, guard)
}

/// The span tree of one call: the RPC span is the child of the caller's span from
/// `traceparent`, and the store's steps, the Kubernetes API requests and the executor call
/// are its descendants; nothing the call carried is in any span.
#[tokio::test]
async fn a_traced_call_exports_its_span_tree_under_the_callers_span() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let tmp = tempfile::tempdir().unwrap();
    let args = dev_args(tmp.path(), &["--otlp-endpoint", &endpoint]);
    let (dev, started, guard) = start_traced_dev(&args).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let allocation = ensure_ready(&mut client, "traced").await;
    let env = allocation.environment.clone().unwrap();
    let claim = acquire(&mut client, "traced", &env).await;
    let ctx = context("traced", &claim);
    client
        .files(traced_request(pb::FileRequest {
            context: Some(ctx.clone()),
            operation: pb::FileOperation::Create as i32,
            path: "traced.txt".into(),
            data: FILE_SECRET.as_bytes().to_vec(),
            ..pb::FileRequest::default()
        }))
        .await
        .expect("the traced call succeeds");
    release(&mut client, "traced", &env, &claim).await;
    dev.stop().await.unwrap();
    // The graceful shutdown flushes the queued spans.
    started.shutdown().await;
    drop(guard);

    let rpc_name = format!("{SERVICE_NAME}/Files");
    let spans = receiver
        .wait_for(std::time::Duration::from_secs(30), |spans| {
            spans
                .iter()
                .any(|s| s.span.name == rpc_name && hex::encode(&s.span.trace_id) == TRACE_ID)
        })
        .await;
    let trace: Vec<&otlp_trace::Span> = spans
        .iter()
        .map(|s| &s.span)
        .filter(|s| hex::encode(&s.trace_id) == TRACE_ID)
        .collect();
    let rpc = trace
        .iter()
        .find(|s| s.name == rpc_name)
        .expect("the RPC span");
    assert_eq!(hex::encode(&rpc.parent_span_id), CALLER_SPAN_ID);
    assert_eq!(rpc.kind, otlp_trace::span::SpanKind::Server as i32);
    assert_eq!(rpc.trace_state, "caller=abc");
    assert_eq!(attribute(rpc, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(attribute(rpc, "rpc.method").as_deref(), Some("Files"));
    assert_eq!(
        attribute(rpc, "rpc.grpc.status_code").as_deref(),
        Some("IntValue(0)")
    );
    assert!(spans.iter().all(|s| s.service == "execution-provider"));

    let parent_of = |span: &otlp_trace::Span| {
        trace
            .iter()
            .find(|p| !span.parent_span_id.is_empty() && p.span_id == span.parent_span_id)
            .copied()
    };
    let descends_from_rpc = |span: &otlp_trace::Span| {
        let mut current = parent_of(span);
        while let Some(parent) = current {
            if parent.span_id == rpc.span_id {
                return true;
            }
            current = parent_of(parent);
        }
        false
    };
    let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
    for expected in [
        "store.validate",
        "store.dispatch",
        "store.cas",
        "get executionenvironments",
        "update executionenvironments/status",
        "executor file.create",
    ] {
        let found: Vec<&&otlp_trace::Span> = trace.iter().filter(|s| s.name == expected).collect();
        assert!(!found.is_empty(), "no {expected} span in {names:?}");
        for span in found {
            assert!(
                descends_from_rpc(span),
                "{expected} is outside the RPC span: {names:?}"
            );
        }
    }
    let executor = trace
        .iter()
        .find(|s| s.name == "executor file.create")
        .unwrap();
    assert_eq!(
        attribute(executor, "executor.outcome").as_deref(),
        Some("ok")
    );
    assert_eq!(
        attribute(executor, "environment").as_deref(),
        Some(env.id.as_str())
    );
    let request = trace
        .iter()
        .find(|s| s.name == "update executionenvironments/status")
        .unwrap();
    assert_eq!(request.kind, otlp_trace::span::SpanKind::Client as i32);
    assert_eq!(attribute(request, "k8s.verb").as_deref(), Some("update"));
    assert_eq!(
        attribute(request, "http.response.status_code").as_deref(),
        Some("IntValue(200)")
    );
    // The calls without trace context are traces of their own.
    assert!(
        spans
            .iter()
            .any(|s| s.span.name == format!("{SERVICE_NAME}/AcquireRun")
                && hex::encode(&s.span.trace_id) != TRACE_ID
                && s.span.parent_span_id.is_empty())
    );

    let everything = format!("{spans:?}");
    for secret in [
        FILE_SECRET,
        "traced.txt",
        claim.grant.as_str(),
        claim.claim_id.as_str(),
        owner().subject.as_str(),
        owner().issuer.as_str(),
        owner_hash(&owner().issuer, &owner().subject).as_str(),
        "\"traced\"",
    ] {
        assert!(!everything.contains(secret), "{secret:?} is in a span");
    }
}

/// Off by default: no collector named, no exporter; the provider's spans are disabled (their
/// only cost), whatever other `OTEL_*` variables say.
#[tokio::test]
async fn without_a_collector_no_exporter_is_built_and_spans_are_disabled() {
    let args = dev_args(std::path::Path::new("/nonexistent"), &[]);
    assert_eq!(args.telemetry.otlp_endpoint, None);
    let started = telemetry::Telemetry::start(&args.telemetry, |name| match name {
        "OTEL_SERVICE_NAME" => Some("provider".into()),
        "OTEL_TRACES_SAMPLER" => Some("always_on".into()),
        _ => None,
    })
    .unwrap();
    assert!(started.traces().is_none(), "an exporter was built");
    let subscriber = telemetry::traced_subscriber(
        LogFormat::Json,
        telemetry::filter_from_env(),
        std::io::sink,
        started.traces(),
    );
    // A provider span's metadata, taken where everything is enabled; then the subscriber is
    // asked itself. Its interest `never` is what disables the callsite in a process with this
    // one subscriber: the span macro then builds nothing. (In this test binary the cached
    // interest is shared with the other tests' subscribers, so `Span::is_disabled` would
    // depend on them.)
    let rpc = tracing::subscriber::with_default(tracing_subscriber::registry(), || {
        tracing::info_span!(target: traces::TARGET, "rpc")
            .metadata()
            .expect("a bare registry enables every span")
    });
    assert!(subscriber.register_callsite(rpc).is_never());
    // The standard variable alone turns them on.
    let on = telemetry::Telemetry::start(&args.telemetry, |name| {
        (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://127.0.0.1:4317".to_owned())
    })
    .unwrap();
    assert!(on.traces().is_some());
    on.shutdown().await;
}

/// A collector that cannot be reached neither fails nor holds up a call, and the shutdown
/// still ends within its bound.
#[tokio::test]
async fn an_unreachable_collector_neither_fails_nor_blocks_a_call() {
    // A loopback port nobody listens on any more.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let tmp = tempfile::tempdir().unwrap();
    let args = dev_args(tmp.path(), &["--otlp-endpoint", &endpoint]);
    let (dev, started, guard) = start_traced_dev(&args).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let allocation = ensure_ready(&mut client, "unreached").await;
    let env = allocation.environment.clone().unwrap();
    let claim = acquire(&mut client, "unreached", &env).await;
    let read = client
        .files(traced_request(pb::FileRequest {
            context: Some(context("unreached", &claim)),
            operation: pb::FileOperation::List as i32,
            path: ".".into(),
            ..pb::FileRequest::default()
        }))
        .await;
    assert!(read.is_ok(), "{read:?}");
    release(&mut client, "unreached", &env, &claim).await;
    dev.stop().await.unwrap();
    let bound = traces::SHUTDOWN_FLUSH_TIMEOUT + std::time::Duration::from_secs(5);
    tokio::time::timeout(bound, started.shutdown())
        .await
        .expect("the shutdown ends within its bound");
    drop(guard);
}
