//! The command-control RPCs of docs/commands.md §6 where the executor has no supervisor (a
//! sandboxed `dev`): each is authorized read-only (a stale claim is refused as for any
//! data-plane call), a malformed request is INVALID_ARGUMENT, an id the claim never started is
//! NOT_FOUND `command_not_found` (a resize and an attach too); none writes the environment or
//! runs anything. A start asking the foreground path for variables, a working directory, stdin
//! or a PTY is refused UNIMPLEMENTED rather than run without them. tests/commands_detached.rs covers `dev` with supervisors.

mod common;

use common::*;
use execution_provider::api::pb;
use execution_provider::cli::dev::DEV_NAMESPACE;
use execution_provider::kube::crd::ExecutionEnvironment;
use execution_provider::server::status::error_detail;
use kube::api::Api;
use tonic::Code;

/// The code and `ErrorDetail.code` of a refusal; `(Ok, "")` for an answer.
fn outcome<T>(answer: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match answer {
        Ok(_) => (Code::Ok, String::new()),
        Err(s) => (
            s.code(),
            error_detail(&s).map(|d| d.code).unwrap_or_default(),
        ),
    }
}

fn query(ctx: &pb::RequestContext, command_id: &str) -> pb::CommandQueryRequest {
    pb::CommandQueryRequest {
        context: Some(ctx.clone()),
        command_id: command_id.into(),
        ..Default::default()
    }
}

/// What each new RPC answers with `ctx`, in a fixed order; `bad` makes each request
/// malformed in its own way.
async fn control_answers(
    client: &mut Client,
    ctx: &pb::RequestContext,
    bad: bool,
) -> Vec<(Code, String)> {
    let id = if bad { "no/slash" } else { "cmd-1" };
    let mut out = Vec::new();
    out.push(outcome(client.follow_command(query(ctx, id)).await));
    let data = if bad {
        vec![b'x'; 64 * 1024 + 1]
    } else {
        b"hi".to_vec()
    };
    let stdin = pb::CommandStdinRequest {
        context: Some(ctx.clone()),
        command_id: "cmd-1".into(),
        data,
        close: false,
    };
    out.push(outcome(client.write_command_stdin(stdin).await));
    let signal = if bad {
        pb::CommandSignal::Unspecified
    } else {
        pb::CommandSignal::Term
    };
    let signal = pb::CommandSignalRequest {
        context: Some(ctx.clone()),
        command_id: "cmd-1".into(),
        signal: signal as i32,
    };
    out.push(outcome(client.signal_command(signal).await));
    let resize = pb::CommandResizeRequest {
        context: Some(ctx.clone()),
        command_id: "cmd-1".into(),
        rows: if bad { 0 } else { 24 },
        cols: 80,
    };
    out.push(outcome(client.resize_command(resize).await));
    let list = pb::ListCommandsRequest {
        context: Some(ctx.clone()),
        limit: if bad { 65 } else { 0 },
    };
    out.push(outcome(client.list_commands(list).await));
    let open = pb::CommandAttachInput {
        input: Some(pb::command_attach_input::Input::Open(query(ctx, id))),
    };
    out.push(outcome(
        client.attach_command(futures::stream::iter([open])).await,
    ));
    out
}

fn start(ctx: &pb::RequestContext, command: &str) -> pb::CommandStartRequest {
    pb::CommandStartRequest {
        context: Some(ctx.clone()),
        command: command.into(),
        ..Default::default()
    }
}

/// Whether `path` exists in the workspace, asked through a file stat.
async fn exists(client: &mut Client, ctx: &pb::RequestContext, path: &str) -> bool {
    let stat = client
        .files(pb::FileRequest {
            context: Some(ctx.clone()),
            operation: pb::FileOperation::Stat as i32,
            path: path.into(),
            ..pb::FileRequest::default()
        })
        .await;
    match stat {
        Ok(_) => true,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("stat {path}: {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_control_is_authorized_read_only_and_refuses_what_this_executor_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = start_dev(tmp.path()).await;
    let mut client = connect(dev.addr, tmp.path(), Some(&dev_identity(tmp.path()))).await;
    let env = ensure_ready(&mut client, "ctl").await.environment.unwrap();
    let api: Api<ExecutionEnvironment> = Api::namespaced(dev.kube.clone(), DEV_NAMESPACE);
    let claim = acquire(&mut client, "ctl", &env).await;
    let ctx = context("ctl", &claim);
    let version = || async { api.get(&env.id).await.unwrap().metadata.resource_version };
    let before = version().await;

    let unimplemented = (Code::Unimplemented, "unimplemented".to_owned());
    let invalid = (Code::InvalidArgument, "invalid_argument".to_owned());
    let absent = (Code::NotFound, "command_not_found".to_owned());
    let ok = (Code::Ok, String::new());
    // Follow, stdin, signal, resize and attach of an id this claim never started: absent; an
    // empty list.
    assert_eq!(
        control_answers(&mut client, &ctx, false).await,
        vec![
            absent.clone(),
            absent.clone(),
            absent.clone(),
            absent.clone(),
            ok,
            absent
        ]
    );
    assert_eq!(
        control_answers(&mut client, &ctx, true).await,
        vec![invalid.clone(); 6]
    );

    // A foreground start with an open stdin (nobody could write to it before its answer):
    // refused, nothing ran.
    let mut with_stdin = start(&ctx, "touch ran-stdin");
    with_stdin.open_stdin = true;
    assert_eq!(
        outcome(client.start_command(with_stdin).await),
        unimplemented
    );
    let mut bad_name = start(&ctx, "touch ran-bad");
    bad_name.env.push(pb::CommandEnvVar {
        name: "1X".into(),
        value: String::new(),
    });
    let mut escape = start(&ctx, "touch ran-bad");
    escape.working_directory = "a/../../etc".into();
    let mut absolute = start(&ctx, "touch ran-bad");
    absolute.working_directory = "/etc".into();
    let mut huge_pty = start(&ctx, "touch ran-bad");
    huge_pty.pty = Some(pb::PtySize {
        rows: 1001,
        cols: 80,
    });
    for request in [bad_name, escape, absolute, huge_pty] {
        assert_eq!(outcome(client.start_command(request).await), invalid);
    }
    assert_eq!(version().await, before, "no refusal wrote the environment");
    for marker in ["ran-stdin", "ran-bad"] {
        assert!(
            !exists(&mut client, &ctx, marker).await,
            "{marker} must not have run"
        );
    }
    // The foreground default still runs.
    let ran = client
        .start_command(start(&ctx, "touch ran-foreground"))
        .await
        .unwrap();
    assert_eq!(ran.into_inner().state, pb::CommandState::Succeeded as i32);
    assert!(exists(&mut client, &ctx, "ran-foreground").await);
    // So does a foreground start with variables, through the sandbox's supervisor.
    let mut with_env = start(&ctx, r#"test "$TOKEN" = secret-value && touch ran-env"#);
    with_env.env.push(pb::CommandEnvVar {
        name: "TOKEN".into(),
        value: "secret-value".into(),
    });
    let ran = client.start_command(with_env).await.unwrap().into_inner();
    assert_eq!(ran.state, pb::CommandState::Succeeded as i32);
    assert!(exists(&mut client, &ctx, "ran-env").await);

    // A released claim is refused before any shape check, like every data-plane call.
    common::release(&mut client, "ctl", &env, &claim).await;
    let released = version().await;
    for bad in [false, true] {
        let answers = control_answers(&mut client, &ctx, bad).await;
        assert!(
            answers.iter().all(|a| a.0 != Code::Unimplemented
                && a.0 != Code::InvalidArgument
                && a.0 != Code::Ok),
            "{answers:?}"
        );
    }
    assert_eq!(version().await, released, "a refused call writes nothing");
}
