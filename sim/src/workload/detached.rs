//! Detached commands (docs/commands.md §5): a client starts a model command that runs for a
//! while under its claim (`sleep S; echo done`, often longer than the claim's 30 s), and later
//! looks at one it started (its status, or following its output for a while from offset 0,
//! from whichever replica it draws: a reattach), or cancels it. Whether the supervisor kills a command when its
//! claim ends is judged at the end of the run from the executor's ledger (§5.7); what the
//! client is told is traced, and an acknowledged start is judged as any acknowledged call
//! (§10.13: its lease was admitted under the claim it names).
//!
//! Its choices draw from the session's side stream, so that the original workload's draws
//! stay as they were; its first call draws its replica as the one-shot command it replaces did.

use execution_provider::api::pb;
use rand::RngExt;

use super::{Session, now_ms, outcome};

/// How long a look follows a command's output before it lets go.
const FOLLOW_FOR: std::time::Duration = std::time::Duration::from_secs(3);
/// The most detached commands a binding remembers (the oldest is forgotten).
const REMEMBERED: usize = 8;

/// A detached command a client started.
#[derive(Clone, Debug)]
pub(super) struct Started {
    command_id: String,
    claim: pb::RunClaimResponse,
}

impl Session {
    /// Starts a detached command under `claim`, or looks at or cancels one started before.
    pub(super) async fn detached(&mut self, binding: &str, claim: pb::RunClaimResponse) {
        let known = self.bindings[binding].detached.clone();
        if known.is_empty() || self.side_rng.random_bool(0.5) {
            return self.start_detached(binding, claim).await;
        }
        let started = known[self.side_rng.random_range(0..known.len())].clone();
        let request = pb::CommandQueryRequest {
            context: Some(self.context(binding, &started.claim)),
            command_id: started.command_id.clone(),
            ..Default::default()
        };
        let look = self.side_rng.random_range(0..3);
        if look == 0 {
            let result = self.client().command_status(request).await;
            self.trace(format!(
                "status {} {binding} -> {}",
                started.command_id,
                described(&result)
            ));
        } else if look == 1 {
            self.follow(binding, &started.command_id, request).await;
        } else {
            let result = self.client().cancel_command(request).await;
            self.trace(format!(
                "cancel {} {binding} -> {}",
                started.command_id,
                described(&result)
            ));
        }
    }

    /// Follows a command's output from offset 0 for at most [`FOLLOW_FOR`], then lets go (a
    /// later look attaches again): traced with the chunks seen and whether its end came.
    async fn follow(&mut self, binding: &str, command_id: &str, request: pb::CommandQueryRequest) {
        let mut client = self.client();
        let following = async move {
            let mut stream = client.follow_command(request).await?.into_inner();
            let (mut chunks, mut end) = (0_u32, None);
            while let Some(event) = stream.message().await? {
                match event.event {
                    Some(pb::command_output_event::Event::Chunk(_)) => chunks += 1,
                    Some(pb::command_output_event::Event::End(status)) => {
                        end = Some(status.state());
                        break;
                    }
                    _ => {}
                }
            }
            Ok::<_, tonic::Status>((chunks, end))
        };
        let traced = match tokio::time::timeout(FOLLOW_FOR, following).await {
            Err(_) => "let go".to_owned(),
            Ok(Ok((chunks, Some(end)))) => format!("ok {chunks} chunks, ended {end:?}"),
            Ok(Ok((chunks, None))) => format!("ok {chunks} chunks, stream closed"),
            Ok(Err(status)) => outcome::<()>(&Err(status)),
        };
        self.trace(format!("follow {command_id} {binding} -> {traced}"));
    }

    async fn start_detached(&mut self, binding: &str, claim: pb::RunClaimResponse) {
        let command = format!("sleep {}; echo done", self.side_rng.random_range(1..=90));
        let request = pb::CommandStartRequest {
            context: Some(self.context(binding, &claim)),
            command: command.clone(),
            detach: true,
            ..Default::default()
        };
        let sent_ms = now_ms();
        let result = self.client().start_command(request).await;
        self.trace(format!(
            "detach `{command}` {binding} e{} -> {}",
            claim.epoch,
            outcome(&result)
        ));
        let Ok(response) = result else {
            return;
        };
        let command_id = response.into_inner().command_id;
        self.acknowledge(&claim, sent_ms, format!("detached command `{command}`"));
        let known = &mut self
            .bindings
            .get_mut(binding)
            .expect("known binding")
            .detached;
        if known.len() == REMEMBERED {
            known.remove(0);
        }
        known.push(Started { command_id, claim });
    }
}

/// A command's answer as the trace shows it: its state, or how the call ended.
fn described(result: &Result<tonic::Response<pb::CommandStatusResponse>, tonic::Status>) -> String {
    match result {
        Ok(answer) => format!("ok {:?}", answer.get_ref().state()),
        Err(_) => outcome(result),
    }
}
