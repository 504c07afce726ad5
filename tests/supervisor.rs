//! The executor supervisor (docs/commands.md), a real `execution-helper supervise` process per
//! test: detached commands, output offsets, stdin, signals, cancel with proven end under
//! per-command sub-reapers, claim deadlines, bounds, the journal, and the channel's
//! authentication.

mod supervisor_support;

use std::time::Duration;

use execution_provider::executor::protocol::{CommandState, ErrorCode};
use execution_provider::executor::supervisor_client::ClientError;
use execution_provider::executor::supervisor_protocol::{
    Binding, Direction, Hello, MAX_FRAME, StartRequest, SupervisorReply, SupervisorRequest,
    TAG_LEN, command_receipt, derive_secret, read_frame, write_frame,
};
use supervisor_support::*;

supervisor_cases!(Supervised::enrolled());

/// A list cut at its limit keeps the running commands, then the most recent ends: what a
/// status write recording the ends it has not seen yet needs (docs/commands.md §5.6).
#[tokio::test]
async fn a_list_gives_running_commands_then_the_latest_ends_first() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    for id in ["op-first", "op-second", "op-third"] {
        s.start_command(id, &c, "true").await;
        s.ended(id).await;
        // Ends at distinct milliseconds, so that their order is theirs.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.start_command("op-running", &c, "exec sleep 600").await;
    let listed = |limit| {
        s.call(SupervisorRequest::List {
            claim: c.clone(),
            limit,
        })
    };
    let SupervisorReply::StatusList { commands } = listed(3).await else {
        panic!("list refused")
    };
    let ids: Vec<&str> = commands.iter().map(|v| v.command_id.as_str()).collect();
    assert_eq!(ids, ["op-running", "op-third", "op-second"]);
    let SupervisorReply::StatusList { commands } = listed(0).await else {
        panic!("list refused")
    };
    assert_eq!(commands.len(), 4);
}

#[tokio::test]
async fn the_journal_keeps_receipts_and_a_sealed_id_can_never_start() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command("op-done", &c, "echo hi").await;
    let entry = s.ended("op-done").await;
    assert_eq!(entry.state, CommandState::Succeeded);
    assert_eq!(
        entry.terminal_receipt,
        command_receipt("op-done", CommandState::Succeeded, 0, b"hi\n", b"")
    );
    // A replayed start answers the same command without starting it again.
    let again = s.start_command("op-done", &c, "echo hi").await;
    assert_eq!(again.state, CommandState::Succeeded);
    assert_eq!(again.next_offset, 3);
    assert_eq!(s.journal("op-lost", false).await, None);
    let sealed = s.journal("op-lost", true).await.unwrap();
    assert!(sealed.never_started);
    let error = error_of(
        s.call(SupervisorRequest::Start(start_request(
            "op-lost",
            &c,
            "echo late",
        )))
        .await,
    );
    assert_eq!(error.code, ErrorCode::Conflict);
}

#[tokio::test]
async fn only_the_enrolled_secret_is_heard_and_before_enrollment_only_enroll() {
    let s = Supervised::start().await;
    let c = claim("a");
    // Before enrollment nothing else is accepted.
    let mut early = s.connect().await;
    assert_eq!(early.hello().secret_id, "");
    let err = early
        .call(&SupervisorRequest::Journal {
            command_id: "x".into(),
            seal: false,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Untagged(Some(ref e)) if e.code == ErrorCode::Unauthenticated),
        "{err}"
    );
    let mut first = s.connect().await;
    assert!(matches!(
        first.enroll().await.unwrap(),
        SupervisorReply::Enrolled { .. }
    ));
    // The same secret again is fine (a lost answer can be retried); another one is not.
    let mut again = s.connect().await;
    assert!(again.enrolled_with_our_secret());
    assert!(matches!(
        again.enroll().await.unwrap(),
        SupervisorReply::Enrolled { .. }
    ));
    let intruder_secret = derive_secret(b"another key", "ns", "executor-test", "uid-1");
    let mut intruder = s.connect_with(intruder_secret).await;
    assert!(!intruder.enrolled_with_our_secret());
    let err = intruder.enroll().await.unwrap_err();
    assert!(matches!(err, ClientError::Untagged(_)), "{err}");
    s.start_command("op-secret", &c, "echo private").await;
    let mut intruder = s.connect_with(intruder_secret).await;
    let err = intruder
        .call(&SupervisorRequest::Status {
            command_id: "op-secret".into(),
            claim: c.clone(),
            offset: 0,
            max_bytes: 0,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Untagged(Some(ref e)) if e.code == ErrorCode::Unauthenticated),
        "{err}"
    );
}

#[tokio::test]
async fn a_request_replayed_on_another_connection_or_at_another_index_is_refused() {
    let s = Supervised::enrolled().await;
    let body = serde_json::to_vec(&SupervisorRequest::Journal {
        command_id: "op-x".into(),
        seal: true,
    })
    .unwrap();
    // Connection A: a valid request at index 0.
    let mut a = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
    let hello_a: Hello =
        serde_json::from_slice(&read_frame(&mut a, MAX_FRAME).await.unwrap().unwrap()).unwrap();
    let tag_a = Binding::of(&hello_a)
        .unwrap()
        .tag(&secret(), Direction::Request, 0, &body);
    // Replayed on connection B (another nonce): refused untagged.
    let mut b = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
    read_frame(&mut b, MAX_FRAME).await.unwrap().unwrap();
    write_frame(&mut b, &[&tag_a, &body]).await.unwrap();
    let reply = read_frame(&mut b, MAX_FRAME).await.unwrap().unwrap();
    assert_eq!(&reply[..TAG_LEN], &[0u8; TAG_LEN]);
    assert!(
        read_frame(&mut b, MAX_FRAME).await.unwrap().is_none(),
        "then closed"
    );
    // On A it is accepted once; the same frame again (index 1) is refused.
    write_frame(&mut a, &[&tag_a, &body]).await.unwrap();
    let reply = read_frame(&mut a, MAX_FRAME).await.unwrap().unwrap();
    assert_ne!(&reply[..TAG_LEN], &[0u8; TAG_LEN]);
    write_frame(&mut a, &[&tag_a, &body]).await.unwrap();
    let reply = read_frame(&mut a, MAX_FRAME).await.unwrap().unwrap();
    assert_eq!(&reply[..TAG_LEN], &[0u8; TAG_LEN]);
}

#[tokio::test]
async fn the_relay_carries_the_channel_end_to_end_over_its_stdin_and_stdout() {
    use tokio::io::AsyncWriteExt as _;
    let s = Supervised::enrolled().await;
    let mut relay = tokio::process::Command::new(env!("CARGO_BIN_EXE_execution-helper"))
        .arg("--supervisor-socket")
        .arg(&s.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = relay.stdin.take().unwrap();
    stdin
        .write_all(b"{\"relay\":\"supervisor/v1\"}\n")
        .await
        .unwrap();
    let stdout = relay.stdout.take().unwrap();
    let mut connection =
        execution_provider::executor::supervisor_client::SupervisorConnection::open(
            stdout,
            stdin,
            secret(),
        )
        .await
        .unwrap();
    let c = claim("a");
    let reply = connection
        .call(&SupervisorRequest::Start(start_request(
            "op-relayed",
            &c,
            "echo via relay",
        )))
        .await
        .unwrap();
    assert!(matches!(reply, SupervisorReply::Status(_)), "{reply:?}");
    let followed = s.follow("op-relayed", &c, 0).await;
    assert_eq!(followed.stdout, b"via relay\n");
    drop(connection);
    let status = tokio::time::timeout(Duration::from_secs(20), relay.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn sigterm_ends_every_command_and_exits_zero_only_once_no_process_is_left() {
    let mut s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command(
        "op-escape",
        &c,
        "(setsid sh -c 'echo $$ > escapee.pid; exec sleep 1000' &); exec sleep 1000",
    )
    .await;
    s.start_command(
        "op-trap",
        &c,
        "trap '' TERM; echo $$ > trap.pid; while :; do sleep 0.05; done",
    )
    .await;
    let escapee = s.pid_file("escapee.pid").await;
    let trapping = s.pid_file("trap.pid").await;
    assert!(alive(escapee) && alive(trapping));
    let pid = s.child.id().expect("running") as i32;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), s.child.wait())
        .await
        .expect("the supervisor stops within its grace and sweep")
        .unwrap();
    assert_eq!(status.code(), Some(0), "a proven stop exits 0");
    assert!(!alive(escapee), "the setsid escapee is gone");
    assert!(!alive(trapping), "the command ignoring SIGTERM is gone");
}

/// Sends a one-shot helper `request` as a `call` journaled under `operation_id`; the
/// connection is left with the call running.
async fn begin_call(
    s: &Supervised,
    operation_id: &str,
    request: &execution_provider::executor::protocol::ExecutorRequest,
    hold_stdin: bool,
) -> Connection {
    let body = serde_json::to_vec(request).unwrap();
    let mut connection = s.connect().await;
    connection
        .send(&SupervisorRequest::Call {
            request_bytes: body.len() as u64,
            hold_stdin,
            operation_id: Some(operation_id.to_owned()),
        })
        .await
        .unwrap();
    connection
        .send(&SupervisorRequest::CallInput { data: body })
        .await
        .unwrap();
    connection
}

/// The helper's answer and exit status of a call.
async fn call_answer(connection: &mut Connection) -> (Vec<u8>, i32) {
    let mut answer = Vec::new();
    loop {
        match connection.next_reply().await.unwrap() {
            Some(SupervisorReply::CallOutput { data }) => answer.extend_from_slice(&data),
            Some(SupervisorReply::CallEnded { exit_code, .. }) => return (answer, exit_code),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_call_under_an_operation_id_is_journaled_running_then_with_its_receipt() {
    use execution_provider::executor::protocol::{ExecutorRequest, Operation};
    use execution_provider::executor::supervisor_protocol::operation_receipt;
    let s = Supervised::enrolled().await;
    std::fs::write(s.workspace.join("f.txt"), b"hello").unwrap();
    let stat = ExecutorRequest::at(Operation::FileStat, "f.txt");
    let mut call = begin_call(&s, "op-stat", &stat, false).await;
    let (answer, exit_code) = call_answer(&mut call).await;
    assert_eq!(exit_code, 0);
    let entry = s.journal("op-stat", false).await.expect("journaled");
    assert_eq!((entry.state, entry.proven), (CommandState::Succeeded, true));
    assert_eq!(
        entry.terminal_receipt,
        operation_receipt("op-stat", CommandState::Succeeded, &answer)
    );
    // The id is used: a second call under it is refused before anything runs.
    let mut again = begin_call(&s, "op-stat", &stat, false).await;
    let error = error_of(again.next_reply().await.unwrap().unwrap());
    assert_eq!(error.code, ErrorCode::Conflict);

    // A foreground command runs: the journal says so; cancelling the call ends it, proven.
    let sleep = ExecutorRequest::command("cmd-1", "sleep 60");
    let _running = begin_call(&s, "op-sleep", &sleep, true).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while s.journal("op-sleep", false).await.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never journaled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = s.journal("op-sleep", false).await.unwrap();
    assert_eq!(
        (running.state, running.proven),
        (CommandState::Running, false)
    );
    let reply = s
        .call(SupervisorRequest::CancelCall {
            operation_id: "op-sleep".into(),
            grace_ms: 2_000,
        })
        .await;
    let SupervisorReply::Journal { entry: Some(ended) } = reply else {
        panic!("{reply:?}");
    };
    assert_eq!((ended.state, ended.proven), (CommandState::Cancelled, true));
    assert_eq!(ended.terminal_receipt.len(), 64);
    assert_eq!(s.journal("op-sleep", false).await, Some(ended));
    // An unknown id has nothing to cancel and no entry.
    let reply = s
        .call(SupervisorRequest::CancelCall {
            operation_id: "op-unknown".into(),
            grace_ms: 0,
        })
        .await;
    assert_eq!(reply, SupervisorReply::Journal { entry: None });
}

/// A start of a known id answers that command only when it asks for the same thing (its
/// request digest); a replay-only start never admits an unknown id.
#[tokio::test]
async fn a_known_id_answers_its_command_only_to_the_same_request_and_a_replay_never_starts_one() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    let first = StartRequest {
        request_digest: "d1".into(),
        ..start_request("op-r", &c, "exec sleep 600")
    };
    let started = s.start_with(first.clone()).await;
    assert_eq!(started.state, CommandState::Running);
    let SupervisorReply::Status(again) = s.call(SupervisorRequest::Start(first.clone())).await
    else {
        panic!("the same start is answered with its command")
    };
    assert_eq!(again.command_id, "op-r");
    let other = StartRequest {
        request_digest: "d2".into(),
        ..first.clone()
    };
    let error = error_of(s.call(SupervisorRequest::Start(other.clone())).await);
    assert_eq!(error.code, ErrorCode::Conflict);
    let replay = StartRequest {
        replay_only: true,
        ..other
    };
    let error = error_of(s.call(SupervisorRequest::Start(replay)).await);
    assert_eq!(error.code, ErrorCode::Conflict);
    let unknown = StartRequest {
        replay_only: true,
        ..start_request("op-never", &c, "echo ran > ran")
    };
    assert_absent(s.call(SupervisorRequest::Start(unknown)).await);
    assert_absent(s.status("op-never", &c, 0).await);
    s.cancel("op-r", &c, 100).await;
}
