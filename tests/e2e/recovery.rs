//! Recovery after a fault on the real control plane (the recovery issue, items 3 and 5): a
//! `serve` killed (SIGKILL) mid-command and, separately, the executor Pod deleted mid-command
//! leave an environment that serves again without anyone, at the next epoch on the same
//! workspace, the interrupted call's outcome reported as it is known (`fence_unknown`, nothing
//! invented); and a fenced environment of a `recovery: manual` template is moved on by the
//! manual path of docs/operating.md §7.1, walked with `client describe`, `kubectl delete pod`
//! and `client admin recover|replace --yes`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::kube::crd::{
    ActiveOperation, ExecutionEnvironment, ExecutionEnvironmentStatus, FenceState, pod_name,
};
use execution_provider::server::status::error_detail;
use futures::StreamExt as _;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use tonic::Code;

use crate::cluster::{self, Cluster, eventually};
use crate::common::{self, context, owner};
use crate::fixtures::MANUAL_TEMPLATE;
use crate::flow::{Setup, read, release, run};
use crate::provider::{Client, Installation, Provider};

/// A foreground command that runs long enough to be interrupted: it marks its start, and
/// would mark its end after 25 s.
const LONG_COMMAND: &str = "echo started > started.txt; sleep 25; echo finished > finished.txt";

/// The environments' API in the test namespace.
fn environments(setup: &Setup) -> Api<ExecutionEnvironment> {
    Api::namespaced(setup.ns.client.clone(), &setup.ns.name)
}

/// Ensures the environment of `binding` on `template`, commits its reference and waits
/// until it is ready.
async fn ensure_template_ready(
    client: &mut Client,
    binding: &str,
    template: &str,
) -> pb::EnvironmentRef {
    let selector = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await
        .expect("the catalogue")
        .into_inner()
        .items
        .into_iter()
        .filter_map(|i| i.template)
        .find(|t| t.id == template)
        .unwrap_or_else(|| panic!("the template {template} is offered"));
    let request = pb::EnsureTemplateRequest {
        binding_id: binding.into(),
        template: Some(selector),
        owner: Some(owner()),
        operation_id: format!("op-{binding}"),
    };
    let allocation = client
        .ensure_template(request.clone())
        .await
        .expect("ensure")
        .into_inner();
    client
        .commit_reference(pb::ReferenceMutationRequest {
            environment: allocation.environment.clone(),
            owner: Some(owner()),
            binding_id: binding.into(),
            operation_id: format!("op-{binding}"),
        })
        .await
        .expect("the reference is committed");
    eventually(Duration::from_secs(60), "environment readiness", || {
        let (mut client, request) = (client.clone(), request.clone());
        async move {
            let allocation = client.ensure_template(request).await.ok()?.into_inner();
            allocation.ready.then_some(allocation.environment?)
        }
    })
    .await
}

/// Takes a new run claim `run` (its own operation id) on `env`.
pub async fn acquire_as(
    client: &mut Client,
    binding: &str,
    env: &pb::EnvironmentRef,
    run: &str,
) -> pb::RunClaimResponse {
    client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: run.into(),
            operation_id: format!("acquire-{run}"),
            ttl_millis: 60_000,
        })
        .await
        .expect("a new claim")
        .into_inner()
}

/// Starts [`LONG_COMMAND`] in the foreground under `claim`, in a task of its own.
fn start_long_command(
    client: &Client,
    binding: &str,
    claim: &pb::RunClaimResponse,
) -> tokio::task::JoinHandle<Result<pb::CommandStartResponse, tonic::Status>> {
    let mut client = client.clone();
    let request = pb::CommandStartRequest {
        context: Some(context(binding, claim)),
        command: LONG_COMMAND.into(),
        timeout_millis: 50_000,
        ..Default::default()
    };
    tokio::spawn(async move {
        client
            .start_command(request)
            .await
            .map(tonic::Response::into_inner)
    })
}

/// Waits until `name` records an operation in flight, and returns it.
async fn operation_in_flight(envs: &Api<ExecutionEnvironment>, name: &str) -> ActiveOperation {
    eventually(
        Duration::from_secs(30),
        "the command's operation lease",
        || async { envs.get(name).await.ok()?.status?.active_operation },
    )
    .await
}

/// The environment's status as it stands.
async fn status_of(envs: &Api<ExecutionEnvironment>, name: &str) -> ExecutionEnvironmentStatus {
    envs.get(name)
        .await
        .expect("the environment")
        .status
        .expect("a status")
}

/// Describes `env` through `client`, if it answers.
async fn describe(
    client: &Client,
    env: &pb::EnvironmentRef,
) -> Option<pb::DescribeEnvironmentResponse> {
    let request = pb::DescribeEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner()),
        binding_id: String::new(),
    };
    Some(
        client
            .clone()
            .describe_environment(request)
            .await
            .ok()?
            .into_inner(),
    )
}

/// Waits until `env` serves again: Ready, unfenced, at `epoch`.
async fn serving_at(
    client: &Client,
    env: &pb::EnvironmentRef,
    epoch: u64,
    what: &str,
) -> pb::DescribeEnvironmentResponse {
    eventually(Duration::from_secs(150), what, || async {
        let d = describe(client, env).await?;
        (d.phase == "Ready" && d.fence_state == "Healthy" && d.epoch == epoch).then_some(d)
    })
    .await
}

/// Every status one watch of the environment delivers from now on, in order: the states a
/// poll could miss (a fence that the recovery clears within a second).
struct StatusLog {
    seen: Arc<Mutex<Vec<ExecutionEnvironmentStatus>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusLog {
    async fn start(envs: &Api<ExecutionEnvironment>, name: &str) -> Self {
        let version = envs
            .get(name)
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let params = WatchParams::default().fields(&format!("metadata.name={name}"));
        let mut events = envs
            .watch(&params, &version)
            .await
            .expect("a watch of the environment")
            .boxed();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(env) | WatchEvent::Modified(env)) => {
                        into.lock().unwrap().push(env.status.unwrap_or_default());
                    }
                    Ok(WatchEvent::Bookmark(_) | WatchEvent::Deleted(_)) => {}
                    other => panic!("the watch of the environment failed: {other:?}"),
                }
            }
        });
        Self { seen, task }
    }

    /// Whether some status was fenced while it still recorded the operation `id`.
    fn fenced_keeping(&self, id: &str) -> bool {
        assert!(!self.task.is_finished(), "the watch ended early");
        self.seen.lock().unwrap().iter().any(|s| {
            s.fence_state == Some(FenceState::FenceUnknown)
                && s.active_operation.as_ref().is_some_and(|op| op.id == id)
        })
    }
}

impl Drop for StatusLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The stable error code of a refusal.
fn code_of(status: &tonic::Status) -> String {
    error_detail(status).map(|d| d.code).unwrap_or_default()
}

/// What is left to check once an environment serves again after an automatic recovery: the
/// end of exactly the old Pod is on record, no outcome was invented for the interrupted
/// operation, the workspace is the same, the old claim answers `conflict` and a new one
/// reads what was written before the fault.
async fn assert_recovered(
    client: &mut Client,
    envs: &Api<ExecutionEnvironment>,
    binding: &str,
    before: &ExecutionEnvironmentStatus,
    old_claim: &pb::RunClaimResponse,
) {
    let name = &old_claim.environment.as_ref().unwrap().id;
    let after = status_of(envs, name).await;
    let old_pod = &before.pod.as_ref().unwrap().uid;
    let proof = after
        .termination_proof
        .as_ref()
        .expect("a termination proof");
    assert_eq!(&proof.pod_uid, old_pod, "the end of exactly the old Pod");
    assert_ne!(&after.pod.as_ref().unwrap().uid, old_pod, "a new executor");
    assert_eq!(after.pvc, before.pvc, "the same workspace PVC");
    assert!(
        after.recovered_operation.is_none(),
        "nobody knows the interrupted call's outcome, and none is invented: {after:?}"
    );
    assert!(after.active_operation.is_none() && after.active_run.is_none());
    let recovering = after
        .conditions
        .iter()
        .find(|c| c.type_ == "Recovering")
        .expect("the Recovering condition");
    assert_eq!(recovering.reason, "Recovered", "{recovering:?}");

    let stale = read(client, binding, old_claim, "kept.txt")
        .await
        .expect_err("the old claim ended with the old executor");
    assert_eq!(
        (stale.code(), code_of(&stale).as_str()),
        (Code::Aborted, "conflict"),
        "{stale:?}"
    );
    let env = old_claim.environment.clone().unwrap();
    let claim = acquire_as(client, binding, &env, "run-2").await;
    assert_eq!(
        claim.epoch,
        old_claim.epoch + 2,
        "the recovery's epoch, then the claim's"
    );
    let kept = read(client, binding, &claim, "kept.txt")
        .await
        .expect("the new executor serves the workspace");
    assert_eq!(kept.data, b"kept\n", "the workspace is intact");
    release(client, binding, &claim).await;
}

/// Runs `execution-provider client` against `provider` as the installation's client, for
/// the suite's owner.
async fn cli(installation: &Installation, provider: &Provider, args: &[&str]) -> cluster::Output {
    let address = provider.addr.to_string();
    let state = installation
        .files
        .state
        .root()
        .to_string_lossy()
        .into_owned();
    let owner = owner();
    let mut all = vec![
        "client",
        "--address",
        &address,
        "--state-dir",
        &state,
        "--owner-issuer",
        &owner.issuer,
        "--owner-subject",
        &owner.subject,
    ];
    all.extend_from_slice(args);
    cluster::run(
        std::path::Path::new(env!("CARGO_BIN_EXE_execution-provider")),
        &all,
        None,
    )
    .await
}

fn succeeded(out: &cluster::Output) -> &str {
    assert!(out.success, "the client failed: {}", out.stderr);
    &out.stdout
}

pub async fn a_serve_killed_mid_command_is_recovered_by_itself_and_a_manual_template_by_the_documented_path(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "killed").await;
    let envs = environments(&setup);
    let first = setup.installation.start_provider("first").await;
    let mut client = setup.installation.client(&first);
    let auto = common::ensure_ready(&mut client, "auto")
        .await
        .environment
        .unwrap();
    let manual = ensure_template_ready(&mut client, "manual", MANUAL_TEMPLATE).await;
    let auto_claim = common::acquire(&mut client, "auto", &auto).await;
    let manual_claim = common::acquire(&mut client, "manual", &manual).await;
    for (binding, claim) in [("auto", &auto_claim), ("manual", &manual_claim)] {
        let wrote = run(&mut client, binding, claim, "echo kept > kept.txt").await;
        assert_eq!(wrote.state, pb::CommandState::Succeeded as i32, "{wrote:?}");
    }
    let before = status_of(&envs, &auto.id).await;
    let log = StatusLog::start(&envs, &auto.id).await;

    // A foreground command in flight on each environment when `serve` dies without a word.
    let auto_call = start_long_command(&client, "auto", &auto_claim);
    let manual_call = start_long_command(&client, "manual", &manual_claim);
    let auto_op = operation_in_flight(&envs, &auto.id).await;
    let manual_op = operation_in_flight(&envs, &manual.id).await;
    first.crash().await;
    for call in [auto_call, manual_call] {
        let answer = call.await.unwrap();
        assert!(
            answer.is_err(),
            "the process that ran the call is gone; no result is made up: {answer:?}"
        );
    }

    // The next process: the lease expires, the supervisor never saw the call (a one-shot
    // pods/exec helper), so the environment is fenced keeping the operation, and recovered by
    // the exact Pod's kubelet-confirmed end, at the next epoch, with nobody's help.
    let second = setup.installation.start_provider("second").await;
    let mut client = setup.installation.client(&second);
    serving_at(
        &client,
        &auto,
        auto_claim.epoch + 1,
        "the automatic recovery",
    )
    .await;
    assert!(
        log.fenced_keeping(&auto_op.id),
        "fenced with the interrupted operation on record before the recovery"
    );
    assert_recovered(&mut client, &envs, "auto", &before, &auto_claim).await;

    // The manual template stays fenced and says why.
    eventually(
        Duration::from_secs(60),
        "the ManualRecovery condition",
        || async {
            let d = describe(&client, &manual).await?;
            let says = d
                .conditions
                .iter()
                .any(|c| c.r#type == "Recovering" && c.reason == "ManualRecovery");
            (d.fence_state == "FenceUnknown" && says).then_some(())
        },
    )
    .await;
    manual_path(
        &setup,
        &second,
        &mut client,
        &manual,
        &manual_claim,
        &manual_op,
    )
    .await;

    second.stop().await;
    setup.finish().await;
}

/// docs/operating.md §7.1, "The manual path", as an operator walks it.
async fn manual_path(
    setup: &Setup,
    provider: &Provider,
    client: &mut Client,
    env: &pb::EnvironmentRef,
    old_claim: &pb::RunClaimResponse,
    interrupted: &ActiveOperation,
) {
    let installation = &setup.installation;
    let exact = [
        "--env",
        env.id.as_str(),
        "--env-revision",
        env.revision.as_str(),
    ];
    // Read the identities first.
    let text = cli(
        installation,
        provider,
        &[&["describe"][..], &exact[..]].concat(),
    )
    .await;
    let described = cli(
        installation,
        provider,
        &[&["--json", "describe"][..], &exact[..]].concat(),
    )
    .await;
    let described: serde_json::Value = serde_json::from_str(succeeded(&described)).unwrap();
    assert_eq!(described["phase"], "Fenced", "{described}");
    assert_eq!(described["fenceState"], "FenceUnknown", "{described}");
    assert_eq!(
        described["operations"][0]["operationId"],
        interrupted.id.as_str(),
        "the interrupted operation is shown: {described}"
    );
    let pod_uid = described["pod"]["uid"].as_str().unwrap().to_owned();
    assert!(
        succeeded(&text).contains(&pod_uid),
        "the text names the Pod UID"
    );

    // Nothing is proven while the Pod runs: recover is refused and changes nothing.
    let recover = [
        &["admin", "recover"][..],
        &exact[..],
        &["--yes", "--op", "recover-1"][..],
    ]
    .concat();
    let early = cli(installation, provider, &recover).await;
    assert!(
        !early.success,
        "recovered while the Pod runs: {}",
        early.stdout
    );
    assert!(early.stderr.contains("fence_unknown"), "{}", early.stderr);

    // 1. Make sure the executor's processes are gone: delete the Pod, never with --force.
    let pod = pod_name(&env.id);
    let ns = setup.ns.name.as_str();
    setup
        .cluster
        .kubectl(&["delete", "pod", &pod, "-n", ns, "--wait=false"])
        .await;
    // 2. Once every container is reported terminated: recover, then replace.
    eventually(
        Duration::from_secs(60),
        "every container terminated",
        || async {
            let states = setup
                .cluster
                .kubectl(&[
                    "get",
                    "pod",
                    &pod,
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={.status.containerStatuses[*].state}",
                ])
                .await;
            (states.contains("terminated") && !states.contains("running")).then_some(())
        },
    )
    .await;
    let recovered = cli(installation, provider, &recover).await;
    succeeded(&recovered);
    let epoch = old_claim.epoch.to_string();
    for shown in [epoch.as_str(), pod_uid.as_str()] {
        assert!(
            recovered.stderr.contains(shown),
            "the filled values are printed: {}",
            recovered.stderr
        );
    }
    let replace = [
        &["admin", "replace"][..],
        &exact[..],
        &["--yes", "--op", "replace-1"][..],
    ]
    .concat();
    succeeded(&cli(installation, provider, &replace).await);

    serving_at(
        client,
        env,
        old_claim.epoch + 1,
        "the administrator's replacement",
    )
    .await;
    let stale = read(client, "manual", old_claim, "kept.txt")
        .await
        .expect_err("the old claim ended with the recovery");
    assert_eq!(stale.code(), Code::Aborted, "{stale:?}");
    let claim = acquire_as(client, "manual", env, "run-2").await;
    let kept = read(client, "manual", &claim, "kept.txt")
        .await
        .expect("the new executor serves the workspace");
    assert_eq!(kept.data, b"kept\n", "the workspace is intact");
    release(client, "manual", &claim).await;
}

pub async fn an_executor_pod_deleted_mid_command_is_recovered_by_itself_and_the_call_answers_fence_unknown(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "podgone").await;
    let envs = environments(&setup);
    let provider = setup.installation.start_provider("provider").await;
    let mut client = setup.installation.client(&provider);
    let env = common::ensure_ready(&mut client, "gone")
        .await
        .environment
        .unwrap();
    let claim = common::acquire(&mut client, "gone", &env).await;
    let wrote = run(&mut client, "gone", &claim, "echo kept > kept.txt").await;
    assert_eq!(wrote.state, pb::CommandState::Succeeded as i32, "{wrote:?}");
    let before = status_of(&envs, &env.id).await;

    // An eviction, a drain or a hand: the Pod is deleted (gracefully) while a call runs.
    let call = start_long_command(&client, "gone", &claim);
    operation_in_flight(&envs, &env.id).await;
    setup
        .cluster
        .kubectl(&[
            "delete",
            "pod",
            &pod_name(&env.id),
            "-n",
            &setup.ns.name,
            "--wait=false",
        ])
        .await;
    let refused = call
        .await
        .unwrap()
        .expect_err("the call's executor ended under it");
    assert_eq!(
        code_of(&refused),
        "fence_unknown",
        "the call's outcome is unknown and is reported so: {refused:?}"
    );

    serving_at(&client, &env, claim.epoch + 1, "the automatic recovery").await;
    assert_recovered(&mut client, &envs, "gone", &before, &claim).await;
    provider.stop().await;
    setup.finish().await;
}
