//! The client side: mTLS channels of the admitted identities, the calls the figures time
//! (ensure, commit, readiness, claims, `StartCommand`, `Files`), and sample statistics.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use execution_provider::api::pb;
use execution_provider::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use execution_provider::runtime::SystemClock;
use execution_provider::runtime::net::TokioNet;
use execution_provider::runtime::tls::{self, Identity, MtlsConnector};
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

/// A client of the execution service.
pub type Client = ExecutionProviderServiceClient<Channel>;

/// Largest message either side may send (a 4 MiB file and its framing).
const MAX_MESSAGE: usize = 64 << 20;
/// Pause between readiness polls.
const READY_POLL: Duration = Duration::from_millis(2);

/// A client presenting `identity` over its own HTTP/2 connection.
pub fn client(addr: SocketAddr, state: &Path, identity: &Identity) -> Client {
    let ca = std::fs::read(state.join("client/ca.pem")).expect("the dev CA");
    let cas = tls::certificates_from_pem(&ca, "ca").expect("pem");
    let config = tls::client_config(Some(identity), &cas, Arc::new(SystemClock)).expect("tls");
    let name = ServerName::try_from("localhost").expect("a name");
    let connector = MtlsConnector::new(TokioNet, config, Some(name));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect_with_connector_lazy(connector);
    ExecutionProviderServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// The attested end user of every call.
pub fn owner() -> pb::Owner {
    pb::Owner {
        issuer: "https://issuer.bench".into(),
        subject: "bench".into(),
    }
}

/// The default template's selector.
pub async fn template(client: &mut Client) -> pb::TemplateSelector {
    client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .expect("templates")
        .into_inner()
        .items
        .into_iter()
        .filter_map(|i| i.template)
        .find(|t| t.id == "default")
        .expect("the default template")
}

/// How many `EnsureTemplate` answers were a retryable UNAVAILABLE (the capacity ledger
/// changed concurrently: near a template's limit, concurrent ensures race for the last
/// shards with room) and were retried, as the API asks a client to.
static ENSURE_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Retries of one ensure before the run gives up.
const ENSURE_ATTEMPTS: usize = 50;

/// See [`ENSURE_RETRIES`].
pub fn ensure_retries() -> u64 {
    ENSURE_RETRIES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `EnsureTemplate` of `binding` (operation id derived from it, so a retry is a replay),
/// retried while it answers UNAVAILABLE.
pub async fn ensure(
    client: &mut Client,
    template: &pb::TemplateSelector,
    binding: &str,
) -> pb::EnsureEnvironmentResponse {
    let request = pb::EnsureTemplateRequest {
        binding_id: binding.into(),
        template: Some(template.clone()),
        owner: Some(owner()),
        operation_id: format!("op-{binding}"),
    };
    for _ in 1..ENSURE_ATTEMPTS {
        match client.ensure_template(request.clone()).await {
            Ok(answer) => return answer.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                ENSURE_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Err(status) => panic!("ensure {binding}: {status:?}"),
        }
    }
    client
        .ensure_template(request)
        .await
        .unwrap_or_else(|e| panic!("ensure {binding}: {e:?}"))
        .into_inner()
}

/// `CommitReference` of `binding`'s environment.
pub async fn commit(client: &mut Client, binding: &str, env: &pb::EnvironmentRef) {
    client
        .commit_reference(pb::ReferenceMutationRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            operation_id: format!("op-{binding}"),
        })
        .await
        .unwrap_or_else(|e| panic!("commit {binding}: {e:?}"));
}

/// Replays the ensure of `binding` every [`READY_POLL`] until it reports ready.
pub async fn wait_ready(client: &mut Client, template: &pb::TemplateSelector, binding: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !ensure(client, template, binding).await.ready {
        assert!(Instant::now() < deadline, "{binding} never became ready");
        tokio::time::sleep(READY_POLL).await;
    }
}

/// Ensures, commits and waits for `binding`: its environment.
pub async fn ready_environment(
    client: &mut Client,
    template: &pb::TemplateSelector,
    binding: &str,
) -> pb::EnvironmentRef {
    let env = ensure(client, template, binding)
        .await
        .environment
        .expect("an environment");
    commit(client, binding, &env).await;
    wait_ready(client, template, binding).await;
    env
}

/// Takes run claim `n` on `env`.
pub async fn acquire(
    client: &mut Client,
    binding: &str,
    env: &pb::EnvironmentRef,
    n: usize,
) -> pb::RunClaimResponse {
    client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: format!("run-{n}"),
            operation_id: format!("acquire-{n}"),
            ttl_millis: 300_000,
        })
        .await
        .unwrap_or_else(|e| panic!("acquire {binding}: {e:?}"))
        .into_inner()
}

/// Releases run claim `n`.
pub async fn release(client: &mut Client, binding: &str, claim: &pb::RunClaimResponse, n: usize) {
    client
        .release_run(pb::ReleaseRunRequest {
            environment: claim.environment.clone(),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: format!("release-{n}"),
            grant_generation: claim.grant_generation,
        })
        .await
        .unwrap_or_else(|e| panic!("release {binding}: {e:?}"));
}

/// The data-plane context of `claim`.
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

/// A foreground `StartCommand` that must succeed: its stdout.
pub async fn run(client: &mut Client, context: &pb::RequestContext, command: &str) -> Vec<u8> {
    let answer = client
        .start_command(pb::CommandStartRequest {
            context: Some(context.clone()),
            command: command.into(),
            timeout_millis: 60_000,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("StartCommand {command}: {e:?}"))
        .into_inner();
    let result = answer.result.expect("a result");
    assert_eq!(
        result.state,
        pb::CommandState::Succeeded as i32,
        "{command}: {result:?}"
    );
    result.stdout
}

/// A foreground `StartCommand` of `command`: its failure, if the call or the command failed.
pub async fn try_run(
    client: &mut Client,
    context: &pb::RequestContext,
    command: &str,
) -> Result<(), tonic::Status> {
    let answer = client
        .start_command(pb::CommandStartRequest {
            context: Some(context.clone()),
            command: command.into(),
            timeout_millis: 60_000,
            ..Default::default()
        })
        .await?
        .into_inner();
    match answer.result {
        Some(r) if r.state == pb::CommandState::Succeeded as i32 => Ok(()),
        other => Err(tonic::Status::unknown(format!("{other:?}"))),
    }
}

/// How late a detached command's output reaches a follower: the command prints the wall-clock
/// time in nanoseconds `n` times, 20 ms apart, and each line's latency is the time this client
/// receives it minus the time it carries (one machine, one clock). Also its id.
pub async fn output_latency(
    client: &mut Client,
    context: &pb::RequestContext,
    n: usize,
) -> (Samples, String) {
    let started = client
        .start_command(pb::CommandStartRequest {
            context: Some(context.clone()),
            command: format!("for i in $(seq {n}); do date +%s%N; sleep 0.02; done"),
            detach: true,
            ..Default::default()
        })
        .await
        .expect("a detached start")
        .into_inner();
    let mut stream = client
        .follow_command(pb::CommandQueryRequest {
            context: Some(context.clone()),
            command_id: started.command_id.clone(),
            ..Default::default()
        })
        .await
        .expect("a follow")
        .into_inner();
    let (mut pending, mut samples) = (Vec::new(), Vec::new());
    while let Some(event) = stream.message().await.expect("a follow event") {
        let received = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        match event.event {
            Some(pb::command_output_event::Event::Chunk(chunk)) => {
                pending.extend_from_slice(&chunk.data);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let printed: u128 = String::from_utf8_lossy(&line)
                        .trim()
                        .parse()
                        .expect("a time in nanoseconds");
                    let late = u64::try_from(received.saturating_sub(printed)).unwrap_or(u64::MAX);
                    samples.push(Duration::from_nanos(late));
                }
            }
            Some(pb::command_output_event::Event::End(_)) => break,
            _ => {}
        }
    }
    assert_eq!(samples.len(), n, "every line arrived");
    (Samples(samples), started.command_id)
}

/// `CommandStatus` of `id`, `n` times (what a client polling a detached command does).
pub async fn poll_status(client: &mut Client, context: &pb::RequestContext, id: &str, n: usize) {
    for _ in 0..n {
        client
            .command_status(pb::CommandQueryRequest {
                context: Some(context.clone()),
                command_id: id.into(),
                ..Default::default()
            })
            .await
            .expect("a status");
    }
}

/// One `Files` call that must succeed.
pub async fn file(
    client: &mut Client,
    context: &pb::RequestContext,
    operation: pb::FileOperation,
    path: &str,
    data: Vec<u8>,
) -> pb::FileResponse {
    client
        .files(pb::FileRequest {
            context: Some(context.clone()),
            operation: operation as i32,
            path: path.into(),
            data,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Files {operation:?} {path}: {e:?}"))
        .into_inner()
}

/// Latency samples of one series.
#[derive(Clone, Debug, Default)]
pub struct Samples(pub Vec<Duration>);

impl Samples {
    /// Times `n` runs of `step`.
    pub async fn of<F, Fut>(n: usize, mut step: F) -> Samples
    where
        F: FnMut(usize) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            let began = Instant::now();
            step(i).await;
            samples.push(began.elapsed());
        }
        Samples(samples)
    }

    /// The `q` quantile (nearest rank).
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort();
        sorted
            .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or_default()
    }

    /// The median.
    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }
}

/// Milliseconds of `d`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
