//! Conformance cases for bounds (at, under and over each limit), command output and process
//! cleanup edge cases, and compare-and-swap under concurrency.

use execution_provider::executor::protocol::{
    CommandState, ErrorCode, ExecutorRequest, MAX_COMMAND_OUTPUT, MAX_FILE_BYTES, Operation,
    content_version,
};

use super::{
    Fixture, assert_receipt, call, command, create, eventually, expect_code, ok, read_text, req,
    require_commands, run, with_data,
};

pub async fn file_content_at_and_under_the_limit_is_accepted_and_over_it_refused(f: &dyn Fixture) {
    let at = vec![b'a'; MAX_FILE_BYTES];
    let version = create(f, "at", &at).await;
    assert_eq!(version, content_version(&at));
    let read = ok(f, req(Operation::FileRead, "at")).await;
    assert_eq!(read.data.len(), MAX_FILE_BYTES);
    create(f, "under", &at[1..]).await;
    let over = vec![b'a'; MAX_FILE_BYTES + 1];
    expect_code(
        f,
        with_data(Operation::FileCreate, "over", &over),
        ErrorCode::ResourceExhausted,
    )
    .await;
    expect_code(f, req(Operation::FileStat, "over"), ErrorCode::NotFound).await;
}

pub async fn list_at_the_limit_is_accepted_and_over_it_refused(f: &dyn Fixture) {
    for name in ["d/a", "d/b", "d/c"] {
        create(f, name, b"").await;
    }
    let at = ExecutorRequest {
        limit: 3,
        ..req(Operation::FileList, "d")
    };
    assert_eq!(ok(f, at).await.entries.len(), 3);
    let over = ExecutorRequest {
        limit: 2,
        ..req(Operation::FileList, "d")
    };
    expect_code(f, over, ErrorCode::ResourceExhausted).await;
}

fn capped(id: &str, script: &str, cap: i64) -> ExecutorRequest {
    ExecutorRequest {
        limit: cap,
        ..command(id, script, 0)
    }
}

pub async fn the_limit_of_a_command_caps_its_output_and_the_receipt_covers_what_is_kept(
    f: &dyn Fixture,
) {
    require_commands(f);
    let script = "printf 'hello world!'; printf 'err' >&2";
    let at = run(f, capped("cap-at", script, 15)).await;
    assert_eq!(
        (at.stdout.as_slice(), at.stderr.as_slice()),
        (&b"hello world!"[..], &b"err"[..])
    );
    assert!(!at.truncated);
    let under = run(f, capped("cap-under", script, 14)).await;
    assert_eq!(under.stdout, b"hello world!");
    assert_eq!(under.stderr, b"er");
    assert!(under.truncated);
    let tight = run(f, capped("cap-tight", script, 5)).await;
    assert_eq!(tight.stdout, b"hello");
    assert!(tight.stderr.is_empty());
    assert!(tight.truncated);
    assert_eq!(tight.state, CommandState::Succeeded);
    assert_receipt(&tight);
    assert_eq!(
        tight.terminal_receipt,
        content_version(b"cap-tight\0hello\0"),
        "the receipt covers exactly the kept bytes"
    );
    expect_code(
        f,
        capped("cap-over", script, MAX_COMMAND_OUTPUT as i64 + 1),
        ErrorCode::ResourceExhausted,
    )
    .await;
}

pub async fn grandchildren_that_ignore_sigterm_and_leave_the_group_are_gone_after_timeout(
    f: &dyn Fixture,
) {
    require_commands(f);
    let script = "(trap '' TERM; sleep 60) & echo $! > child.pid; \
                  setsid sh -c 'trap \"\" TERM; echo $$ > escaped.pid; exec sleep 60' & \
                  while [ ! -s escaped.pid ]; do sleep 0.01; done; sleep 60";
    let status = run(f, command("c-tree", script, 4000)).await;
    assert_eq!(status.state, CommandState::Cancelled);
    assert_receipt(&status);
    for file in ["child.pid", "escaped.pid"] {
        let pid: i32 = read_text(f, file).await.trim().parse().expect("a pid");
        eventually(&format!("{file} is gone"), || !f.process_alive(pid)).await;
    }
}

pub async fn a_command_that_closes_stdout_early_still_reports_its_stderr(f: &dyn Fixture) {
    require_commands(f);
    let script = "exec 1>&-; echo closed >&2; sleep 0.1; echo done >&2";
    let status = run(f, command("c-close", script, 0)).await;
    assert_eq!(status.state, CommandState::Succeeded);
    assert!(status.stdout.is_empty());
    assert_eq!(status.stderr, b"closed\ndone\n");
    assert_receipt(&status);
}

pub async fn binary_output_is_repaired_to_utf8_and_covered_by_the_receipt(f: &dyn Fixture) {
    require_commands(f);
    let status = run(f, command("c-bin", "printf 'a\\000b\\377\\376c\\303'", 0)).await;
    assert_eq!(status.state, CommandState::Succeeded);
    assert_eq!(
        String::from_utf8(status.stdout.clone()).expect("valid UTF-8"),
        "a\0b\u{fffd}\u{fffd}c\u{fffd}"
    );
    assert_receipt(&status);
}

pub async fn concurrent_replaces_with_the_same_version_have_exactly_one_winner(f: &dyn Fixture) {
    let base = create(f, "cas.txt", b"v0").await;
    let attempts: Vec<_> = (0..8)
        .map(|i| {
            let data = format!("writer-{i}").into_bytes();
            ExecutorRequest {
                version: base.clone(),
                ..with_data(Operation::FileReplace, "cas.txt", &data)
            }
        })
        .collect();
    let results = futures::future::join_all(attempts.into_iter().map(|r| call(f, r))).await;
    let winners: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for result in &results {
        if let Err(error) = result {
            assert_eq!(error.code, ErrorCode::VersionMismatch, "{error}");
        }
    }
    let winner = winners[0].as_ref().expect("the winner");
    let content = ok(f, req(Operation::FileRead, "cas.txt")).await;
    assert_eq!(content.version, winner.version);
    assert!(content.data.starts_with(b"writer-"));
}
