//! The executor supervisor (docs/commands.md), a real `execution-helper supervise` process per
//! test: detached commands, output offsets, stdin, signals, cancel with proven end under
//! per-command sub-reapers, claim deadlines, bounds, the journal, and the channel's
//! authentication.

mod supervisor_support;

use std::time::Duration;

use execution_provider::executor::protocol::{CommandState, ErrorCode};
use execution_provider::executor::supervisor_client::ClientError;
use execution_provider::executor::supervisor_protocol::{
    Binding, CommandSignal, Direction, Hello, MAX_FRAME, MAX_RUNNING_COMMANDS, StartRequest,
    SupervisorReply, SupervisorRequest, TAG_LEN, command_receipt, derive_secret, read_frame,
    write_frame,
};
use supervisor_support::*;

#[tokio::test]
async fn a_detached_command_streams_both_streams_in_one_offset_space_and_ends_with_a_receipt() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    let started = s
        .start_command("op-1", &c, "for i in 1 2 3; do echo $i; echo e$i >&2; done")
        .await;
    assert_eq!(started.state, CommandState::Running);
    let followed = s.follow("op-1", &c, 0).await;
    assert_eq!(followed.stdout, b"1\n2\n3\n");
    assert_eq!(followed.stderr, b"e1\ne2\ne3\n");
    let mut expected = 0;
    for (offset, len) in &followed.spans {
        assert_eq!(
            *offset, expected,
            "offsets are contiguous: {:?}",
            followed.spans
        );
        expected += *len as u64;
    }
    let end = followed.end.unwrap();
    assert_eq!(end.state, CommandState::Succeeded);
    assert!(end.proven);
    assert_eq!(end.next_offset, 15);
    assert_eq!(
        end.terminal_receipt,
        command_receipt(
            "op-1",
            CommandState::Succeeded,
            0,
            b"1\n2\n3\n",
            b"e1\ne2\ne3\n"
        )
    );
    // A status from an offset answers the rest, and the same end.
    let SupervisorReply::Status(later) = s.status("op-1", &c, 12).await else {
        panic!("status refused")
    };
    assert_eq!(later.start_offset, 12);
    assert_eq!(later.next_offset, 15);
    let rest: Vec<u8> = later.chunks.iter().flat_map(|c| c.data.clone()).collect();
    assert_eq!(rest.len(), 3);
    assert_eq!(later.terminal_receipt, end.terminal_receipt);
    // Past the end is invalid.
    let error = error_of(s.status("op-1", &c, 16).await);
    assert_eq!(error.code, ErrorCode::InvalidArgument);
}

#[tokio::test]
async fn output_reaches_a_follower_while_the_command_still_runs_and_a_reattach_resumes_at_its_offset()
 {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command(
        "op-live",
        &c,
        "echo first; read _ < /dev/null; exec sleep 1000",
    )
    .await;
    let mut connection = s.connect().await;
    connection
        .send(&SupervisorRequest::Follow {
            command_id: "op-live".into(),
            claim: c.clone(),
            offset: 0,
        })
        .await
        .unwrap();
    let Some(SupervisorReply::Output { chunks, .. }) = connection.next_reply().await.unwrap()
    else {
        panic!("expected output")
    };
    assert_eq!(chunks[0].data, b"first\n");
    // The follower went away; the command keeps running and a new follower resumes.
    drop(connection);
    let SupervisorReply::Status(view) = s.status("op-live", &c, 6).await else {
        panic!("status refused")
    };
    assert_eq!(view.state, CommandState::Running);
    assert_eq!((view.start_offset, view.next_offset), (6, 6));
    let end = s.cancel("op-live", &c, 100).await;
    assert_eq!(end.state, CommandState::Cancelled);
    assert!(end.proven);
    assert!(!end.terminal_receipt.is_empty());
}

#[tokio::test]
async fn cancel_proves_the_end_of_a_command_that_double_forked_and_setsid_while_another_keeps_running()
 {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    // The escapee: a grandchild in its own session, whose parent has already exited.
    s.start_command(
        "op-escape",
        &c,
        "(setsid sh -c 'echo $$ > escapee.pid; exec sleep 1000' &); exec sleep 1000",
    )
    .await;
    s.start_command("op-other", &c, "echo $$ > other.pid; exec sleep 1000")
        .await;
    let escapee = s.pid_file("escapee.pid").await;
    let other = s.pid_file("other.pid").await;
    assert!(alive(escapee) && alive(other));
    let session = std::fs::read_to_string(format!("/proc/{escapee}/stat")).unwrap();
    let fields: Vec<&str> = session
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    assert_eq!(
        fields[3],
        escapee.to_string(),
        "the escapee leads its own session"
    );

    let end = s.cancel("op-escape", &c, 200).await;
    assert_eq!(end.state, CommandState::Cancelled);
    assert!(end.proven, "the end is proven");
    assert!(!end.terminal_receipt.is_empty());
    assert!(!alive(escapee), "the setsid grandchild is gone");
    assert!(alive(other), "the other command keeps running");
    let SupervisorReply::Status(view) = s.status("op-other", &c, 0).await else {
        panic!("status refused")
    };
    assert_eq!(view.state, CommandState::Running);
    s.cancel("op-other", &c, 100).await;
    assert!(!alive(other));
}

#[tokio::test]
async fn a_command_that_kills_its_own_reaper_still_ends_proven_and_its_orphans_are_swept() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command(
        "op-rogue",
        &c,
        "sh -c 'echo $$ > orphan.pid; exec sleep 1000' & sleep 0.2; kill -9 $PPID; wait",
    )
    .await;
    let orphan = s.pid_file("orphan.pid").await;
    let entry = s.ended("op-rogue").await;
    assert!(entry.proven, "{entry:?}");
    assert_eq!(entry.state, CommandState::Cancelled);
    assert!(!alive(orphan), "the orphan was swept");
}

#[tokio::test]
async fn stdin_reaches_the_command_and_closing_it_ends_the_command() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    let mut request = start_request("op-cat", &c, "cat; echo done");
    request.stdin = true;
    let view = s.start_with(request).await;
    assert!(view.stdin_open);
    let reply = s
        .call(SupervisorRequest::Stdin {
            command_id: "op-cat".into(),
            claim: c.clone(),
            data: b"hello\n".to_vec(),
            close: true,
        })
        .await;
    assert_eq!(
        reply,
        SupervisorReply::Stdin {
            accepted: 6,
            open: false
        }
    );
    let followed = s.follow("op-cat", &c, 0).await;
    assert_eq!(followed.stdout, b"hello\ndone\n");
    assert_eq!(followed.end.unwrap().state, CommandState::Succeeded);
    // Stdin of an ended command is refused.
    let error = error_of(
        s.call(SupervisorRequest::Stdin {
            command_id: "op-cat".into(),
            claim: c.clone(),
            data: b"x".to_vec(),
            close: false,
        })
        .await,
    );
    assert_eq!(error.code, ErrorCode::Conflict);
    // A command started without stdin has none.
    s.start_command("op-nostdin", &c, "exec sleep 1000").await;
    let error = error_of(
        s.call(SupervisorRequest::Stdin {
            command_id: "op-nostdin".into(),
            claim: c.clone(),
            data: b"x".to_vec(),
            close: false,
        })
        .await,
    );
    assert_eq!(error.code, ErrorCode::Conflict);
    let error = error_of(
        s.call(SupervisorRequest::Stdin {
            command_id: "op-nostdin".into(),
            claim: c.clone(),
            data: vec![0; 64 * 1024 + 1],
            close: false,
        })
        .await,
    );
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    s.cancel("op-nostdin", &c, 100).await;
}

#[tokio::test]
async fn a_signal_reaches_the_commands_process_group() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command(
        "op-trap",
        &c,
        "trap 'echo got-int; exit 7' INT; echo $$ > trap.pid; while :; do sleep 0.05; done",
    )
    .await;
    s.pid_file("trap.pid").await;
    let reply = s
        .call(SupervisorRequest::Signal {
            command_id: "op-trap".into(),
            claim: c.clone(),
            signal: CommandSignal::Int,
        })
        .await;
    assert_eq!(reply, SupervisorReply::Ok {});
    let followed = s.follow("op-trap", &c, 0).await;
    assert_eq!(followed.stdout, b"got-int\n");
    let end = followed.end.unwrap();
    assert_eq!((end.state, end.exit_code), (CommandState::Failed, 7));
    let error = error_of(
        s.call(SupervisorRequest::Signal {
            command_id: "op-trap".into(),
            claim: c.clone(),
            signal: CommandSignal::Kill,
        })
        .await,
    );
    assert_eq!(error.code, ErrorCode::Conflict);
}

#[tokio::test]
async fn another_claim_or_an_older_epoch_sees_exactly_what_an_absent_command_looks_like() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_command("op-mine", &c, "exec sleep 1000").await;
    let mut older = c.clone();
    older.epoch = 0;
    let mut revoked = c.clone();
    revoked.grant_generation = 2;
    let other_run = ClaimTupleExt::with_run(&c, "run-other");
    for foreign in [claim("b"), older, revoked, other_run] {
        assert_absent(s.status("op-mine", &foreign, 0).await);
        assert_absent(
            s.call(SupervisorRequest::Cancel {
                command_id: "op-mine".into(),
                claim: foreign.clone(),
                grace_ms: 1,
            })
            .await,
        );
        assert_absent(
            s.call(SupervisorRequest::Signal {
                command_id: "op-mine".into(),
                claim: foreign.clone(),
                signal: CommandSignal::Kill,
            })
            .await,
        );
        let SupervisorReply::StatusList { commands } = s
            .call(SupervisorRequest::List {
                claim: foreign.clone(),
                limit: 0,
            })
            .await
        else {
            panic!("list refused")
        };
        assert!(commands.is_empty());
        // Starting the same id under another claim does not reach the command either.
        assert_absent(
            s.call(SupervisorRequest::Start(start_request(
                "op-mine", &foreign, "true",
            )))
            .await,
        );
    }
    assert_absent(s.status("op-unknown", &c, 0).await);
    let SupervisorReply::Status(view) = s.status("op-mine", &c, 0).await else {
        panic!("the owner sees it")
    };
    assert_eq!(view.state, CommandState::Running);
    s.cancel("op-mine", &c, 100).await;
}

trait ClaimTupleExt {
    fn with_run(&self, run: &str) -> Self;
}

impl ClaimTupleExt for execution_provider::executor::supervisor_protocol::ClaimTuple {
    fn with_run(&self, run: &str) -> Self {
        Self {
            run_id: run.into(),
            ..self.clone()
        }
    }
}

#[tokio::test]
async fn a_claims_commands_are_killed_when_its_deadline_passes_and_a_renewal_keeps_them() {
    let s = Supervised::enrolled().await;
    let (short, renewed, later) = (claim("short"), claim("renewed"), claim("later"));
    let mut request = start_request("op-short", &short, "echo $$ > short.pid; exec sleep 1000");
    request.lease_ms = 1_000;
    s.start_with(request).await;
    let mut request = start_request("op-renewed", &renewed, "exec sleep 1000");
    request.lease_ms = 1_000;
    s.start_with(request).await;
    let reply = s
        .call(SupervisorRequest::Renew {
            claim: renewed.clone(),
            lease_ms: 120_000,
        })
        .await;
    assert_eq!(reply, SupervisorReply::Renewed { commands: 1 });
    let pid = s.pid_file("short.pid").await;
    let entry = s.ended("op-short").await;
    assert_eq!(entry.state, CommandState::Cancelled);
    assert!(entry.proven);
    assert!(!alive(pid));
    // Its output is gone with its claim: the status answers absent, the journal keeps the
    // outcome.
    assert_absent(s.status("op-short", &short, 0).await);
    // A command started after the short one, with the same short lease, ends after it: the
    // renewed one, whose first deadline was earlier still, must be running then.
    let mut request = start_request("op-later", &later, "exec sleep 1000");
    request.lease_ms = 1_000;
    s.start_with(request).await;
    s.ended("op-later").await;
    let SupervisorReply::Status(view) = s.status("op-renewed", &renewed, 0).await else {
        panic!("status refused")
    };
    assert_eq!(view.state, CommandState::Running);
    s.cancel("op-renewed", &renewed, 100).await;
}

#[tokio::test]
async fn sixteen_commands_run_at_once_the_seventeenth_is_refused_and_ending_the_claim_ends_them_all()
 {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    for i in 0..MAX_RUNNING_COMMANDS {
        s.start_command(&format!("op-{i}"), &c, "exec sleep 1000")
            .await;
    }
    let error = error_of(
        s.call(SupervisorRequest::Start(start_request("op-17", &c, "true")))
            .await,
    );
    assert_eq!(error.code, ErrorCode::ResourceExhausted);
    let SupervisorReply::StatusList { commands } = s
        .call(SupervisorRequest::EndClaim {
            claim_id: c.claim_id.clone(),
            grace_ms: 100,
        })
        .await
    else {
        panic!("end_claim refused")
    };
    assert_eq!(commands.len(), MAX_RUNNING_COMMANDS);
    assert!(
        commands
            .iter()
            .all(|v| v.state == CommandState::Cancelled && v.proven)
    );
    let entry = s.journal("op-3", false).await.unwrap();
    assert!(entry.proven && !entry.terminal_receipt.is_empty());
}

#[tokio::test]
async fn variables_and_the_working_directory_reach_the_command_and_stay_inside_the_workspace() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    std::fs::create_dir(s.workspace.join("sub")).unwrap();
    let mut request = start_request("op-env", &c, "echo \"$GREETING\"; pwd");
    request.env = vec![("GREETING".into(), "hello there".into())];
    request.working_dir = "sub".into();
    s.start_with(request).await;
    let followed = s.follow("op-env", &c, 0).await;
    let root = s.workspace.canonicalize().unwrap();
    assert_eq!(
        String::from_utf8(followed.stdout).unwrap(),
        format!("hello there\n{}\n", root.join("sub").display())
    );
    for (dir, code) in [
        ("../", ErrorCode::PermissionDenied),
        ("/etc", ErrorCode::PermissionDenied),
        ("missing", ErrorCode::InvalidArgument),
    ] {
        let mut request = start_request(&format!("op-wd-{code}"), &c, "true");
        request.working_dir = dir.into();
        let error = error_of(s.call(SupervisorRequest::Start(request)).await);
        assert_eq!(error.code, code, "{dir}");
    }
    let mut request = start_request("op-badenv", &c, "true");
    request.env = vec![("A=B".into(), "x".into())];
    let error = error_of(s.call(SupervisorRequest::Start(request)).await);
    assert_eq!(error.code, ErrorCode::InvalidArgument);
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
async fn a_window_keeps_the_newest_bytes_and_reports_what_fell_out() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    let mut request = start_request("op-big", &c, "head -c 300000 /dev/zero | tr '\\0' x; echo");
    request.window_bytes = 100_000;
    s.start_with(request).await;
    s.ended("op-big").await;
    let SupervisorReply::Status(view) = s.status("op-big", &c, 0).await else {
        panic!("status refused")
    };
    assert_eq!(view.next_offset, 300_001);
    assert_eq!(view.start_offset, 200_001);
    assert_eq!(view.dropped_bytes, 200_001);
    let kept: usize = view.chunks.iter().map(|c| c.data.len()).sum();
    assert_eq!(kept, 100_000);
    assert!(view.proven && !view.terminal_receipt.is_empty());
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
