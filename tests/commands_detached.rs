//! Detached commands end to end in `dev` (docs/commands.md §5, §6, §7): a start writes one
//! lease and answers at once; status, follow, stdin, signals and listing go to the supervisor
//! and write nothing; cancel records its proven end; 16 run at once and the 17th is refused;
//! a claim's release ends its commands (their processes gone) and records every outcome; a
//! later claim, an ended claim and a foreign caller see what an absent command looks like.
//!
//! `dev` runs here with `--unsafe-no-isolation`: a sandboxed `dev` has no supervisor yet
//! (tests/command_control.rs covers that it then refuses a detach without running it).

mod common;
mod security;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::{DEV_NAMESPACE, DevProvider};
use execution_provider::cli::state_dir::DEV_CLIENT_URI;
use execution_provider::kube::crd::{
    ExecutionEnvironment, ExecutionEnvironmentStatus, FenceState, RfcTime,
};
use execution_provider::security::grant::{GrantBinding, GrantEnvironment};
use execution_provider::server::status::error_detail;
use execution_provider::store::naming::owner_hash;
use kube::api::{Api, PostParams};
use tonic::Code;

/// The issuer of the test owners.
const ISSUER: &str = "https://issuer.test";

fn code_of(status: &tonic::Status) -> (Code, String) {
    (
        status.code(),
        error_detail(status).map(|d| d.code).unwrap_or_default(),
    )
}

/// Everything a refusal tells its caller: the gRPC code, the message and the detail's code.
fn refusal(status: &tonic::Status) -> (Code, String, String) {
    (
        status.code(),
        status.message().to_owned(),
        error_detail(status).map(|d| d.code).unwrap_or_default(),
    )
}

/// The refusal of every per-command call (status, follow, stdin, signal, cancel) for `id`
/// under `ctx`.
async fn refusals(
    client: &mut Client,
    ctx: &pb::RequestContext,
    id: &str,
) -> Vec<(&'static str, (Code, String, String))> {
    let status = client.command_status(query(ctx, id, 0)).await.unwrap_err();
    let follow = match client.follow_command(query(ctx, id, 0)).await {
        Err(refused) => refused,
        Ok(stream) => first_answer(stream.into_inner(), "follow").await,
    };
    let stdin = client
        .write_command_stdin(pb::CommandStdinRequest {
            context: Some(ctx.clone()),
            command_id: id.into(),
            data: b"x".to_vec(),
            close: false,
        })
        .await
        .unwrap_err();
    let signal = client
        .signal_command(pb::CommandSignalRequest {
            context: Some(ctx.clone()),
            command_id: id.into(),
            signal: pb::CommandSignal::Kill as i32,
        })
        .await
        .unwrap_err();
    let resize = client
        .resize_command(pb::CommandResizeRequest {
            context: Some(ctx.clone()),
            command_id: id.into(),
            rows: 30,
            cols: 100,
        })
        .await
        .unwrap_err();
    let attach = attach_refusal(client, ctx, id).await;
    let cancel = client.cancel_command(query(ctx, id, 0)).await.unwrap_err();
    vec![
        ("status", refusal(&status)),
        ("follow", refusal(&follow)),
        ("stdin", refusal(&stdin)),
        ("signal", refusal(&signal)),
        ("resize", refusal(&resize)),
        ("attach", refusal(&attach)),
        ("cancel", refusal(&cancel)),
    ]
}

/// An attach to `id` that types a key and asks for a resize: how it is refused, at its open
/// or as its stream's first answer.
async fn attach_refusal(client: &mut Client, ctx: &pb::RequestContext, id: &str) -> tonic::Status {
    let inputs = vec![
        attach_input(pb::command_attach_input::Input::Open(query(ctx, id, 0))),
        attach_input(pb::command_attach_input::Input::Stdin(b"x".to_vec())),
        attach_input(pb::command_attach_input::Input::Resize(pb::PtySize {
            rows: 30,
            cols: 100,
        })),
    ];
    match client.attach_command(futures::stream::iter(inputs)).await {
        Err(refused) => refused,
        Ok(stream) => first_answer(stream.into_inner(), "attach").await,
    }
}

/// The refusal a stream answers first (within 20 s).
async fn first_answer(
    mut stream: tonic::Streaming<pb::CommandOutputEvent>,
    call: &str,
) -> tonic::Status {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .unwrap_or_else(|_| panic!("the {call} is answered neither with a refusal nor output"))
        .expect_err(&format!("the {call} is refused"))
}

fn attach_input(input: pb::command_attach_input::Input) -> pb::CommandAttachInput {
    pb::CommandAttachInput { input: Some(input) }
}

/// Under `ctx`, the command `existing` looks exactly like the absent `absent` to every
/// per-command call.
async fn assert_absent_everywhere(
    client: &mut Client,
    ctx: &pb::RequestContext,
    existing: &str,
    absent: &str,
) {
    let seen = refusals(client, ctx, existing).await;
    let expected = refusals(client, ctx, absent).await;
    assert_eq!(seen, expected, "{existing} must look absent");
}

fn detached(ctx: &pb::RequestContext, command: &str) -> pb::CommandStartRequest {
    pb::CommandStartRequest {
        context: Some(ctx.clone()),
        command: command.into(),
        detach: true,
        ..Default::default()
    }
}

async fn start(client: &mut Client, request: pb::CommandStartRequest) -> String {
    let answer = client.start_command(request).await.unwrap().into_inner();
    assert!(!answer.command_id.is_empty());
    answer.command_id
}

fn query(ctx: &pb::RequestContext, id: &str, offset: i64) -> pb::CommandQueryRequest {
    pb::CommandQueryRequest {
        context: Some(ctx.clone()),
        command_id: id.into(),
        offset,
        ..Default::default()
    }
}

/// Polls `CommandStatus` until the command has ended.
async fn ended(
    client: &mut Client,
    ctx: &pb::RequestContext,
    id: &str,
) -> pb::CommandStatusResponse {
    eventually(Duration::from_secs(30), "the command's end", || {
        let mut client = client.clone();
        let request = query(ctx, id, 0);
        async move {
            let status = client.command_status(request).await.unwrap().into_inner();
            (status.state != pb::CommandState::Running as i32).then_some(status)
        }
    })
    .await
}

/// A second claim of `binding` (`run-2`), once the first is gone.
async fn acquire_second(
    client: &mut Client,
    binding: &str,
    env: &pb::EnvironmentRef,
) -> pb::RunClaimResponse {
    client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: "run-2".into(),
            operation_id: "acquire-2".into(),
            ttl_millis: 60_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// The lease `id` as the status records it.
async fn lease(api: &Api<ExecutionEnvironment>, env: &str, id: &str) -> serde_json::Value {
    let o = api.get(env).await.unwrap();
    let status = serde_json::to_value(o.status.unwrap()).unwrap();
    status["commands"]
        .as_array()
        .and_then(|all| all.iter().find(|l| l["id"] == id).cloned())
        .unwrap_or(serde_json::Value::Null)
}

async fn follow(
    client: &mut Client,
    ctx: &pb::RequestContext,
    id: &str,
    offset: i64,
) -> (Vec<u8>, pb::CommandStatusResponse) {
    let mut stream = client
        .follow_command(query(ctx, id, offset))
        .await
        .unwrap()
        .into_inner();
    let mut bytes = Vec::new();
    let mut expected = offset;
    while let Some(event) = stream.message().await.unwrap() {
        match event.event.unwrap() {
            pb::command_output_event::Event::Chunk(chunk) => {
                assert_eq!(chunk.offset, expected, "chunks are contiguous and in order");
                expected += chunk.data.len() as i64;
                bytes.extend_from_slice(&chunk.data);
            }
            pb::command_output_event::Event::End(end) => return (bytes, end),
            pb::command_output_event::Event::DroppedBytes(n) => panic!("dropped {n}"),
        }
    }
    panic!("the follow ended without the command's end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_commands_run_in_the_background_and_every_read_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "bg").await.environment.unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let version = || async { api.get(&env.id).await.unwrap().metadata.resource_version };
    let claim = acquire(&mut client, "bg", &env).await;
    let ctx = context("bg", &claim);

    // The start answers at once, before the command ends.
    let before = version().await;
    let started = client
        .start_command(detached(&ctx, "echo out; echo err >&2; sleep 1; echo done"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.state, pb::CommandState::Running as i32);
    let id = started.command_id;
    assert_eq!(lease(&api, &env.id, &id).await["state"], "Running");
    let after_start = version().await;
    assert_ne!(after_start, before, "the start wrote its lease");

    // Polls and follows go to the supervisor and write nothing.
    let end = ended(&mut client, &ctx, &id).await;
    assert_eq!(end.state, pb::CommandState::Succeeded as i32);
    assert_eq!(end.stdout, b"out\ndone\n");
    assert_eq!(end.stderr, b"err\n");
    assert_eq!(end.next_offset, 13);
    assert_eq!(
        end.terminal_receipt.len(),
        64,
        "a proven end has its receipt"
    );
    assert!(end.detached);
    let (bytes, last) = follow(&mut client, &ctx, &id, 0).await;
    assert_eq!(bytes.len(), 13);
    assert_eq!(last.terminal_receipt, end.terminal_receipt);
    let (tail, _) = follow(&mut client, &ctx, &id, 4).await;
    assert_eq!(tail, &bytes[4..], "a follow resumes at an offset");
    let past = client
        .command_status(query(&ctx, &id, 14))
        .await
        .unwrap_err();
    assert_eq!(past.code(), Code::InvalidArgument);
    let listed = client
        .list_commands(pb::ListCommandsRequest {
            context: Some(ctx.clone()),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.commands.len(), 1);
    assert!(listed.commands[0].stdout.is_empty() && listed.commands[0].chunks.is_empty());
    assert_eq!(
        version().await,
        after_start,
        "no read wrote the environment"
    );

    // Variables reach the command only; the working directory is inside the workspace.
    client
        .start_command(pb::CommandStartRequest {
            context: Some(ctx.clone()),
            command: "mkdir -p sub/dir".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut with_env = detached(&ctx, "pwd; printf %s \"$TOKEN\"");
    with_env.env.push(pb::CommandEnvVar {
        name: "TOKEN".into(),
        value: "secret-value-7f3a".into(),
    });
    with_env.working_directory = "sub/dir".into();
    let env_id = start(&mut client, with_env).await;
    let out = ended(&mut client, &ctx, &env_id).await.stdout;
    let out = String::from_utf8(out).unwrap();
    assert!(out.ends_with("/sub/dir\nsecret-value-7f3a"), "{out}");
    let stored = serde_json::to_string(&api.get(&env.id).await.unwrap()).unwrap();
    assert!(
        !stored.contains("secret-value-7f3a"),
        "variables never reach the status"
    );
    let mut outside = detached(&ctx, "true");
    outside.working_directory = "missing".into();
    let refused = client.start_command(outside).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);

    // Stdin, then its close; a write after the close is refused.
    let mut cat = detached(&ctx, "cat");
    cat.open_stdin = true;
    let cat_id = start(&mut client, cat).await;
    let stdin = |data: &[u8], close| pb::CommandStdinRequest {
        context: Some(ctx.clone()),
        command_id: cat_id.clone(),
        data: data.to_vec(),
        close,
    };
    let written = client
        .write_command_stdin(stdin(b"hello ", false))
        .await
        .unwrap();
    assert_eq!(written.into_inner().accepted_bytes, 6);
    client
        .write_command_stdin(stdin(b"world", true))
        .await
        .unwrap();
    let cat_end = ended(&mut client, &ctx, &cat_id).await;
    assert_eq!(cat_end.stdout, b"hello world");
    let closed = client
        .write_command_stdin(stdin(b"late", false))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&closed),
        (Code::FailedPrecondition, "command_ended".into())
    );

    // A signal reaches the command's group.
    let trap = start(
        &mut client,
        detached(&ctx, "trap 'exit 7' INT; while :; do sleep 0.05; done"),
    )
    .await;
    let signal = |id: &str, signal: pb::CommandSignal| pb::CommandSignalRequest {
        context: Some(ctx.clone()),
        command_id: id.into(),
        signal: signal as i32,
    };
    // The trap is set once the shell runs its first loop; resend until it exits.
    let trapped = eventually(Duration::from_secs(10), "the trapped exit", || {
        let mut client = client.clone();
        let (request, query) = (signal(&trap, pb::CommandSignal::Int), query(&ctx, &trap, 0));
        async move {
            let _ = client.signal_command(request).await;
            let status = client.command_status(query).await.unwrap().into_inner();
            (status.state != pb::CommandState::Running as i32).then_some(status)
        }
    })
    .await;
    assert_eq!(trapped.exit_code, 7);

    // Cancel: written Cancelling, then Ended with its proven outcome; again, the same answer.
    let sleeper = start(&mut client, detached(&ctx, "sleep 600")).await;
    let mut cancel = query(&ctx, &sleeper, 0);
    cancel.grace_millis = 200;
    let cancelled = client
        .cancel_command(cancel.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state, pb::CommandState::Cancelled as i32);
    assert_eq!(cancelled.terminal_receipt.len(), 64);
    let recorded = lease(&api, &env.id, &sleeper).await;
    assert_eq!(recorded["state"], "Ended");
    assert_eq!(recorded["outcome"]["reason"], "Cancelled");
    assert_eq!(
        recorded["outcome"]["terminalReceipt"],
        cancelled.terminal_receipt.as_str()
    );
    let settled = version().await;
    let again = client.cancel_command(cancel).await.unwrap().into_inner();
    assert_eq!(again.state, cancelled.state);
    assert_eq!(again.terminal_receipt, cancelled.terminal_receipt);
    assert_eq!(version().await, settled, "a repeated cancel writes nothing");
}

/// §5.6: commands that ended by themselves stop counting against the limit at the next start,
/// whose one write records their ends (state, exit code, receipt) from the supervisor; a
/// cancel's write records them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_ended_by_themselves_are_recorded_by_the_next_start_or_cancel() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "self-ended")
        .await
        .environment
        .unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let claim = acquire(&mut client, "self-ended", &env).await;
    let ctx = context("self-ended", &claim);

    let mut ids = Vec::new();
    for i in 0..16 {
        ids.push(start(&mut client, detached(&ctx, &format!("exit {}", i % 2))).await);
    }
    let before_polls = api.get(&env.id).await.unwrap().metadata.resource_version;
    for id in &ids {
        ended(&mut client, &ctx, id).await;
    }
    let after_polls = api.get(&env.id).await.unwrap().metadata.resource_version;
    assert_eq!(before_polls, after_polls, "status polls write nothing");
    // The last one had no start after it to record its end.
    assert_eq!(lease(&api, &env.id, &ids[15]).await["state"], "Running");
    let seventeenth = start(&mut client, detached(&ctx, "exec sleep 600")).await;
    for (i, id) in ids.iter().enumerate() {
        let recorded = lease(&api, &env.id, id).await;
        assert_eq!(recorded["state"], "Ended", "{recorded}");
        assert_eq!(recorded["outcome"]["reason"], "Exited", "{recorded}");
        let (state, code) = if i % 2 == 0 {
            ("Succeeded", 0)
        } else {
            ("Failed", 1)
        };
        assert_eq!(recorded["outcome"]["state"], state, "{recorded}");
        assert_eq!(recorded["outcome"]["exitCode"], code, "{recorded}");
        assert!(
            recorded["outcome"]["terminalReceipt"]
                .as_str()
                .is_some_and(|r| !r.is_empty()),
            "{recorded}"
        );
    }
    assert_eq!(lease(&api, &env.id, &seventeenth).await["state"], "Running");

    // A cancel's write records the claim's other commands that ended by themselves, however
    // many entries the supervisor keeps for the claim (it lists them in no particular order):
    // with 60, a list cut at the 16 open leases' bound missed the one below most of the time.
    for _ in 0..42 {
        let id = start(&mut client, detached(&ctx, "true")).await;
        ended(&mut client, &ctx, &id).await;
    }
    let exited = start(&mut client, detached(&ctx, "exit 5")).await;
    assert_eq!(ended(&mut client, &ctx, &exited).await.exit_code, 5);
    assert_eq!(lease(&api, &env.id, &exited).await["state"], "Running");
    let mut cancel = query(&ctx, &seventeenth, 0);
    cancel.grace_millis = 200;
    client.cancel_command(cancel).await.unwrap();
    let cancelled = lease(&api, &env.id, &seventeenth).await;
    assert_eq!(cancelled["outcome"]["reason"], "Cancelled", "{cancelled}");
    let recorded = lease(&api, &env.id, &exited).await;
    assert_eq!(recorded["state"], "Ended", "{recorded}");
    assert_eq!(recorded["outcome"]["reason"], "Exited", "{recorded}");
    assert_eq!(recorded["outcome"]["exitCode"], 5, "{recorded}");
    common::release(&mut client, "self-ended", &env, &claim).await;
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_run_at_once_and_a_claims_release_ends_them_for_good() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "many").await.environment.unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let version = || async { api.get(&env.id).await.unwrap().metadata.resource_version };
    let claim = acquire(&mut client, "many", &env).await;
    let ctx = context("many", &claim);

    let mut ids = Vec::new();
    for i in 0..16 {
        let command = format!("echo $$ > pid-{i}; exec sleep 600");
        ids.push(start(&mut client, detached(&ctx, &command)).await);
    }
    let full = version().await;
    let refused = client
        .start_command(detached(&ctx, "touch ran-17th"))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&refused),
        (Code::ResourceExhausted, "command_limit".into())
    );
    assert_eq!(version().await, full, "the refusal wrote nothing");

    let workspace = tmp.path().join("workspaces").join(&env.id);
    let pids: Vec<i32> = eventually(Duration::from_secs(10), "every pid file", || {
        let workspace = workspace.clone();
        async move {
            (0..16)
                .map(|i| {
                    let text = std::fs::read_to_string(workspace.join(format!("pid-{i}"))).ok()?;
                    text.trim().parse().ok()
                })
                .collect::<Option<Vec<i32>>>()
        }
    })
    .await;
    assert!(!workspace.join("ran-17th").exists());

    common::release(&mut client, "many", &env, &claim).await;
    for id in &ids {
        let recorded = lease(&api, &env.id, id).await;
        assert_eq!(recorded["state"], "Ended", "{recorded}");
        assert_eq!(recorded["outcome"]["reason"], "ClaimEnded");
        assert_eq!(recorded["outcome"]["state"], "Cancelled");
    }
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "command {pid} outlived its claim"
        );
    }

    // The ended claim is refused by validation; a later claim of the same caller sees the
    // earlier claim's commands as absent; so does a foreign caller.
    let stale = client
        .command_status(query(&ctx, &ids[0], 0))
        .await
        .unwrap_err();
    assert_eq!(
        stale.code(),
        Code::Aborted,
        "the released claim is not current"
    );
    let next = acquire_second(&mut client, "many", &env).await;
    let later = context("many", &next);
    // What a truly absent command answers this caller, call by call: the earlier claim's
    // commands answer exactly that (code, message and detail), and so does a foreign caller,
    // for an id that exists and for one that does not.
    assert_absent_everywhere(&mut client, &later, &ids[0], "no-such-id").await;
    assert_absent_everywhere(&mut client, &later, &ids[1], "no-such-id").await;
    assert_eq!(
        refusal(
            &client
                .command_status(query(&later, "no-such-id", 0))
                .await
                .unwrap_err()
        )
        .2,
        "command_not_found"
    );
    let listed = client
        .list_commands(pb::ListCommandsRequest {
            context: Some(later.clone()),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.commands.is_empty(),
        "another claim's commands are not listed"
    );
    let mut foreign = later.clone();
    foreign.owner = Some(pb::Owner {
        issuer: ISSUER.into(),
        subject: "mallory".into(),
    });
    assert_absent_everywhere(&mut client, &foreign, &ids[0], "no-such-id").await;
    // With a grant the provider signed for that other owner, the caller passes the grant
    // check and is refused by the environment's owner: the same for both ids again.
    let signed_foreign = signed(&dev, foreign.clone(), &owner_hash(ISSUER, "mallory"));
    assert_absent_everywhere(&mut client, &signed_foreign, &ids[0], "no-such-id").await;
    let foreign_list = client
        .list_commands(pb::ListCommandsRequest {
            context: Some(foreign.clone()),
            limit: 0,
        })
        .await
        .unwrap_err();
    let foreign_absent = client
        .command_status(query(&foreign, "no-such-id", 0))
        .await
        .unwrap_err();
    assert_eq!(refusal(&foreign_list), refusal(&foreign_absent));
}

/// Edits the environment's status directly in the API server (what no store write would do:
/// the tests set up states of the tuple the store itself never writes).
async fn doctor(
    api: &Api<ExecutionEnvironment>,
    env: &str,
    edit: impl FnOnce(&mut ExecutionEnvironmentStatus),
) {
    let mut o = api.get(env).await.unwrap();
    edit(o.status.as_mut().unwrap());
    api.replace_status(env, &PostParams::default(), &o)
        .await
        .unwrap();
}

/// `ctx` with a grant the provider signed for exactly its fields and `owner_hash`.
fn signed(dev: &DevProvider, ctx: pb::RequestContext, owner_hash: &str) -> pb::RequestContext {
    let env = ctx.environment.clone().unwrap();
    let (grant, _) = dev
        .security
        .sign_grant(GrantBinding {
            client: DEV_CLIENT_URI.into(),
            owner: owner_hash.into(),
            binding_id: ctx.binding_id.clone(),
            run_id: ctx.run_id.clone(),
            claim_id: ctx.claim_id.clone(),
            environment: GrantEnvironment {
                id: env.id,
                revision: env.revision,
            },
            epoch: ctx.epoch,
            grant_generation: ctx.grant_generation,
        })
        .unwrap();
    pb::RequestContext { grant, ..ctx }
}

/// `ctx` moved to `epoch` and `generation`, with a grant the provider signed for exactly that.
async fn moved_context(
    dev: &DevProvider,
    api: &Api<ExecutionEnvironment>,
    ctx: &pb::RequestContext,
    epoch: u64,
    generation: u64,
) -> pb::RequestContext {
    let o = api
        .get(&ctx.environment.as_ref().unwrap().id)
        .await
        .unwrap();
    let moved = pb::RequestContext {
        epoch,
        grant_generation: generation,
        ..ctx.clone()
    };
    signed(dev, moved, &o.spec.owner_hash)
}

/// The pid a command wrote to `name` in the workspace.
async fn pid_in(workspace: &std::path::Path, name: &str) -> i32 {
    let path = workspace.join(name);
    eventually(Duration::from_secs(10), "the pid file", || {
        let path = path.clone();
        async move { std::fs::read_to_string(path).ok()?.trim().parse().ok() }
    })
    .await
}

/// Waits until the lease `id` is recorded ended and answers it.
async fn recorded_end(api: &Api<ExecutionEnvironment>, env: &str, id: &str) -> serde_json::Value {
    eventually(Duration::from_secs(60), "the recorded end", || async {
        let recorded = lease(api, env, id).await;
        (recorded["state"] == "Ended").then_some(recorded)
    })
    .await
}

/// The lease ended because its claim's authority ended, with its end proven: cancelled with
/// a receipt, and the process gone.
fn assert_ended_by_its_claim(recorded: &serde_json::Value, pid: i32) {
    assert_eq!(recorded["outcome"]["reason"], "ClaimEnded", "{recorded}");
    assert_eq!(recorded["outcome"]["state"], "Cancelled", "{recorded}");
    assert_eq!(
        recorded["outcome"]["terminalReceipt"]
            .as_str()
            .map(str::len),
        Some(64),
        "the end is proven: {recorded}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "command {pid} outlived its claim"
    );
}

struct Running {
    tmp: tempfile::TempDir,
    dev: DevProvider,
    client: Client,
    api: Api<ExecutionEnvironment>,
    env: pb::EnvironmentRef,
    ctx: pb::RequestContext,
    /// The detached `sleep` started under the claim.
    id: String,
    pid: i32,
}

/// A `dev` environment whose claim (of `ttl_millis`) runs one detached `sleep 600`.
async fn running(binding: &str, ttl_millis: i64) -> Running {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, binding)
        .await
        .environment
        .unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let claim = client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: binding.into(),
            run_id: "run-1".into(),
            operation_id: "acquire-1".into(),
            ttl_millis,
        })
        .await
        .unwrap()
        .into_inner();
    let ctx = context(binding, &claim);
    let id = start(&mut client, detached(&ctx, "echo $$ > pid; exec sleep 600")).await;
    let pid = pid_in(&tmp.path().join("workspaces").join(&env.id), "pid").await;
    Running {
        tmp,
        dev,
        client,
        api,
        env,
        ctx,
        id,
        pid,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_another_epoch_or_generation_looks_absent_at_the_provider_and_the_supervisor() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "tuple")
        .await
        .environment
        .unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    // A generation before the claim's must exist: the claim is taken under generation 2.
    doctor(&api, &env.id, |s| s.grant_generation = Some(2)).await;
    let claim = acquire(&mut client, "tuple", &env).await;
    let ctx = context("tuple", &claim);
    assert_eq!((claim.epoch, claim.grant_generation), (2, 2));
    let older_epoch = start(&mut client, detached(&ctx, "sleep 600")).await;
    let older_generation = start(&mut client, detached(&ctx, "sleep 600")).await;
    let own = start(&mut client, detached(&ctx, "sleep 600")).await;

    // The provider's check: a lease recorded under an older epoch, or an older generation,
    // than the claim presented is not that claim's, although the supervisor started it under
    // exactly the presented tuple (so only the provider can refuse it here).
    doctor(&api, &env.id, |s| {
        for l in &mut s.commands {
            if l.id == older_epoch {
                l.epoch -= 1;
            }
            if l.id == older_generation {
                l.grant_generation -= 1;
            }
        }
    })
    .await;
    assert_absent_everywhere(&mut client, &ctx, &older_epoch, "no-such-id").await;
    assert_absent_everywhere(&mut client, &ctx, &older_generation, "no-such-id").await;
    client
        .command_status(query(&ctx, &own, 0))
        .await
        .expect("the claim's own lease answers");

    // The supervisor's check: the status moves the environment, its claim and every lease
    // to the next epoch (then also the next generation), and the caller presents exactly
    // that with a valid grant: the provider's checks pass, and the supervisor, which started
    // the command under the earlier tuple, answers what it answers for an unknown id.
    for (epoch, generation) in [(3, 2), (3, 3)] {
        doctor(&api, &env.id, |s| {
            s.epoch = Some(epoch);
            s.grant_generation = Some(generation);
            let run = s.active_run.as_mut().unwrap();
            run.epoch = epoch;
            run.grant_generation = generation;
            for l in &mut s.commands {
                l.epoch = epoch;
                l.grant_generation = generation;
            }
        })
        .await;
        let moved = moved_context(&dev, &api, &ctx, epoch, generation).await;
        client
            .list_commands(pb::ListCommandsRequest {
                context: Some(moved.clone()),
                limit: 0,
            })
            .await
            .expect("the moved claim is current to the provider");
        assert_absent_everywhere(&mut client, &moved, &own, "no-such-id").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_expiry_ends_its_commands_proven_and_recorded() {
    // The shortest claim there is (30 s); nothing renews it.
    let r = running("expiry", 30_000).await;
    let mut client = r.client.clone();
    let status = client
        .command_status(query(&r.ctx, &r.id, 0))
        .await
        .unwrap();
    assert_eq!(status.into_inner().state, pb::CommandState::Running as i32);
    let recorded = recorded_end(&r.api, &r.env.id, &r.id).await;
    assert_ended_by_its_claim(&recorded, r.pid);
    r.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawing_the_template_from_the_claims_client_policy_ends_its_commands() {
    let r = running("policy", 300_000).await;
    security::edit_manifest(r.tmp.path(), |m| {
        m["clients"][0]
            .as_object_mut()
            .unwrap()
            .remove("executionTemplates");
    });
    security::reload(&r.dev).await;
    let recorded = recorded_end(&r.api, &r.env.id, &r.id).await;
    assert_ended_by_its_claim(&recorded, r.pid);
    r.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_ends_the_commands_of_the_environment() {
    let r = running("fence", 300_000).await;
    doctor(&r.api, &r.env.id, |s| {
        s.fence_state = Some(FenceState::FenceUnknown);
    })
    .await;
    let recorded = recorded_end(&r.api, &r.env.id, &r.id).await;
    assert_ended_by_its_claim(&recorded, r.pid);
    r.dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_over_an_expired_claim_first_ends_its_commands() {
    let mut r = running("replace", 300_000).await;
    // The claim has expired as far as the status says (the supervisor's own deadline is
    // minutes away): a replacement may take it over, once its commands are ended.
    doctor(&r.api, &r.env.id, |s| {
        // Taken for 300 s a moment ago: 301 s earlier is past.
        let run = s.active_run.as_mut().unwrap();
        let past = run.expires_at.to_system_time() - Duration::from_secs(301);
        run.expires_at = RfcTime::from_system_time(past);
    })
    .await;
    let status = r.api.get(&r.env.id).await.unwrap().status.unwrap();
    r.client
        .replace_executor(pb::ReplaceExecutorRequest {
            environment: Some(r.env.clone()),
            owner: Some(owner()),
            expected_execution_epoch: status.epoch.unwrap(),
            expected_pod_uid: status.pod.unwrap().uid,
            expected_pvc_uid: status.pvc.unwrap().uid,
            operation_id: "replace-1".into(),
        })
        .await
        .expect("admitted once the expired claim's commands ended");
    let recorded = lease(&r.api, &r.env.id, &r.id).await;
    assert_eq!(recorded["state"], "Ended", "{recorded}");
    assert_ended_by_its_claim(&recorded, r.pid);
    r.dev.stop().await.unwrap();
}

/// `execution-provider client ARGS` against `dev`, with the dev client's identity.
fn cli(
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    args: &[&str],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_execution-provider"));
    command
        .arg("client")
        .args(["--address", &addr.to_string()])
        .arg("--state-dir")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the CLI to its end; its JSON answer.
async fn cli_json(
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    args: &[&str],
) -> serde_json::Value {
    let out = cli(addr, dir, args)
        .output()
        .await
        .expect("the client runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// The next line the child prints, within `limit`.
async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    limit: Duration,
) -> String {
    tokio::time::timeout(limit, lines.next_line())
        .await
        .expect("a line within the deadline")
        .unwrap()
        .expect("a line before the end of output")
}

fn piped(
    mut command: tokio::process::Command,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the client starts");
    let stdout = child.stdout.take().unwrap();
    (child, tokio::io::BufReader::new(stdout).lines())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_detaches_lists_follows_and_kills_and_a_foreground_exec_streams() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev_unisolated(dir).await;
    let ensured = cli_json(dev.addr, dir, &["--json", "ensure", "--binding", "cli"]).await;
    let env_id = ensured["environment"]["id"].as_str().unwrap().to_owned();
    let workspace = dir.join("workspaces").join(&env_id);

    // `exec --detach` answers at once and leaves its claim held (saved for the binding).
    let loop_text = "i=0; while :; do i=$((i+1)); echo line $i; while [ ! -e next-$i ]; do sleep 0.05; done; done";
    let started = cli_json(
        dev.addr,
        dir,
        &[
            "--json",
            "exec",
            "--binding",
            "cli",
            "--detach",
            "--ttl",
            "2m",
            "--",
            loop_text,
        ],
    )
    .await;
    let id = started["commandId"].as_str().unwrap().to_owned();
    assert!(!started["grant"].as_str().unwrap().is_empty());

    // `--operation-id`: run again under the saved claim, the start answers the same command
    // and runs nothing more.
    let once = [
        "--json",
        "exec",
        "--binding",
        "cli",
        "--detach",
        "--operation-id",
        "cli-once",
        "--",
        "echo ran >> once.log",
    ];
    let first = cli_json(dev.addr, dir, &once).await;
    let again = cli_json(dev.addr, dir, &once).await;
    assert_eq!(first["commandId"], again["commandId"]);
    eventually(Duration::from_secs(30), "the command's line", || {
        let log = workspace.join("once.log");
        async move { std::fs::read_to_string(log).ok().filter(|t| !t.is_empty()) }
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(workspace.join("once.log")).unwrap(),
        "ran\n"
    );

    // `--env` and `--workdir` reach the command.
    std::fs::create_dir(workspace.join("sub")).unwrap();
    let out = cli(
        dev.addr,
        dir,
        &[
            "exec",
            "--binding",
            "cli",
            "--env",
            "GREETING=hi there",
            "--workdir",
            "sub",
            "--",
            r#"echo "$GREETING"; pwd"#,
        ],
    )
    .output()
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("hi there\n") && stdout.ends_with("/sub\n"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `ps` lists it, running, under the saved claim.
    let listed = cli_json(dev.addr, dir, &["--json", "ps", "--binding", "cli"]).await;
    let row = listed["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["commandId"] == id.as_str())
        .cloned()
        .expect("ps lists the detached command");
    assert_eq!(row["state"], "running");
    assert_eq!(row["detached"], true);

    // `logs --follow` prints each line as the loop produces it: line N+1 exists only after the
    // test let the loop go on, so every line seen came before the command's end.
    let (mut follower, mut lines) = piped(cli(
        dev.addr,
        dir,
        &["logs", "--binding", "cli", "--follow", &id],
    ));
    // A follower whose reader goes away (`logs --follow | head -1`) ends quietly at its next
    // write, with the status of a program that SIGPIPE ended.
    let (headed, mut head) = piped(cli(
        dev.addr,
        dir,
        &["logs", "--binding", "cli", "--follow", &id],
    ));
    assert_eq!(
        next_line(&mut head, Duration::from_secs(30)).await,
        "line 1"
    );
    drop(head);
    for i in 1..=3 {
        assert_eq!(
            next_line(&mut lines, Duration::from_secs(30)).await,
            format!("line {i}")
        );
        assert!(
            follower.try_wait().unwrap().is_none(),
            "logs --follow is still following"
        );
        std::fs::write(workspace.join(format!("next-{i}")), b"").unwrap();
    }
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "line 4"
    );
    let headed = tokio::time::timeout(Duration::from_secs(30), headed.wait_with_output())
        .await
        .expect("the headed follower ends at its next write")
        .unwrap();
    assert_eq!(
        headed.status.code(),
        Some(141),
        "{}",
        String::from_utf8_lossy(&headed.stderr)
    );
    assert!(
        headed.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&headed.stderr)
    );
    // Without --follow: the retained output so far, from an offset.
    let logs = cli(
        dev.addr,
        dir,
        &["logs", "--binding", "cli", "--from", "7", &id],
    )
    .output()
    .await
    .unwrap();
    assert!(logs.status.success());
    assert_eq!(
        String::from_utf8_lossy(&logs.stdout),
        "line 2\nline 3\nline 4\n"
    );

    // `kill` cancels it with a proven end and its receipt; the follower ends with it (124).
    let killed = cli_json(dev.addr, dir, &["--json", "kill", "--binding", "cli", &id]).await;
    assert_eq!(killed["state"], "cancelled");
    assert_eq!(killed["terminalReceipt"].as_str().unwrap().len(), 64);
    let followed = tokio::time::timeout(Duration::from_secs(30), follower.wait())
        .await
        .expect("the follower ends with the command")
        .unwrap();
    assert_eq!(
        followed.code(),
        Some(124),
        "a cancelled command's exit code"
    );
    let listed = cli_json(dev.addr, dir, &["--json", "ps", "--binding", "cli"]).await;
    assert!(
        listed["commands"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["commandId"] == id.as_str() && c["state"] == "cancelled")
    );

    // A foreground `exec` (reusing the saved claim) prints its first line while it still runs.
    let (mut exec, mut lines) = piped(cli(
        dev.addr,
        dir,
        &[
            "exec",
            "--binding",
            "cli",
            "--",
            "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second; exit 3",
        ],
    ));
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "first"
    );
    assert!(
        exec.try_wait().unwrap().is_none(),
        "the command has not ended"
    );
    std::fs::write(workspace.join("go"), b"").unwrap();
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "second"
    );
    let status = tokio::time::timeout(Duration::from_secs(30), exec.wait())
        .await
        .expect("exec ends with its command")
        .unwrap();
    assert_eq!(status.code(), Some(3), "exec exits with the command's code");
    // Each foreground exec under the held claim records its end: more of them than a claim's
    // 16 open commands run one after another.
    for i in 0..17 {
        let out = cli(dev.addr, dir, &["exec", "--binding", "cli", "--", "true"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "exec {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // `run release` ends the saved claim; then commands need a claim again.
    let released = cli(dev.addr, dir, &["run", "release", "--binding", "cli"])
        .output()
        .await
        .unwrap();
    assert!(
        released.status.success(),
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    let orphan = cli(dev.addr, dir, &["ps", "--binding", "cli"])
        .output()
        .await
        .unwrap();
    assert!(!orphan.status.success());
    assert!(String::from_utf8_lossy(&orphan.stderr).contains("no claim for binding cli"));
    dev.stop().await.unwrap();
}

/// A detached start of `command` on a terminal of `rows` × `cols`.
fn on_terminal(
    ctx: &pb::RequestContext,
    command: &str,
    rows: u32,
    cols: u32,
) -> pb::CommandStartRequest {
    pb::CommandStartRequest {
        pty: Some(pb::PtySize { rows, cols }),
        ..detached(ctx, command)
    }
}

fn resize(ctx: &pb::RequestContext, id: &str, rows: u32, cols: u32) -> pb::CommandResizeRequest {
    pb::CommandResizeRequest {
        context: Some(ctx.clone()),
        command_id: id.into(),
        rows,
        cols,
    }
}

/// One `AttachCommand` session driven by the test: inputs sent one by one, output collected.
struct Attached {
    inputs: tokio::sync::mpsc::Sender<pb::CommandAttachInput>,
    events: tonic::Streaming<pb::CommandOutputEvent>,
    next_offset: i64,
    output: Vec<u8>,
    end: Option<pb::CommandStatusResponse>,
}

impl Attached {
    async fn open(client: &mut Client, ctx: &pb::RequestContext, id: &str, offset: i64) -> Self {
        let (inputs, rx) = tokio::sync::mpsc::channel(16);
        let open = pb::command_attach_input::Input::Open(query(ctx, id, offset));
        inputs.send(attach_input(open)).await.unwrap();
        let events = client
            .attach_command(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("the attach opens")
            .into_inner();
        Self {
            inputs,
            events,
            next_offset: offset,
            output: Vec::new(),
            end: None,
        }
    }

    async fn send(&self, input: pb::command_attach_input::Input) {
        self.inputs.send(attach_input(input)).await.unwrap();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }

    /// The next event within 30 s; `None` once the stream has ended.
    async fn next(&mut self) -> Option<Result<(), tonic::Status>> {
        let event = tokio::time::timeout(Duration::from_secs(30), self.events.message())
            .await
            .unwrap_or_else(|_| panic!("no event within 30 s; output so far: {}", self.text()));
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => return None,
            Err(status) => return Some(Err(status)),
        };
        match event.event.unwrap() {
            pb::command_output_event::Event::Chunk(chunk) => {
                assert_eq!(
                    chunk.stream,
                    pb::OutputStream::Pty as i32,
                    "terminal output"
                );
                assert_eq!(chunk.offset, self.next_offset, "contiguous and in order");
                self.next_offset += chunk.data.len() as i64;
                self.output.extend_from_slice(&chunk.data);
            }
            pb::command_output_event::Event::End(end) => self.end = Some(end),
            pb::command_output_event::Event::DroppedBytes(n) => panic!("dropped {n}"),
        }
        Some(Ok(()))
    }

    /// Reads output until it contains `text`.
    async fn until(&mut self, text: &str) {
        while !self.text().contains(text) {
            assert!(
                self.end.is_none(),
                "ended without {text:?}: {}",
                self.text()
            );
            self.next()
                .await
                .expect("the stream is open")
                .expect("no error");
        }
    }

    /// Reads to the command's end.
    async fn end(&mut self) -> pb::CommandStatusResponse {
        while self.end.is_none() {
            self.next()
                .await
                .expect("the stream is open")
                .expect("no error");
        }
        assert!(self.next().await.is_none(), "the end is the last event");
        self.end.clone().unwrap()
    }

    /// The error the stream ends with.
    async fn refusal(&mut self) -> tonic::Status {
        loop {
            match self.next().await.expect("the stream ends with an error") {
                Ok(()) => assert!(self.end.is_none(), "ended without an error"),
                Err(status) => return status,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_commands_resize_attach_and_refuse_with_their_codes() {
    use pb::command_attach_input::Input;
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "pty").await.environment.unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let version = || async { api.get(&env.id).await.unwrap().metadata.resource_version };
    let claim = acquire(&mut client, "pty", &env).await;
    let ctx = context("pty", &claim);

    // A terminal command: `tty` names a pseudo-terminal, `stty size` the start size; its
    // output is one terminal stream (newlines as the line discipline writes them).
    let id = start(&mut client, on_terminal(&ctx, "tty; stty size", 24, 80)).await;
    let end = ended(&mut client, &ctx, &id).await;
    assert_eq!(end.state, pb::CommandState::Succeeded as i32);
    let text = String::from_utf8_lossy(&end.stdout).into_owned();
    assert!(text.starts_with("/dev/pts/"), "{text:?}");
    assert!(text.ends_with("\r\n24 80\r\n"), "{text:?}");
    assert!(
        end.chunks
            .iter()
            .all(|c| c.stream == pb::OutputStream::Pty as i32)
    );
    assert_eq!(end.terminal_receipt.len(), 64);

    // ResizeCommand: `stty size` after the resize sees it; neither the resize nor the
    // keystroke writes the environment.
    let sized = start(
        &mut client,
        on_terminal(&ctx, "stty size; read -r line; stty size", 24, 80),
    )
    .await;
    eventually(Duration::from_secs(30), "the start size", || {
        let mut client = client.clone();
        let request = query(&ctx, &sized, 0);
        async move {
            let status = client.command_status(request).await.unwrap().into_inner();
            String::from_utf8_lossy(&status.stdout)
                .contains("24 80")
                .then_some(())
        }
    })
    .await;
    let before = version().await;
    client
        .resize_command(resize(&ctx, &sized, 40, 120))
        .await
        .expect("the terminal is resized");
    client
        .write_command_stdin(pb::CommandStdinRequest {
            context: Some(ctx.clone()),
            command_id: sized.clone(),
            data: b"\n".to_vec(),
            close: false,
        })
        .await
        .unwrap();
    assert_eq!(
        version().await,
        before,
        "a resize and a keystroke write nothing"
    );
    let end = ended(&mut client, &ctx, &sized).await;
    let text = String::from_utf8_lossy(&end.stdout).into_owned();
    assert!(text.ends_with("24 80\r\n\r\n40 120\r\n"), "{text:?}");

    // AttachCommand: a resize and a typed line reach the command, then a typed ^C is SIGINT
    // to the terminal's foreground job (its trap exits 5); the session ends with the status.
    let script = "read -r line; echo \"got:$line\"; stty size; \
                  trap 'echo caught-int; exit 5' INT; echo armed; while :; do sleep 0.05; done";
    let shell = start(&mut client, on_terminal(&ctx, script, 24, 80)).await;
    let before = version().await;
    let mut attached = Attached::open(&mut client, &ctx, &shell, 0).await;
    attached
        .send(Input::Resize(pb::PtySize {
            rows: 30,
            cols: 100,
        }))
        .await;
    attached.send(Input::Stdin(b"hello\n".to_vec())).await;
    attached.until("got:hello\r\n30 100\r\n").await;
    attached.until("armed").await;
    attached.send(Input::Stdin(vec![0x03])).await;
    let end = attached.end().await;
    assert_eq!(
        (end.state, end.exit_code),
        (pb::CommandState::Failed as i32, 5),
        "{}",
        attached.text()
    );
    assert!(
        attached.text().contains("caught-int"),
        "{}",
        attached.text()
    );
    assert_eq!(end.next_offset, attached.next_offset);
    assert_eq!(end.terminal_receipt.len(), 64);
    assert_eq!(version().await, before, "an attach writes nothing");
    // An attach resumes at an offset: an ended command's output from there, then its end.
    let mut again = Attached::open(&mut client, &ctx, &shell, 4).await;
    let replayed = again.end().await;
    assert_eq!(again.output, attached.output[4..]);
    assert_eq!(replayed.terminal_receipt, end.terminal_receipt);

    // Refusals, each with its code, none writing anything.
    let plain = start(&mut client, detached(&ctx, "sleep 600")).await;
    let settled = version().await;
    for (rows, cols) in [(0, 80), (24, 0), (1001, 80), (24, 1001)] {
        let refused = client
            .start_command(on_terminal(&ctx, "true", rows, cols))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{rows}x{cols}");
        let refused = client
            .resize_command(resize(&ctx, &plain, rows, cols))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{rows}x{cols}");
    }
    let no_terminal = client
        .resize_command(resize(&ctx, &plain, 30, 100))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&no_terminal),
        (Code::FailedPrecondition, "command_ended".into())
    );
    let after_end = client
        .resize_command(resize(&ctx, &id, 30, 100))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&after_end),
        (Code::FailedPrecondition, "command_ended".into())
    );
    let unknown = client
        .resize_command(resize(&ctx, "no-such-id", 30, 100))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&unknown),
        (Code::NotFound, "command_not_found".into())
    );
    let not_opened = client
        .attach_command(futures::stream::iter([attach_input(Input::Stdin(
            b"x".to_vec(),
        ))]))
        .await
        .unwrap_err();
    assert_eq!(not_opened.code(), Code::InvalidArgument);
    assert_eq!(
        version().await,
        settled,
        "refused starts and resizes write nothing"
    );
    let waiting = start(&mut client, on_terminal(&ctx, "read -r line", 24, 80)).await;
    let bad_inputs = [
        Input::Resize(pb::PtySize { rows: 0, cols: 80 }),
        Input::Resize(pb::PtySize {
            rows: 24,
            cols: 1001,
        }),
        Input::Stdin(vec![b'x'; 64 * 1024 + 1]),
        Input::Signal(pb::CommandSignal::Unspecified as i32),
        Input::Open(query(&ctx, &waiting, 0)),
    ];
    let settled_again = version().await;
    for bad in bad_inputs {
        let shown = format!("{bad:?}").chars().take(60).collect::<String>();
        let mut attached = Attached::open(&mut client, &ctx, &waiting, 0).await;
        attached.send(bad).await;
        let refused = attached.refusal().await;
        assert_eq!(refused.code(), Code::InvalidArgument, "{shown}");
    }
    assert_eq!(
        version().await,
        settled_again,
        "refused inputs write nothing"
    );
    let status = client
        .command_status(query(&ctx, &waiting, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.state,
        pb::CommandState::Running as i32,
        "no refused input reached the command"
    );
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shell_runs_piped_input_on_a_terminal() {
    use tokio::io::AsyncWriteExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev_unisolated(dir).await;
    cli_json(dev.addr, dir, &["--json", "ensure", "--binding", "sh"]).await;
    let shell = |input: &'static [u8]| {
        let mut command = cli(dev.addr, dir, &["shell", "--binding", "sh"]);
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        async move {
            let mut child = command.spawn().expect("the client starts");
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input).await.unwrap();
            drop(stdin);
            tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
                .await
                .expect("the shell ends")
                .unwrap()
        }
    };

    // Without a claim: `shell` takes one, runs `/bin/sh -i` on a terminal fed by the piped
    // input, exits with the shell's code, and releases the claim it took.
    let out = shell(b"tty\necho sum-$((6*7))\nexit 3\n").await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/dev/pts/"), "{stdout}");
    assert!(stdout.contains("sum-42\r\n"), "{stdout}");
    let none = cli(dev.addr, dir, &["ps", "--binding", "sh"])
        .output()
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no claim for binding sh"),
        "the shell's own claim is released and forgotten"
    );

    // Under a held claim (`run acquire` saved it): the shell reuses it, leaves it held, and
    // its end is recorded; the end of input is end-of-file for the shell.
    cli_json(
        dev.addr,
        dir,
        &["--json", "run", "acquire", "--binding", "sh", "--ttl", "2m"],
    )
    .await;
    let out = shell(b"echo he''ld\n").await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("held\r\n"), "{stdout}");
    let listed = cli_json(dev.addr, dir, &["--json", "ps", "--binding", "sh"]).await;
    let commands = listed["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 1, "{listed}");
    assert_eq!(commands[0]["state"], "succeeded", "{listed}");
    dev.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_attach_sessions_hold_stream_slots_not_unary_ones() {
    use pb::command_attach_input::Input;
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "slots")
        .await
        .environment
        .unwrap();
    let claim = acquire(&mut client, "slots", &env).await;
    let ctx = context("slots", &claim);

    // 40 live sessions (8 on each of 5 terminal commands, the supervisor's bound per command):
    // more than the unary limiter's 32 per client. A session holding a unary slot would make
    // the 33rd open, and any unary call while they are open, RESOURCE_EXHAUSTED.
    let mut ids = Vec::new();
    for _ in 0..5 {
        let script = "read -r line; echo \"done-$line\"";
        ids.push(start(&mut client, on_terminal(&ctx, script, 24, 80)).await);
    }
    let mut sessions = Vec::new();
    for i in 0..40 {
        sessions.push(Attached::open(&mut client, &ctx, &ids[i % 5], 0).await);
    }
    client
        .command_status(query(&ctx, &ids[0], 0))
        .await
        .expect("a unary call is admitted while the sessions are open");
    // Every session is live: a line typed through the first session of each command ends it,
    // and all 40 see its output and its end.
    for (i, session) in sessions.iter().take(5).enumerate() {
        session
            .send(Input::Stdin(format!("{i}\n").into_bytes()))
            .await;
    }
    for (i, session) in sessions.iter_mut().enumerate() {
        let end = session.end().await;
        assert_eq!(end.state, pb::CommandState::Succeeded as i32);
        let expected = format!("done-{}\r\n", i % 5);
        assert!(session.text().contains(&expected), "{}", session.text());
    }
    dev.stop().await.unwrap();
}

/// A detached start under a client operation id is done at most once per claim: retried (its
/// answer lost, say) it answers the same command, even after that command ended, and writes no
/// second lease; the same id with another request is refused `conflict` and runs nothing; a
/// later claim's start under the same id is a new command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_replayed_under_its_operation_id_answers_its_command_and_starts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "replay")
        .await
        .environment
        .unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let claim = acquire(&mut client, "replay", &env).await;
    let ctx = context("replay", &claim);
    let request = pb::CommandStartRequest {
        operation_id: "start-1".into(),
        ..detached(&ctx, "echo started >> log; exec sleep 600")
    };
    let first = start(&mut client, request.clone()).await;
    let again = start(&mut client, request.clone()).await;
    assert_eq!(
        again, first,
        "the replay answers the command the start began"
    );
    let leases = |o: ExecutionEnvironment| o.status.unwrap().commands.len();
    assert_eq!(leases(api.get(&env.id).await.unwrap()), 1, "one lease");

    let other = pb::CommandStartRequest {
        command: "echo other >> log".into(),
        ..request.clone()
    };
    let refused = client.start_command(other).await.unwrap_err();
    assert_eq!(code_of(&refused), (Code::Aborted, "conflict".into()));
    assert_eq!(leases(api.get(&env.id).await.unwrap()), 1);

    let mut cancel = query(&ctx, &first, 0);
    cancel.grace_millis = 200;
    client.cancel_command(cancel).await.unwrap();
    let replayed = client
        .start_command(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.command_id, first);
    assert_eq!(replayed.state, pb::CommandState::Cancelled as i32);
    let log = std::fs::read_to_string(tmp.path().join("workspaces").join(&env.id).join("log"));
    assert_eq!(log.unwrap(), "started\n", "exactly one command ran");

    release(&mut client, "replay", &env, &claim).await;
    let next = acquire_second(&mut client, "replay", &env).await;
    let later = pb::CommandStartRequest {
        operation_id: "start-1".into(),
        ..detached(&context("replay", &next), "true")
    };
    let fresh = start(&mut client, later).await;
    assert_ne!(fresh, first, "another claim's start is another command");
    dev.stop().await.unwrap();
}

/// A foreground start with what the one-shot helper cannot take runs through the supervisor
/// on the same call: variables and a working directory, a terminal, a client operation id
/// (replayed: the same command and output, run once), a timeout; its end is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_start_with_supervisor_options_runs_on_the_call_and_records_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev_unisolated(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "fg").await.environment.unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let claim = acquire(&mut client, "fg", &env).await;
    let ctx = context("fg", &claim);
    let workspace = tmp.path().join("workspaces").join(&env.id);
    std::fs::create_dir(workspace.join("sub")).unwrap();
    let foreground = |command: &str| pb::CommandStartRequest {
        context: Some(ctx.clone()),
        command: command.into(),
        ..Default::default()
    };

    // Variables and a working directory: stdout and stderr apart, the exit code, a receipt.
    let answer = client
        .start_command(pb::CommandStartRequest {
            env: vec![pb::CommandEnvVar {
                name: "GREETING".into(),
                value: "hello there".into(),
            }],
            working_directory: "sub".into(),
            ..foreground(r#"echo "$GREETING"; pwd; echo oops >&2; exit 3"#)
        })
        .await
        .unwrap()
        .into_inner();
    let result = answer.result.unwrap();
    assert_eq!(
        (answer.state, result.exit_code, result.detached),
        (pb::CommandState::Failed as i32, 3, false)
    );
    let stdout = String::from_utf8(result.stdout).unwrap();
    assert!(
        stdout.starts_with("hello there\n") && stdout.ends_with("/sub\n"),
        "{stdout}"
    );
    assert_eq!(result.stderr, b"oops\n");
    assert_eq!(result.terminal_receipt.len(), 64);
    let recorded = lease(&api, &env.id, &answer.command_id).await;
    assert_eq!(
        (
            &recorded["state"],
            &recorded["detached"],
            &recorded["outcome"]["reason"],
            &recorded["outcome"]["exitCode"]
        ),
        (
            &serde_json::json!("Ended"),
            &serde_json::json!(false),
            &serde_json::json!("Exited"),
            &serde_json::json!(3)
        ),
        "{recorded}"
    );

    // A terminal of the asked size: its output is one `pty` stream, answered as stdout.
    let answer = client
        .start_command(pb::CommandStartRequest {
            pty: Some(pb::PtySize {
                rows: 30,
                cols: 100,
            }),
            ..foreground("stty size; tty")
        })
        .await
        .unwrap()
        .into_inner();
    let result = answer.result.unwrap();
    let text = String::from_utf8_lossy(&result.stdout);
    assert!(
        text.contains("30 100") && text.contains("/dev/pts/"),
        "{text}"
    );
    assert!(
        !result.chunks.is_empty()
            && result
                .chunks
                .iter()
                .all(|c| c.stream == pb::OutputStream::Pty as i32)
    );

    // An operation id: a replay answers the same command and output, and it ran once.
    let once = pb::CommandStartRequest {
        operation_id: "fg-op-1".into(),
        ..foreground("echo ran >> once.log; echo done")
    };
    let first = client
        .start_command(once.clone())
        .await
        .unwrap()
        .into_inner();
    let again = client
        .start_command(once.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.command_id, again.command_id);
    assert_eq!(again.result.unwrap().stdout, b"done\n");
    assert_eq!(
        std::fs::read_to_string(workspace.join("once.log")).unwrap(),
        "ran\n"
    );
    let other = pb::CommandStartRequest {
        command: "echo other".into(),
        ..once
    };
    let refused = client.start_command(other).await.unwrap_err();
    assert_eq!(code_of(&refused), (Code::Aborted, "conflict".into()));

    // Its own timeout ends it (the template's longest command when 0).
    let timed = client
        .start_command(pb::CommandStartRequest {
            timeout_millis: 300,
            working_directory: "sub".into(),
            ..foreground("sleep 30")
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(timed.state, pb::CommandState::Succeeded as i32);
    assert_ne!(timed.state, pb::CommandState::Running as i32);
    common::release(&mut client, "fg", &env, &claim).await;
    dev.stop().await.unwrap();
}
