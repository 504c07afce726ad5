//! The walking skeleton end to end: `dev` in-process on an ephemeral port, a client over real
//! mTLS ensures an environment, waits until it is ready, takes a run claim, runs a shell
//! command and reads the file it wrote. Refusals over real TLS for clients that are not
//! admitted.

mod common;

use common::*;
use execution_provider::api::pb;
use execution_provider::server::status::error_detail;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ensures_claims_runs_a_command_and_reads_the_file_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;

    let allocation = ensure_ready(&mut client, "walkthrough").await;
    let env = allocation.environment.clone().unwrap();
    assert!(
        env.id.starts_with("exec-") && env.id.len() == 45,
        "{}",
        env.id
    );
    assert_eq!(env.revision.len(), 32);

    let claim = acquire(&mut client, "walkthrough", &env).await;
    assert_eq!(
        claim.epoch,
        allocation.epoch + 1,
        "a new claim bumps the epoch"
    );
    let started = client
        .start_command(pb::CommandStartRequest {
            context: Some(context("walkthrough", &claim)),
            command: "printf 'hello from the sandbox\\n' > greeting.txt && echo done".into(),
            timeout_millis: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let result = started.result.unwrap();
    assert_eq!(result.state, pb::CommandState::Succeeded as i32);
    assert_eq!(result.stdout, b"done\n");
    assert_eq!(
        result.terminal_receipt.len(),
        64,
        "a finished command carries its receipt"
    );

    let file = client
        .files(pb::FileRequest {
            context: Some(context("walkthrough", &claim)),
            operation: pb::FileOperation::Read as i32,
            path: "greeting.txt".into(),
            ..pb::FileRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(file.data, b"hello from the sandbox\n");
    assert_eq!(file.version.len(), 64);

    common::release(&mut client, "walkthrough", &env, &claim).await;
    let stale = client
        .files(pb::FileRequest {
            context: Some(context("walkthrough", &claim)),
            operation: pb::FileOperation::Read as i32,
            path: "greeting.txt".into(),
            ..pb::FileRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        stale.code(),
        tonic::Code::Aborted,
        "a released claim no longer dispatches"
    );
    assert_eq!(error_detail(&stale).unwrap().code, "conflict");
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_claim_is_refused_while_the_first_is_live() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "exclusive")
        .await
        .environment
        .unwrap();
    let first = acquire(&mut client, "exclusive", &env).await;
    let replay = acquire(&mut client, "exclusive", &env).await;
    assert_eq!(
        replay.claim_id, first.claim_id,
        "the same operation id replays the claim"
    );
    let second = client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env),
            owner: Some(owner()),
            binding_id: "exclusive".into(),
            run_id: "run-2".into(),
            operation_id: "acquire-2".into(),
            ttl_millis: 60_000,
        })
        .await
        .unwrap_err();
    assert_eq!(second.code(), tonic::Code::Aborted);
    assert_eq!(second.message(), "execution provider request failed");
    dev.stop().await.unwrap();
}

async fn assert_refused(client: &mut Client) -> tonic::Status {
    client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_are_not_admitted_are_refused_over_real_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;

    let mut anonymous = connect(dev.addr, tmp.path(), None).await;
    let status = assert_refused(&mut anonymous).await;
    assert_ne!(
        status.code(),
        tonic::Code::Ok,
        "a client without a certificate gets nothing"
    );

    let foreign = identity_from_foreign_ca("spiffe://dev.local/ns/default/client");
    let mut foreign = connect(dev.addr, tmp.path(), Some(&foreign)).await;
    let status = assert_refused(&mut foreign).await;
    assert_eq!(
        status.code(),
        tonic::Code::Unauthenticated,
        "another CA: {status:?}"
    );
    assert_eq!(error_detail(&status).unwrap().code, "unauthenticated");

    let stranger = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/stranger");
    let mut stranger = connect(dev.addr, tmp.path(), Some(&stranger)).await;
    let status = assert_refused(&mut stranger).await;
    assert_eq!(
        status.code(),
        tonic::Code::Unauthenticated,
        "unknown identity: {status:?}"
    );

    // The dev client itself is admitted on the same server.
    let mut admitted = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    admitted
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .unwrap();
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_rpcs_check_their_gate_with_a_detail_after_authentication() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let status = client
        .revoke_environment(pb::RevokeEnvironmentRequest::default())
        .await
        .unwrap_err();
    // An empty request names no owner or environment: the admin gate refuses it.
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(error_detail(&status).unwrap().code, "permission_denied");

    let stranger = identity_from_dev_ca(tmp.path(), "spiffe://dev.local/ns/default/stranger");
    let mut stranger = connect(dev.addr, tmp.path(), Some(&stranger)).await;
    let status = stranger
        .revoke_environment(pb::RevokeEnvironmentRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::Unauthenticated,
        "authentication comes first"
    );
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_tools_find_the_health_service_and_reflection() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let channel = channel(dev.addr, tmp.path(), Some(&dev_identity(tmp.path())));

    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: execution_provider::api::SERVICE_NAME.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names
            .iter()
            .any(|n| n == execution_provider::api::SERVICE_NAME),
        "{names:?}"
    );
    dev.stop().await.unwrap();
}

/// One sample of a scrape: the metric name and its labels, sorted.
type Sample = (String, Vec<(String, String)>);

/// `GET /metrics` over plain HTTP/1 (the health listener closes after one answer).
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    body.to_owned()
}

/// A minimal reader of the text exposition format: `# TYPE` lines give the families,
/// every other non-comment line is `name{label="value",...} number`.
fn parse_scrape(text: &str) -> (Vec<String>, std::collections::BTreeMap<Sample, f64>) {
    let mut families = Vec::new();
    let mut samples = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            families.push(family.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let mut labels: Vec<(String, String)> = labels
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap();
                (key.to_owned(), value.trim_matches('"').to_owned())
            })
            .collect();
        labels.sort();
        samples.insert((name.to_owned(), labels), value.parse().unwrap());
    }
    families.sort();
    (families, samples)
}

fn rpc_count(samples: &std::collections::BTreeMap<Sample, f64>, method: &str, code: &str) -> f64 {
    let key = (
        "execution_provider_rpc_requests_total".to_owned(),
        vec![
            ("code".to_owned(), code.to_owned()),
            ("method".to_owned(), method.to_owned()),
        ],
    );
    samples.get(&key).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walk_is_counted_by_method_and_code_on_the_metrics_endpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "metrics")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "metrics", &env).await;
    let command = |claim: &pb::RunClaimResponse| pb::CommandStartRequest {
        context: Some(context("metrics", claim)),
        command: "true".into(),
        timeout_millis: 10_000,
        ..Default::default()
    };
    client.start_command(command(&claim)).await.unwrap();
    common::release(&mut client, "metrics", &env, &claim).await;
    let stale = client.start_command(command(&claim)).await.unwrap_err();
    assert_eq!(stale.code(), tonic::Code::Aborted);

    let text = scrape(dev.health_addr).await;
    let (families, samples) = parse_scrape(&text);
    assert!(rpc_count(&samples, "EnsureTemplate", "Ok") >= 1.0, "{text}");
    assert_eq!(rpc_count(&samples, "AcquireRun", "Ok"), 1.0, "{text}");
    assert_eq!(rpc_count(&samples, "StartCommand", "Ok"), 1.0, "{text}");
    assert_eq!(
        rpc_count(&samples, "StartCommand", "Aborted"),
        1.0,
        "{text}"
    );
    assert_eq!(rpc_count(&samples, "ReleaseRun", "Ok"), 1.0, "{text}");
    let timed = (
        "execution_provider_rpc_duration_seconds_count".to_owned(),
        vec![("method".to_owned(), "StartCommand".to_owned())],
    );
    assert_eq!(samples.get(&timed), Some(&2.0), "{text}");
    let sample = |name: &str, labels: &[(&str, &str)]| {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        samples
            .get(&(name.to_owned(), labels))
            .copied()
            .unwrap_or(0.0)
    };
    let kube = "execution_provider_kube_api_requests_total";
    let envs = "executionenvironments";
    let watched = [("code", "200"), ("resource", envs), ("verb", "watch")];
    assert!(sample(kube, &watched) >= 1.0, "{text}");
    let status = [
        ("code", "200"),
        ("resource", "executionenvironments/status"),
        ("verb", "update"),
    ];
    assert!(sample(kube, &status) >= 1.0, "{text}");
    let executor = "execution_provider_executor_calls_total";
    assert_eq!(
        sample(
            executor,
            &[("operation", "command.start"), ("outcome", "ok")]
        ),
        1.0,
        "{text}"
    );
    let claims = "execution_provider_claim_duration_seconds_count";
    assert_eq!(sample(claims, &[("outcome", "ok")]), 1.0, "{text}");
    let ready = "execution_provider_ensure_to_ready_seconds_count";
    assert_eq!(sample(ready, &[]), 1.0, "{text}");
    let phases = "execution_provider_environments";
    assert_eq!(sample(phases, &[("phase", "Ready")]), 1.0, "{text}");
    assert_eq!(sample(phases, &[("phase", "Fenced")]), 0.0, "{text}");
    let reloads = "execution_provider_security_reloads_total";
    assert!(
        sample(reloads, &[("outcome", "installed")]) >= 1.0,
        "{text}"
    );
    let generation = "execution_provider_security_authority_generation";
    assert!(sample(generation, &[]) >= 1.0, "{text}");
    let fences = "execution_provider_fences_total";
    assert_eq!(
        sample(fences, &[("reason", "lease_expired")]),
        0.0,
        "{text}"
    );
    let reconciles = "execution_provider_reconcile_duration_seconds_count";
    assert!(sample(reconciles, &[]) >= 1.0, "{text}");
    for (name, labels) in samples.keys() {
        for (key, value) in labels {
            assert!(
                !value.contains("exec-") && !value.contains("metrics"),
                "{name} carries an environment or binding in {key}={value}"
            );
        }
    }
    insta::assert_snapshot!(families.join("\n"));
    dev.stop().await.unwrap();
}
