//! Terminal sessions of the executor supervisor (docs/commands.md §8), a real
//! `execution-helper supervise` per test: a command on a PTY is the leader of its own session
//! with that terminal as its controlling terminal, under its reaper; typed input, `^C` and the
//! end-of-file character reach it through the line discipline; a resize changes what `stty size`
//! reports and sends `SIGWINCH`; output is one `pty` stream in the offset space with its receipt;
//! cancel still proves the end of a tree that escaped into another session holding the terminal.

mod supervisor_support;

use std::time::Duration;

use execution_provider::executor::protocol::{CommandState, ErrorCode};
use execution_provider::executor::supervisor_protocol::{
    ClaimTuple, OutputStream, PtySize, StartRequest, SupervisorReply, SupervisorRequest,
    command_receipt,
};
use supervisor_support::*;

fn on_terminal(id: &str, claim: &ClaimTuple, command: &str, rows: u16, cols: u16) -> StartRequest {
    StartRequest {
        pty: Some(PtySize { rows, cols }),
        ..start_request(id, claim, command)
    }
}

/// Polls the command's output from 0 until it contains `needle`; returns all of it.
async fn output_until(s: &Supervised, id: &str, claim: &ClaimTuple, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let SupervisorReply::Status(view) = s.status(id, claim, 0).await else {
            panic!("status refused")
        };
        let text: Vec<u8> = view.chunks.iter().flat_map(|c| c.data.clone()).collect();
        let text = String::from_utf8_lossy(&text).into_owned();
        if text.contains(needle) {
            assert!(
                view.chunks.iter().all(|c| c.stream == OutputStream::Pty),
                "a terminal's output is one pty stream: {:?}",
                view.chunks
            );
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{needle:?} never appeared in {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn type_in(s: &Supervised, id: &str, claim: &ClaimTuple, data: &[u8], close: bool) {
    let reply = s
        .call(SupervisorRequest::Stdin {
            command_id: id.into(),
            claim: claim.clone(),
            data: data.to_vec(),
            close,
        })
        .await;
    let SupervisorReply::Stdin { accepted, .. } = reply else {
        panic!("stdin refused: {reply:?}")
    };
    assert_eq!(accepted, data.len() as u64);
}

async fn resize(
    s: &Supervised,
    id: &str,
    claim: &ClaimTuple,
    rows: u16,
    cols: u16,
) -> SupervisorReply {
    s.call(SupervisorRequest::Resize {
        command_id: id.into(),
        claim: claim.clone(),
        size: PtySize { rows, cols },
    })
    .await
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, pgrp, session,
/// tty_nr, tpgid, …
fn stat_fields(pid: i32) -> Vec<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(-1))
        .collect()
}

#[tokio::test]
async fn a_terminal_command_leads_its_own_session_with_the_pty_as_controlling_terminal() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    let view = s
        .start_with(on_terminal(
            "op-tty",
            &c,
            "echo $$ > shell.pid; tty; stty size; exec sleep 1000",
            24,
            80,
        ))
        .await;
    assert!(view.stdin_open, "a terminal is the command's stdin");
    let text = output_until(&s, "op-tty", &c, "24 80").await;
    assert!(text.starts_with("/dev/pts/"), "{text:?}");
    assert!(
        text.contains("\r\n"),
        "the line discipline maps newlines: {text:?}"
    );

    let shell = s.pid_file("shell.pid").await;
    let fields = stat_fields(shell);
    let (parent, group, session, tty, foreground) =
        (fields[0], fields[1], fields[2], fields[3], fields[4]);
    assert_eq!(
        session,
        i64::from(shell),
        "the command leads its own session"
    );
    assert_eq!(group, i64::from(shell), "and its own process group");
    assert_ne!(tty, 0, "it has a controlling terminal");
    assert_eq!(
        foreground,
        i64::from(shell),
        "it is the terminal's foreground job"
    );
    let reaper = i32::try_from(parent).unwrap();
    let supervisor = i64::from(s.child.id().unwrap());
    assert_eq!(
        stat_fields(reaper)[0],
        supervisor,
        "under its reaper, a child of the supervisor"
    );

    let end = s.cancel("op-tty", &c, 200).await;
    assert_eq!(end.state, CommandState::Cancelled);
    assert!(end.proven);
    assert!(!alive(shell));
    let followed = s.follow("op-tty", &c, 0).await;
    assert!(followed.stderr.is_empty());
    assert_eq!(
        end.terminal_receipt,
        command_receipt("op-tty", end.state, end.exit_code, &followed.stdout, b""),
        "terminal bytes count as stdout in the receipt"
    );
}

#[tokio::test]
async fn a_resize_changes_the_terminal_size_and_typed_input_reaches_a_read() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_with(on_terminal(
        "op-size",
        &c,
        "stty size; read line; stty size; echo \"got $line\"",
        24,
        80,
    ))
    .await;
    output_until(&s, "op-size", &c, "24 80").await;
    assert_eq!(
        resize(&s, "op-size", &c, 40, 100).await,
        SupervisorReply::Ok {}
    );
    type_in(&s, "op-size", &c, b"hello\n", false).await;
    let followed = s.follow("op-size", &c, 0).await;
    let text = String::from_utf8_lossy(&followed.stdout).into_owned();
    assert!(text.contains("40 100"), "{text:?}");
    assert!(text.contains("got hello"), "{text:?}");
    let end = followed.end.unwrap();
    assert_eq!((end.state, end.exit_code), (CommandState::Succeeded, 0));
    assert!(end.proven);
    assert!(!end.stdin_open);
    // An ended command has no terminal to resize.
    let error = error_of(resize(&s, "op-size", &c, 30, 90).await);
    assert_eq!(error.code, ErrorCode::Conflict);
}

#[tokio::test]
async fn a_resize_sends_sigwinch_to_the_foreground_job() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_with(on_terminal(
        "op-winch",
        &c,
        "trap 'stty size; exit 3' WINCH; echo ready; while :; do sleep 0.05; done",
        24,
        80,
    ))
    .await;
    output_until(&s, "op-winch", &c, "ready").await;
    assert_eq!(
        resize(&s, "op-winch", &c, 50, 120).await,
        SupervisorReply::Ok {}
    );
    let followed = s.follow("op-winch", &c, 0).await;
    let text = String::from_utf8_lossy(&followed.stdout).into_owned();
    assert!(text.contains("50 120"), "{text:?}");
    let end = followed.end.unwrap();
    assert_eq!((end.state, end.exit_code), (CommandState::Failed, 3));
}

#[tokio::test]
async fn control_characters_act_through_the_line_discipline_and_close_types_end_of_file() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    // ^C typed on the terminal is SIGINT to the foreground job.
    s.start_with(on_terminal(
        "op-int",
        &c,
        "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done",
        24,
        80,
    ))
    .await;
    output_until(&s, "op-int", &c, "ready").await;
    type_in(&s, "op-int", &c, b"\x03", false).await;
    let end = s.follow("op-int", &c, 0).await;
    assert!(String::from_utf8_lossy(&end.stdout).contains("got-int"));
    assert_eq!(end.end.unwrap().exit_code, 5);

    // Closing stdin types the end-of-file character: `cat` sees its end.
    s.start_with(on_terminal("op-eof", &c, "cat; echo after-eof", 24, 80))
        .await;
    type_in(&s, "op-eof", &c, b"line\n", false).await;
    output_until(&s, "op-eof", &c, "line\r\nline\r\n").await;
    type_in(&s, "op-eof", &c, b"", true).await;
    let followed = s.follow("op-eof", &c, 0).await;
    assert!(String::from_utf8_lossy(&followed.stdout).contains("after-eof"));
    assert_eq!(followed.end.unwrap().state, CommandState::Succeeded);
}

#[tokio::test]
async fn cancel_proves_the_end_of_a_terminal_command_whose_escapee_holds_the_terminal() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    s.start_with(on_terminal(
        "op-escape",
        &c,
        "(setsid sh -c 'echo $$ > escapee.pid; exec sleep 1000' &); echo started; exec sleep 1000",
        24,
        80,
    ))
    .await;
    let escapee = s.pid_file("escapee.pid").await;
    output_until(&s, "op-escape", &c, "started").await;
    assert!(alive(escapee));
    let end = s.cancel("op-escape", &c, 200).await;
    assert_eq!(end.state, CommandState::Cancelled);
    assert!(end.proven, "the end is proven");
    assert!(!end.terminal_receipt.is_empty());
    assert!(!alive(escapee), "the escapee in its own session is gone");
}

#[tokio::test]
async fn terminal_sizes_and_resizes_are_checked_and_a_plain_command_has_no_terminal() {
    let s = Supervised::enrolled().await;
    let c = claim("a");
    for (rows, cols) in [(0, 80), (24, 0), (1001, 80), (24, 1001)] {
        let reply = s
            .call(SupervisorRequest::Start(on_terminal(
                "op-bad",
                &c,
                "touch ran",
                rows,
                cols,
            )))
            .await;
        assert_eq!(error_of(reply).code, ErrorCode::InvalidArgument);
    }
    assert!(!s.workspace.join("ran").exists(), "nothing ran");

    s.start_with(on_terminal("op-term", &c, "exec sleep 1000", 1000, 1000))
        .await;
    for (rows, cols) in [(0, 10), (10, 1001)] {
        let error = error_of(resize(&s, "op-term", &c, rows, cols).await);
        assert_eq!(error.code, ErrorCode::InvalidArgument);
    }
    assert_absent(resize(&s, "op-term", &claim("b"), 10, 10).await);
    assert_absent(resize(&s, "op-unknown", &c, 10, 10).await);

    s.start_command("op-plain", &c, "exec sleep 1000").await;
    let error = error_of(resize(&s, "op-plain", &c, 10, 10).await);
    assert_eq!(error.code, ErrorCode::Conflict);
    assert_eq!(error.message, "command has no terminal");
    s.cancel("op-term", &c, 100).await;
    s.cancel("op-plain", &c, 100).await;
}
