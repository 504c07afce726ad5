//! Wire forms of supervised commands: a supervisor's [`CommandView`] as a
//! `CommandStatusResponse` (chunks in one offset space, and the same bytes per stream in
//! `stdout`/`stderr`), its chunks as `OutputChunk`s, and follow events.

use crate::api::pb;
use crate::executor::supervisor_protocol::{self as sup, Chunk, CommandView};
use crate::server::convert::command_state;
use crate::store::command_reads::FollowEvent;

/// The wire stream of a chunk.
fn stream(s: sup::OutputStream) -> pb::OutputStream {
    match s {
        sup::OutputStream::Stdout => pb::OutputStream::Stdout,
        sup::OutputStream::Stderr => pb::OutputStream::Stderr,
        sup::OutputStream::Pty => pb::OutputStream::Pty,
    }
}

/// One chunk on the wire.
pub fn chunk(c: &Chunk) -> pb::OutputChunk {
    pb::OutputChunk {
        stream: stream(c.stream) as i32,
        offset: i64::try_from(c.offset).unwrap_or(i64::MAX),
        data: c.data.clone(),
    }
}

/// A supervised command's status. `truncated` says bytes before the retained window were
/// asked for and not returned (DECISIONS 12's meaning), `dropped_bytes` how many.
pub fn command_view(view: &CommandView, detached: bool) -> pb::CommandStatusResponse {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for c in &view.chunks {
        match c.stream {
            sup::OutputStream::Stderr => stderr.extend_from_slice(&c.data),
            _ => stdout.extend_from_slice(&c.data),
        }
    }
    pb::CommandStatusResponse {
        command_id: view.command_id.clone(),
        state: command_state(view.state) as i32,
        exit_code: view.exit_code,
        stdout,
        stderr,
        next_offset: i64::try_from(view.next_offset).unwrap_or(i64::MAX),
        truncated: view.dropped_bytes > 0,
        terminal_receipt: if view.proven {
            view.terminal_receipt.clone()
        } else {
            String::new()
        },
        dropped_bytes: view.dropped_bytes,
        chunks: view.chunks.iter().map(chunk).collect(),
        start_offset: i64::try_from(view.start_offset).unwrap_or(i64::MAX),
        stdin_open: view.stdin_open,
        detached,
        started_at_unix_millis: view.started_at_ms,
        ended_at_unix_millis: view.ended_at_ms,
    }
}

/// A listed command: its status without output.
pub fn listed(view: &CommandView, detached: bool) -> pb::CommandStatusResponse {
    let mut status = command_view(view, detached);
    status.stdout.clear();
    status.stderr.clear();
    status.chunks.clear();
    status
}

/// The wire events of one follow event: a dropped-bytes marker first when output fell out of
/// the window, then each chunk; or the end.
pub fn follow_events(event: FollowEvent, detached: bool) -> Vec<pb::CommandOutputEvent> {
    use pb::command_output_event::Event;
    let wrap = |event| pb::CommandOutputEvent { event: Some(event) };
    match event {
        FollowEvent::Output { chunks, dropped } => {
            let mut events = Vec::with_capacity(chunks.len() + 1);
            if dropped > 0 {
                events.push(wrap(Event::DroppedBytes(dropped)));
            }
            events.extend(chunks.iter().map(|c| wrap(Event::Chunk(chunk(c)))));
            events
        }
        FollowEvent::End(view) => vec![wrap(Event::End(listed(&view, detached)))],
    }
}
