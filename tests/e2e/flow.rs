//! The provider end to end on the real control plane: the chart installed with its RBAC,
//! `execution-provider serve` running as the chart's ServiceAccount, a client over mTLS.

use execution_provider::api::pb;
use execution_provider::kube::crd::{ExecutionEnvironment, pod_name, pvc_name};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;

use crate::cluster::{Cluster, TestNamespace};
use crate::common::{self, context, owner};
use crate::fixtures::RUNTIME_CLASS;
use crate::kwok_exec::{Agent, kwok_serves_exec, spawn_agent, workspace_dir};
use crate::provider::{Client, EXECUTOR_ACCOUNT, Installation, wait_pod_ready};

/// Everything a flow test needs: namespace, chart, the exec agent.
pub struct Setup {
    pub cluster: Cluster,
    pub ns: TestNamespace,
    pub installation: Installation,
    agent: Option<Agent>,
}

impl Setup {
    pub async fn new(cluster: Cluster, test: &str) -> Self {
        let ns = cluster.namespace(test).await;
        let installation = Installation::install(&cluster, &ns).await;
        let agent = kwok_serves_exec()
            .then(|| spawn_agent(ns.client.clone(), cluster.work.clone(), ns.name.clone()));
        Self {
            cluster,
            ns,
            installation,
            agent,
        }
    }

    /// A setup whose Pods run on a real kubelet (the real node's catalogue `templates`): no
    /// kwok exec agent.
    pub async fn on_real_node(cluster: Cluster, test: &str, templates: &str) -> Self {
        let ns = cluster.namespace(test).await;
        let installation = Installation::install_with(&cluster, &ns, templates).await;
        let agent = None;
        Self {
            cluster,
            ns,
            installation,
            agent,
        }
    }

    pub async fn finish(self) {
        if let Some(agent) = self.agent {
            agent.stop().await;
        }
        self.ns.delete().await;
    }
}

/// Runs `command` under `claim` and returns its result.
pub async fn run(
    client: &mut Client,
    binding: &str,
    claim: &pb::RunClaimResponse,
    command: &str,
) -> pb::CommandStatusResponse {
    client
        .start_command(pb::CommandStartRequest {
            context: Some(context(binding, claim)),
            command: command.into(),
            timeout_millis: 20_000,
            ..Default::default()
        })
        .await
        .expect("the command runs")
        .into_inner()
        .result
        .expect("a foreground command has a result")
}

/// Reads `path` under `claim`.
pub async fn read(
    client: &mut Client,
    binding: &str,
    claim: &pb::RunClaimResponse,
    path: &str,
) -> Result<pb::FileResponse, tonic::Status> {
    client
        .files(pb::FileRequest {
            context: Some(context(binding, claim)),
            operation: pb::FileOperation::Read as i32,
            path: path.into(),
            ..pb::FileRequest::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Releases `claim`.
pub async fn release(client: &mut Client, binding: &str, claim: &pb::RunClaimResponse) {
    client
        .release_run(pb::ReleaseRunRequest {
            environment: claim.environment.clone(),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: format!("release-{}", claim.claim_id),
            grant_generation: claim.grant_generation,
        })
        .await
        .expect("the claim is released");
}

/// Checks the hardened shape of the executor Pod the reconciler created (k8s-executor §2.5).
fn assert_hardened(pod: &Pod, pvc: &str) {
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.service_account_name.as_deref(), Some(EXECUTOR_ACCOUNT));
    assert_eq!(spec.runtime_class_name.as_deref(), Some(RUNTIME_CLASS));
    let security = spec.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert_eq!(spec.containers.len(), 1);
    let container = &spec.containers[0];
    assert_eq!(container.name, "executor");
    let context = container.security_context.as_ref().unwrap();
    assert_eq!(context.allow_privilege_escalation, Some(false));
    assert_eq!(context.read_only_root_filesystem, Some(true));
    let dropped = context.capabilities.as_ref().unwrap().drop.clone().unwrap();
    assert_eq!(dropped, ["ALL"]);
    let limits = container
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert!(limits.contains_key("memory") && limits.contains_key("cpu"));
    let claims: Vec<_> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
        .collect();
    assert_eq!(claims, [pvc]);
}

pub async fn a_client_allocates_runs_commands_and_files_through_pods_exec_and_releases(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "flow").await;
    let provider = setup.installation.start_provider("provider").await;
    let mut client = setup.installation.client(&provider);

    let allocation = common::ensure_ready(&mut client, "flow").await;
    let env = allocation.environment.clone().unwrap();
    let (ns, name) = (&setup.ns, env.id.as_str());
    let resource = Api::<ExecutionEnvironment>::namespaced(ns.client.clone(), &ns.name)
        .get(name)
        .await
        .expect("the environment is a resource");
    assert_eq!(resource.spec.binding_id, "flow");
    let pvc = Api::<PersistentVolumeClaim>::namespaced(ns.client.clone(), &ns.name)
        .get(&pvc_name(name))
        .await
        .expect("the workspace PVC exists");
    assert_eq!(
        pvc.status.and_then(|s| s.phase).as_deref(),
        Some("Bound"),
        "kwok provisions the workspace"
    );
    let pod = wait_pod_ready(ns, &pod_name(name)).await;
    assert_hardened(&pod, &pvc_name(name));

    let claim = common::acquire(&mut client, "flow", &env).await;
    let result = run(
        &mut client,
        "flow",
        &claim,
        "printf 'from the pod\\n' > hello.txt && echo ok",
    )
    .await;
    assert_eq!(
        result.state,
        pb::CommandState::Succeeded as i32,
        "{result:?}"
    );
    assert_eq!(result.stdout, b"ok\n");
    if kwok_serves_exec() {
        let on_disk = workspace_dir(&setup.cluster.work, &ns.name, name).join("hello.txt");
        let written = std::fs::read(on_disk).unwrap();
        assert_eq!(written, b"from the pod\n", "the helper wrote the workspace");
    }
    let file = read(&mut client, "flow", &claim, "hello.txt")
        .await
        .unwrap();
    assert_eq!(file.data, b"from the pod\n");
    release(&mut client, "flow", &claim).await;
    let stale = read(&mut client, "flow", &claim, "hello.txt").await;
    assert!(stale.is_err(), "a released claim is refused");

    let table = setup
        .cluster
        .kubectl(&["get", "executionenvironments", "-n", &ns.name])
        .await;
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[0], name, "{table}");
    assert_eq!(row[2], "True", "the Ready column: {table}");

    provider.stop().await;
    setup.finish().await;
}

pub async fn a_provider_crash_mid_flow_loses_nothing_and_the_next_process_serves_the_same_claim(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "restart").await;
    let first = setup.installation.start_provider("first").await;
    let mut client = setup.installation.client(&first);
    let allocation = common::ensure_ready(&mut client, "restart").await;
    let env = allocation.environment.clone().unwrap();
    let claim = common::acquire(&mut client, "restart", &env).await;
    let wrote = run(&mut client, "restart", &claim, "echo kept > kept.txt").await;
    assert_eq!(wrote.state, pb::CommandState::Succeeded as i32, "{wrote:?}");
    first.crash().await;

    let second = setup.installation.start_provider("second").await;
    let mut client = setup.installation.client(&second);
    let again = common::ensure_ready(&mut client, "restart").await;
    assert_eq!(
        again.environment, allocation.environment,
        "the same environment"
    );
    let file = read(&mut client, "restart", &claim, "kept.txt")
        .await
        .expect("the claim taken before the crash still works");
    assert_eq!(file.data, b"kept\n");
    release(&mut client, "restart", &claim).await;
    second.stop().await;
    setup.finish().await;
}

pub async fn two_replicas_serve_one_environment_and_exactly_one_concurrent_claim_wins(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "replicas").await;
    let a = setup.installation.start_provider("replica-a").await;
    let b = setup.installation.start_provider("replica-b").await;
    let mut client_a = setup.installation.client(&a);
    let mut client_b = setup.installation.client(&b);
    let allocation = common::ensure_ready(&mut client_a, "replicas").await;
    let env = allocation.environment.clone().unwrap();
    let through_b = common::ensure_ready(&mut client_b, "replicas").await;
    assert_eq!(through_b.environment, allocation.environment);

    let acquire = |mut client: Client, run: &'static str| {
        let env = env.clone();
        async move {
            client
                .acquire_run(pb::AcquireRunRequest {
                    environment: Some(env),
                    owner: Some(owner()),
                    binding_id: "replicas".into(),
                    run_id: run.into(),
                    operation_id: format!("acquire-{run}"),
                    ttl_millis: 60_000,
                })
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let (won_a, won_b) = tokio::join!(
        acquire(client_a.clone(), "run-a"),
        acquire(client_b.clone(), "run-b")
    );
    let (winner, loser, mut winner_client) = match (won_a, won_b) {
        (Ok(claim), Err(refused)) => (claim, refused, client_a.clone()),
        (Err(refused), Ok(claim)) => (claim, refused, client_b.clone()),
        other => panic!("exactly one claim must win: {other:?}"),
    };
    assert_eq!(
        execution_provider::server::status::error_detail(&loser).map(|d| d.code),
        Some("conflict".to_owned()),
        "{loser:?}"
    );
    let ran = run(&mut winner_client, "replicas", &winner, "echo one winner").await;
    assert_eq!(ran.stdout, b"one winner\n");
    // The other replica serves the winner's claim from the shared state.
    let other = if winner.run_id == "run-a" {
        &mut client_b
    } else {
        &mut client_a
    };
    let ran = run(other, "replicas", &winner, "echo from the other replica").await;
    assert_eq!(ran.stdout, b"from the other replica\n");
    release(other, "replicas", &winner).await;
    a.stop().await;
    b.stop().await;
    setup.finish().await;
}
