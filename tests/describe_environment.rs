//! `DescribeEnvironment` and the client's `describe` and filled-in admin commands, over real
//! mTLS against `dev`: the creator and the administrators in scope see phase, fence, epoch,
//! Pod and PVC identities, the operation and the run claim (never the claim id or the grant);
//! everyone else sees exactly what an absent environment looks like; the call writes nothing;
//! `client admin retire` fills the exact identity from the description and does nothing
//! unless confirmed; the manual recovery path of docs/operating.md §7.1 (describe, delete the
//! Pod, `admin recover` and `admin replace` with `--yes`) moves a fenced environment on.

mod common;
mod security;

use std::path::Path;
use std::process::Output;
use std::time;

use common::*;
use execution_provider::api::pb;
use execution_provider::kube::crd::{
    ActiveOperation, ExecutionEnvironment, FenceState, RfcTime, pod_name,
};
use execution_provider::server::status::error_detail;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use prost::Message;
use security::*;
use tonic::Code;

const CREATOR: &str = "spiffe://dev.local/ns/default/client";
const ADMIN: &str = "spiffe://dev.local/ns/ops/admin";
const UNSCOPED: &str = "spiffe://dev.local/ns/ops/unscoped";
const VIEWER: &str = "spiffe://dev.local/ns/default/viewer";
const BYSTANDER: &str = "spiffe://dev.local/ns/default/bystander";

async fn stored(dev: &execution_provider::cli::dev::DevProvider, id: &str) -> ExecutionEnvironment {
    Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution")
        .get(id)
        .await
        .expect("the environment exists")
}

fn by_env(env: &pb::EnvironmentRef, owner: pb::Owner) -> pb::DescribeEnvironmentRequest {
    pb::DescribeEnvironmentRequest {
        environment: Some(env.clone()),
        owner: Some(owner),
        binding_id: String::new(),
    }
}

fn by_binding(binding: &str) -> pb::DescribeEnvironmentRequest {
    pb::DescribeEnvironmentRequest {
        environment: None,
        owner: Some(owner()),
        binding_id: binding.into(),
    }
}

/// Code, message and detail code of a refused describe.
async fn refused(client: &mut Client, r: pb::DescribeEnvironmentRequest) -> (Code, String, String) {
    let status = client.describe_environment(r).await.expect_err("refused");
    let detail = error_detail(&status).map(|d| d.code).unwrap_or_default();
    (status.code(), status.message().to_owned(), detail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creator_sees_its_environment_by_binding_and_by_id_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "described")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "described", &env).await;
    let before = stored(&dev, &env.id).await;

    let d = client
        .describe_environment(by_binding("described"))
        .await
        .expect("the creator describes its binding")
        .into_inner();
    let status = before.status.clone().unwrap();
    assert_eq!(d.environment.as_ref(), Some(&env));
    assert_eq!(d.binding_id, "described");
    assert_eq!((d.phase.as_str(), d.ready), ("Ready", true));
    assert_eq!(d.fence_state, "Healthy");
    assert_eq!(d.reason, "", "a ready environment has no reason");
    assert_eq!(Some(d.epoch), status.epoch);
    assert_eq!(d.epoch, claim.epoch);
    assert_eq!(Some(d.grant_generation), status.grant_generation);
    assert_eq!(
        d.pod.as_ref().map(|p| &p.uid),
        status.pod.as_ref().map(|p| &p.uid)
    );
    assert_eq!(
        d.pvc.as_ref().map(|p| &p.uid),
        status.pvc.as_ref().map(|p| &p.uid)
    );
    assert!(d.operations.is_empty(), "nothing in flight");
    let run = d.run_claim.clone().expect("the claim is described");
    assert_eq!(
        (run.run_id.as_str(), run.epoch, run.expired),
        ("run-1", claim.epoch, false)
    );
    assert_eq!(run.expires_at, claim.expires_at);
    assert!(
        d.conditions
            .iter()
            .any(|c| c.r#type == "Ready" && c.status == "True")
    );

    let wire = d.encode_to_vec();
    for secret in [claim.claim_id.as_bytes(), claim.grant.as_bytes()] {
        assert!(
            !wire.windows(secret.len()).any(|w| w == secret),
            "a description never carries the claim id or the grant"
        );
    }
    let again = client
        .describe_environment(by_env(&env, owner()))
        .await
        .expect("the creator describes by id")
        .into_inner();
    assert_eq!(
        again, d,
        "by id and by binding describe the same incarnation"
    );
    let any_revision = pb::EnvironmentRef {
        revision: String::new(),
        ..env.clone()
    };
    let current = client
        .describe_environment(by_env(&any_revision, owner()))
        .await
        .expect("an empty revision describes the current incarnation")
        .into_inner();
    assert_eq!(current.environment.as_ref(), Some(&env));

    let after = stored(&dev, &env.id).await;
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "describing writes nothing"
    );
}

/// The policy: the creator attests owners, ADMIN administers it, UNSCOPED administers nobody,
/// VIEWER is another creator, BYSTANDER may neither attest owners nor administer.
fn scoped_policy(m: &mut serde_json::Value) {
    m["clients"] = serde_json::json!([
        {"uri": CREATOR, "mayAttestOwner": true, "executionTemplates": ["default"]},
        {"uri": ADMIN, "administrator": true, "administratorFor": [CREATOR]},
        {"uri": UNSCOPED, "administrator": true},
        {"uri": VIEWER, "mayAttestOwner": true, "executionTemplates": ["default"]},
        {"uri": BYSTANDER},
    ]);
}

async fn connect_as(
    dev: &execution_provider::cli::dev::DevProvider,
    dir: &Path,
    uri: &str,
) -> Client {
    connect(dev.addr, dir, Some(&identity_from_dev_ca(dir, uri))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_scope_callers_see_an_absent_environment_and_admins_in_scope_see_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    edit_manifest(dir, scoped_policy);
    reload(&dev).await;
    let mut creator = connect_as(&dev, dir, CREATOR).await;
    let env = ensure_ready(&mut creator, "scoped")
        .await
        .environment
        .unwrap();

    let mut admin = connect_as(&dev, dir, ADMIN).await;
    let seen = admin
        .describe_environment(by_env(&env, owner()))
        .await
        .expect("an administrator of the creator describes it")
        .into_inner();
    assert_eq!(seen.environment.as_ref(), Some(&env));

    let absent_ref = pb::EnvironmentRef {
        id: format!("exec-{}", "0".repeat(40)),
        revision: env.revision.clone(),
    };
    let absent = refused(&mut admin, by_env(&absent_ref, owner())).await;
    assert_eq!((absent.0, absent.2.as_str()), (Code::NotFound, "not_found"));

    let mut unscoped = connect_as(&dev, dir, UNSCOPED).await;
    assert_eq!(
        refused(&mut unscoped, by_env(&env, owner())).await,
        absent,
        "admin out of scope"
    );
    let mut viewer = connect_as(&dev, dir, VIEWER).await;
    assert_eq!(
        refused(&mut viewer, by_env(&env, owner())).await,
        absent,
        "another creator"
    );
    assert_eq!(
        refused(&mut viewer, by_binding("scoped")).await,
        absent,
        "another creator's binding names another environment"
    );
    let mallory = pb::Owner {
        subject: "mallory".into(),
        ..owner()
    };
    assert_eq!(
        refused(&mut admin, by_env(&env, mallory)).await,
        absent,
        "another owner"
    );
    let stale = pb::EnvironmentRef {
        revision: "0".repeat(32),
        ..env.clone()
    };
    assert_eq!(
        refused(&mut admin, by_env(&stale, owner())).await,
        absent,
        "another incarnation"
    );

    let mut bystander = connect_as(&dev, dir, BYSTANDER).await;
    let denied = refused(&mut bystander, by_env(&env, owner())).await;
    assert_eq!(
        (denied.0, denied.2.as_str()),
        (Code::PermissionDenied, "permission_denied")
    );

    let both = pb::DescribeEnvironmentRequest {
        binding_id: "scoped".into(),
        ..by_env(&env, owner())
    };
    let neither = pb::DescribeEnvironmentRequest {
        environment: None,
        owner: Some(owner()),
        binding_id: String::new(),
    };
    let no_owner = pb::DescribeEnvironmentRequest {
        owner: None,
        ..by_env(&env, owner())
    };
    for bad in [both, neither, no_owner] {
        let invalid = refused(&mut creator, bad).await;
        assert_eq!(
            (invalid.0, invalid.2.as_str()),
            (Code::InvalidArgument, "invalid_argument")
        );
    }
}

/// Runs `execution-provider client` against `dev` with the dev client's identity.
async fn cli(addr: std::net::SocketAddr, dir: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_execution-provider"))
        .arg("client")
        .args(["--address", &addr.to_string()])
        .arg("--state-dir")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("the client runs")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_admin_retire_fills_the_exact_identity_from_describe_and_needs_confirmation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let ensured = stdout_json(&cli(dev.addr, dir, &["--json", "ensure", "--binding", "cli"]).await);
    let id = ensured["environment"]["id"].as_str().unwrap().to_owned();
    let revision = ensured["environment"]["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    let described =
        stdout_json(&cli(dev.addr, dir, &["--json", "describe", "--binding", "cli"]).await);
    assert_eq!(described["environment"]["id"], id.as_str());
    assert_eq!(described["phase"], "Ready");
    let pod_uid = described["pod"]["uid"].as_str().unwrap().to_owned();
    let text = cli(dev.addr, dir, &["describe", "--env", &id]).await;
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&pod_uid),
        "the text form names the Pod UID"
    );
    assert!(
        cli(dev.addr, dir, &["release", "--binding", "cli"])
            .await
            .status
            .success()
    );
    let before = stored(&dev, &id).await.metadata.resource_version;

    let retire = ["admin", "retire", "--env", &id, "--env-revision", &revision];
    let unconfirmed = cli(dev.addr, dir, &retire).await;
    assert!(
        !unconfirmed.status.success(),
        "no terminal and no --yes: nothing is done"
    );
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"));
    assert_eq!(stored(&dev, &id).await.metadata.resource_version, before);

    let confirmed = cli(
        dev.addr,
        dir,
        &[&retire[..], &["--yes", "--op", "retire-1"]].concat(),
    )
    .await;
    let said = String::from_utf8_lossy(&confirmed.stderr);
    assert!(confirmed.status.success(), "{said}");
    let epoch = described["epoch"].to_string();
    for shown in [epoch.as_str(), pod_uid.as_str(), "retire-1"] {
        assert!(
            said.contains(shown),
            "the filled values are printed: {said}"
        );
    }
    let client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let owner = pb::Owner {
        issuer: "https://dev.local".into(),
        subject: "developer".into(),
    };
    let env = pb::EnvironmentRef { id, revision };
    eventually(
        std::time::Duration::from_secs(60),
        "the environment retires",
        || {
            let (mut client, request) = (client.clone(), by_env(&env, owner.clone()));
            async move {
                let d = client
                    .describe_environment(request)
                    .await
                    .ok()?
                    .into_inner();
                (d.phase == "Retired").then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_acquire_says_which_run_holds_the_claim_and_release_needs_no_grant() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    let acquire = [
        "run",
        "acquire",
        "--binding",
        "held",
        "--run-id",
        "first-run",
    ];
    let claim = stdout_json(&cli(dev.addr, dir, &[&["--json"][..], &acquire[..]].concat()).await);
    let second = cli(dev.addr, dir, &["run", "acquire", "--binding", "held"]).await;
    assert!(!second.status.success(), "the claim is held");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("(conflict)"),
        "the refusal stays as it is: {said}"
    );
    assert!(
        said.contains("held by run first-run (binding held) until "),
        "the holder and its expiry are named: {said}"
    );

    let epoch = claim["epoch"].to_string();
    let generation = claim["grantGeneration"].to_string();
    let release = [
        "run",
        "release",
        "--binding",
        "held",
        "--run-id",
        "first-run",
        "--claim-id",
        claim["claimId"].as_str().unwrap(),
        "--epoch",
        &epoch,
        "--generation",
        &generation,
    ];
    let released = cli(dev.addr, dir, &release).await;
    assert!(
        released.status.success(),
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    let again = cli(dev.addr, dir, &acquire).await;
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_status_summarises_the_owners_environments_one_line_each() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir).await;
    for binding in ["first", "second"] {
        let out = cli(dev.addr, dir, &["ensure", "--binding", binding]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Not a terminal: no progress is drawn on stderr.
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let args = [
        "status",
        "--binding",
        "first",
        "--binding",
        "second",
        "--binding",
        "never",
    ];
    let out = cli(dev.addr, dir, &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("BINDING\tENVIRONMENT\tPHASE"),
        "{text}"
    );
    for (line, binding) in lines[1..3].iter().zip(["first", "second"]) {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields[0], binding, "{text}");
        assert!(fields[1].starts_with("exec-"), "{text}");
        assert_eq!((fields[2], fields[3]), ("Ready", "Healthy"), "{text}");
    }
    assert!(lines[3].starts_with("never\t-\t"), "{text}");
    assert!(lines[3].contains("not_found"), "{text}");
    assert_eq!(lines[4], "2 environments: 2 Ready");

    let json = stdout_json(&cli(dev.addr, dir, &["--json", "status", "--binding", "first"]).await);
    assert_eq!(json["phases"]["Ready"], 1);
    assert_eq!(json["environments"][0]["bindingId"], "first");
}

/// Runs `execution-provider client` for the suite's owner (alice) rather than the CLI's
/// default end user.
async fn cli_for_owner(addr: std::net::SocketAddr, dir: &Path, args: &[&str]) -> Output {
    let who = owner();
    let flags = [
        "--owner-issuer",
        who.issuer.as_str(),
        "--owner-subject",
        who.subject.as_str(),
    ];
    cli(addr, dir, &[&flags[..], args].concat()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manual_path_of_the_operators_guide_moves_a_fenced_environment_on() {
    // docs/operating.md §7.1, "The manual path", walked against `dev` on a template that
    // sets `recovery: manual` (so the reconciler does not recover it first).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init_state_dir_with_manual_recovery(dir);
    let dev = start_dev(dir).await;
    let mut client = connect(dev.addr, dir, Some(&dev_identity(dir))).await;
    let env = ensure_ready(&mut client, "manual")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "manual", &env).await;
    let ctx = context("manual", &claim);
    let write = pb::FileRequest {
        context: Some(ctx.clone()),
        operation: pb::FileOperation::Create as i32,
        path: "kept.txt".into(),
        data: b"kept".to_vec(),
        ..pb::FileRequest::default()
    };
    client.files(write).await.expect("a file is written");

    // The holder of an operation vanished mid-call: its lease ran out, and the supervisor
    // never heard of the call. The reconciler asks, fences, and says why it stays fenced.
    let api = Api::<ExecutionEnvironment>::namespaced(dev.kube.clone(), "execution");
    let mut live = api.get(&env.id).await.unwrap();
    let gone = time::Duration::from_secs(60);
    let long_ago = RfcTime::from_system_time(time::SystemTime::UNIX_EPOCH + gone);
    live.status.as_mut().unwrap().active_operation = Some(ActiveOperation {
        id: "op-lost".into(),
        operation: "command.start".into(),
        started_at: long_ago,
        claim_id: claim.claim_id.clone(),
        run_id: claim.run_id.clone(),
        epoch: claim.epoch,
        holder_id: "replica-killed".into(),
        renewed_at: long_ago,
        expires_at: long_ago,
    });
    api.replace_status(&env.id, &PostParams::default(), &live)
        .await
        .unwrap();
    eventually(
        time::Duration::from_secs(30),
        "the ManualRecovery condition",
        || {
            let api = api.clone();
            let id = env.id.clone();
            async move {
                let status = api.get(&id).await.ok()?.status?;
                let says = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Recovering" && c.reason == "ManualRecovery");
                (status.fence_state == Some(FenceState::FenceUnknown) && says).then_some(())
            }
        },
    )
    .await;

    // Read the identities first.
    let exact = ["--env", &env.id, "--env-revision", &env.revision];
    let described = stdout_json(
        &cli_for_owner(
            dev.addr,
            dir,
            &[&["--json", "describe"][..], &exact].concat(),
        )
        .await,
    );
    assert_eq!(described["phase"], "Fenced", "{described}");
    assert_eq!(described["fenceState"], "FenceUnknown", "{described}");
    assert_eq!(
        described["operations"][0]["operationId"], "op-lost",
        "{described}"
    );
    let pod_uid = described["pod"]["uid"].as_str().unwrap().to_owned();
    let epoch = described["epoch"].as_u64().unwrap();
    assert_eq!(epoch, claim.epoch, "{described}");

    // Nothing is proven while the Pod runs.
    let recover = [
        &["admin", "recover"][..],
        &exact,
        &["--yes", "--op", "recover-1"],
    ]
    .concat();
    let early = cli_for_owner(dev.addr, dir, &recover).await;
    assert!(!early.status.success(), "recovered while the Pod runs");
    assert!(
        String::from_utf8_lossy(&early.stderr).contains("fence_unknown"),
        "{}",
        String::from_utf8_lossy(&early.stderr)
    );

    // 1. The Pod is deleted, never forced (dev's kubeconfig is read-only: the test deletes it
    //    through the embedded API server, as `kubectl delete pod` does on a cluster).
    let pods = Api::<Pod>::namespaced(dev.kube.clone(), "execution");
    let pod = pod_name(&env.id);
    pods.delete(&pod, &Default::default()).await.unwrap();
    // 2. Once every container is reported terminated: recover, then replace.
    eventually(
        time::Duration::from_secs(30),
        "every container terminated",
        || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                let p = pods.get(&pod).await.ok()?;
                execution_provider::reconciler::pod::pod_terminal(&p).then_some(())
            }
        },
    )
    .await;
    let recovered = cli_for_owner(dev.addr, dir, &recover).await;
    let said = String::from_utf8_lossy(&recovered.stderr).into_owned();
    assert!(recovered.status.success(), "{said}");
    // The fence is cleared, so nothing says any more that it stays.
    let cleared = stored(&dev, &env.id).await.status.unwrap();
    assert_eq!(cleared.fence_state, Some(FenceState::Healthy));
    assert!(
        !cleared.conditions.iter().any(|c| c.type_ == "Recovering"),
        "a stale Recovering condition: {:?}",
        cleared.conditions
    );
    for shown in [epoch.to_string().as_str(), pod_uid.as_str()] {
        assert!(
            said.contains(shown),
            "the filled values are printed: {said}"
        );
    }
    let replace = [
        &["admin", "replace"][..],
        &exact,
        &["--yes", "--op", "replace-1"],
    ]
    .concat();
    let replaced = cli_for_owner(dev.addr, dir, &replace).await;
    assert!(
        replaced.status.success(),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );

    let serving = eventually(
        time::Duration::from_secs(60),
        "the replacement to serve",
        || {
            let (mut client, request) = (client.clone(), by_env(&env, owner()));
            async move {
                let d = client
                    .describe_environment(request)
                    .await
                    .ok()?
                    .into_inner();
                (d.phase == "Ready" && d.fence_state == "Healthy").then_some(d)
            }
        },
    )
    .await;
    assert_eq!(serving.epoch, epoch + 1, "a new executor: {serving:?}");
    assert_ne!(serving.pod.as_ref().unwrap().uid, pod_uid);
    let status = stored(&dev, &env.id).await.status.unwrap();
    assert_eq!(status.termination_proof.unwrap().pod_uid, pod_uid);
    assert!(
        status.recovered_operation.is_none(),
        "no outcome is invented"
    );

    // The old claim ended with the recovery; a new one finds the workspace as it was.
    let stale = client
        .files(pb::FileRequest {
            context: Some(ctx),
            operation: pb::FileOperation::Read as i32,
            path: "kept.txt".into(),
            ..pb::FileRequest::default()
        })
        .await
        .expect_err("the old claim ended");
    assert_eq!(stale.code(), Code::Aborted, "{stale:?}");
    let fresh = client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: "manual".into(),
            run_id: "run-2".into(),
            operation_id: "acquire-2".into(),
            ttl_millis: 60_000,
        })
        .await
        .expect("a new claim")
        .into_inner();
    assert_eq!(
        fresh.epoch,
        serving.epoch + 1,
        "a claim takes the next epoch"
    );
    let kept = client
        .files(pb::FileRequest {
            context: Some(context("manual", &fresh)),
            operation: pb::FileOperation::Read as i32,
            path: "kept.txt".into(),
            ..pb::FileRequest::default()
        })
        .await
        .expect("the new executor serves the workspace")
        .into_inner();
    assert_eq!(kept.data, b"kept");
}
