//! Detached commands on the real control plane (issue 12 item 5, docs/commands.md §5): a
//! server loop started through one `serve` process outlives that process (SIGKILL), and a
//! second `serve` answers its status, follows its output from an offset while lines keep
//! arriving in order, and cancels it with its end proven by a receipt over all its output.
//! Every supervisor session goes through the API server's `pods/exec` to the Pod's
//! supervisor (here the one the kwok exec agent runs; on kind the executor image's PID 1).

use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::executor::protocol::CommandState;
use execution_provider::executor::supervisor_protocol::command_receipt;

use crate::cluster::{Cluster, eventually};
use crate::common::{self, context};
use crate::flow::{Setup, release};
use crate::kwok_exec::{kwok_serves_exec, workspace_dir};
use crate::provider::Client;

/// A loop printing `line N` about every 100 ms, its shell's pid in `server.pid` first.
pub const SERVER_LOOP: &str =
    "echo $$ > server.pid; i=0; while :; do echo \"line $i\"; i=$((i+1)); sleep 0.1; done";

pub fn query(ctx: &pb::RequestContext, id: &str, offset: i64) -> pb::CommandQueryRequest {
    pb::CommandQueryRequest {
        context: Some(ctx.clone()),
        command_id: id.into(),
        offset,
        ..Default::default()
    }
}

/// Polls `CommandStatus` from offset 0 until the output holds `line {last}`.
pub async fn status_through(
    client: &Client,
    ctx: &pb::RequestContext,
    id: &str,
    last: usize,
) -> pb::CommandStatusResponse {
    let wanted = format!("line {last}\n");
    eventually(
        Duration::from_secs(60),
        &format!("`{}` in the command's status", wanted.trim_end()),
        || {
            let mut client = client.clone();
            let request = query(ctx, id, 0);
            let wanted = wanted.clone();
            async move {
                let status = client.command_status(request).await.ok()?.into_inner();
                String::from_utf8_lossy(&status.stdout)
                    .contains(&wanted)
                    .then_some(status)
            }
        },
    )
    .await
}

/// Asserts that `text` is `line first`, `line first+1`, … (whole lines); returns how many.
pub fn assert_consecutive_lines(text: &str, first: usize) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            format!("line {}", first + i),
            "lines arrive in order, none lost or repeated: {text:?}"
        );
    }
    lines.len()
}

pub async fn a_detached_server_loop_outlives_its_serve_and_a_second_serve_follows_and_cancels_it(
    cluster: Cluster,
) {
    let setup = Setup::new(cluster, "detached").await;
    let first = setup.installation.start_provider("first").await;
    let mut client = setup.installation.client(&first);
    let allocation = common::ensure_ready(&mut client, "detached").await;
    let env = allocation.environment.clone().unwrap();
    let claim = common::acquire(&mut client, "detached", &env).await;
    let ctx = context("detached", &claim);

    // Started through the first serve: it answers at once with the command id.
    let started = client
        .start_command(pb::CommandStartRequest {
            context: Some(ctx.clone()),
            command: SERVER_LOOP.into(),
            detach: true,
            ..Default::default()
        })
        .await
        .expect("a detached start through serve")
        .into_inner();
    let id = started.command_id.clone();
    assert!(!id.is_empty());
    assert_eq!(started.state, pb::CommandState::Running as i32);
    let before = status_through(&client, &ctx, &id, 3).await;
    assert_eq!(before.start_offset, 0);
    assert_eq!(before.next_offset, before.stdout.len() as i64);
    assert!(
        before.stdout.ends_with(b"\n"),
        "each line is one write: {before:?}"
    );
    let seen = assert_consecutive_lines(&String::from_utf8_lossy(&before.stdout), 0);

    // The first serve dies without a word; the command does not.
    first.crash().await;
    let second = setup.installation.start_provider("second").await;
    let mut client = setup.installation.client(&second);
    let status = status_through(&client, &ctx, &id, seen + 5).await;
    assert_eq!(status.state, pb::CommandState::Running as i32, "{status:?}");
    assert!(status.detached && status.stderr.is_empty(), "{status:?}");
    assert_eq!(status.start_offset, 0);
    assert_eq!(
        &status.stdout[..before.stdout.len()],
        &before.stdout[..],
        "the second serve reads the same output the first did"
    );
    assert_consecutive_lines(&String::from_utf8_lossy(&status.stdout), 0);

    // Follow from where the first serve's reader stopped (a line boundary).
    let resume = before.next_offset;
    let mut stream = client
        .follow_command(query(&ctx, &id, resume))
        .await
        .expect("a follow through the second serve")
        .into_inner();
    let (mut followed, mut expected) = (Vec::new(), resume);
    let mut cancel = query(&ctx, &id, 0);
    cancel.grace_millis = 500;
    let mut cancelled = None;
    let end = loop {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the follow keeps delivering")
            .expect("the follow does not fail")
            .expect("the follow ends with the command's end, not before");
        match event.event.expect("an event") {
            pb::command_output_event::Event::Chunk(chunk) => {
                assert_eq!(chunk.offset, expected, "chunks are contiguous and in order");
                assert_eq!(chunk.stream, pb::OutputStream::Stdout as i32);
                expected += chunk.data.len() as i64;
                followed.extend_from_slice(&chunk.data);
            }
            pb::command_output_event::Event::End(end) => break end,
            pb::command_output_event::Event::DroppedBytes(n) => panic!("dropped {n}"),
        }
        // Twenty more whole lines arrived live: cancel through the same serve.
        if cancelled.is_none() && followed.iter().filter(|b| **b == b'\n').count() >= 20 {
            let answer = client
                .cancel_command(cancel.clone())
                .await
                .expect("the cancel through the second serve")
                .into_inner();
            cancelled = Some(answer);
        }
    };
    let text = String::from_utf8_lossy(&followed).into_owned();
    let complete = text.rsplit_once('\n').map_or("", |(whole, _)| whole);
    let lines = assert_consecutive_lines(complete, seen);
    assert!(lines >= 20, "lines kept arriving: {text:?}");

    // Its end is proven: the cancel, the follow's end and a later status agree on a receipt
    // that covers every byte the command wrote.
    let cancelled = cancelled.expect("the cancel was sent");
    assert_eq!(
        cancelled.state,
        pb::CommandState::Cancelled as i32,
        "{cancelled:?}"
    );
    assert_eq!(cancelled.terminal_receipt.len(), 64, "{cancelled:?}");
    assert_eq!(end.state, cancelled.state);
    assert_eq!(end.terminal_receipt, cancelled.terminal_receipt);
    assert_eq!(end.next_offset, expected, "the follow saw every byte");
    let last = client
        .command_status(query(&ctx, &id, 0))
        .await
        .expect("the status of the ended command")
        .into_inner();
    assert_eq!(last.state, pb::CommandState::Cancelled as i32);
    assert_eq!(last.terminal_receipt, cancelled.terminal_receipt);
    assert_eq!(last.next_offset, expected);
    assert_eq!(
        last.stdout.len() as i64,
        expected,
        "the whole output is retained"
    );
    assert_eq!(
        command_receipt(
            &id,
            CommandState::Cancelled,
            last.exit_code,
            &last.stdout,
            &last.stderr
        ),
        last.terminal_receipt,
        "the receipt is the one over exactly this output"
    );
    if kwok_serves_exec() {
        let pid_file =
            workspace_dir(&setup.cluster.work, &setup.ns.name, &env.id).join("server.pid");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        assert!(
            matches!(state, None | Some("Z" | "X")),
            "the loop's shell {pid} is gone: {stat}"
        );
    }

    release(&mut client, "detached", &claim).await;
    second.stop().await;
    setup.finish().await;
}
