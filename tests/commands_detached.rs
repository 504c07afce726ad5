//! Detached commands end to end in `dev` (docs/commands.md §5, §6, §7): a start writes one
//! lease and answers at once; status, follow, stdin, signals and listing go to the supervisor
//! and write nothing; cancel records its proven end; 16 run at once and the 17th is refused;
//! a claim's release ends its commands (their processes gone) and records every outcome; a
//! later claim, an ended claim and a foreign caller see what an absent command looks like.
//!
//! `dev` runs here with `--unsafe-no-isolation`: a sandboxed `dev` has no supervisor yet
//! (tests/command_control.rs covers that it then refuses a detach without running it).

mod common;

use std::time::Duration;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::DEV_NAMESPACE;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::server::status::error_detail;
use kube::api::Api;
use tonic::Code;

fn code_of(status: &tonic::Status) -> (Code, String) {
    (
        status.code(),
        error_detail(status).map(|d| d.code).unwrap_or_default(),
    )
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
    let next = client
        .acquire_run(pb::AcquireRunRequest {
            environment: Some(env.clone()),
            owner: Some(owner()),
            binding_id: "many".into(),
            run_id: "run-2".into(),
            operation_id: "acquire-2".into(),
            ttl_millis: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    let later = context("many", &next);
    let absent = (Code::NotFound, "command_not_found".to_owned());
    let status = client
        .command_status(query(&later, &ids[0], 0))
        .await
        .unwrap_err();
    assert_eq!(code_of(&status), absent);
    let cancel = client
        .cancel_command(query(&later, &ids[1], 0))
        .await
        .unwrap_err();
    assert_eq!(code_of(&cancel), absent);
    let unknown = client
        .command_status(query(&later, "no-such-id", 0))
        .await
        .unwrap_err();
    assert_eq!(code_of(&unknown), absent);
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
        issuer: "https://issuer.test".into(),
        subject: "mallory".into(),
    });
    let foreign = client
        .command_status(query(&foreign, &ids[0], 0))
        .await
        .unwrap_err();
    assert!(
        matches!(foreign.code(), Code::NotFound | Code::PermissionDenied),
        "{foreign:?}"
    );
}
