//! The executor node's supervisors (docs/commands.md §5.7): the production `Supervisor` (its
//! journal, claim deadlines, cancels and tagged channel) hosted on the simulator's node, one
//! per executor Pod UID, with a model of the command reaper behind the supervisor's
//! `ReaperHost` seam, and the ledger of every command's life that the checker judges: no
//! command outlives its claim.
//!
//! The model reaper speaks the reaper link's frames. Its command is a tiny script of steps
//! separated by `; `: `sleep S` waits S simulated seconds, `echo WORDS` prints them, `exit N`
//! ends with N; anything else prints `not found` and ends with 127. Its commands trap nothing:
//! a cancel ends one at once (interrupted), any signal ends it (exit -1), a timeout ends it
//! (interrupted); its end is always proven (the model leaves no process behind). Stdin bytes
//! are consumed and acknowledged.
//!
//! The ledger lives outside the node (like the workspaces), so a node crash, which ends every
//! command of the node with the process that hosts them, is recorded by the driver.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::executor::BoxFuture;
use execution_provider::executor::protocol::{ExecutorError, decode_strict};
use execution_provider::executor::supervisor_protocol::{
    OutputStream, StartRequest, read_frame, write_frame,
};
use execution_provider::helper::supervisor::Supervisor;
use execution_provider::helper::supervisor::command_link::{Launch, ReaperHost, ReaperLife};
use execution_provider::helper::supervisor::reaper_wire::{FromReaper, MAX_REAPER_FRAME, ToReaper};
use execution_provider::runtime::{Runtime, SeededIds};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::clock::SkewedClock;

/// The bytes of one model reaper link's buffer.
const LINK_BUFFER: usize = 64 * 1024;

/// One command's life as a process of the executor node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLife {
    /// The node host it ran on.
    pub node: String,
    /// The command id.
    pub command_id: String,
    /// The claim that started it.
    pub claim_id: String,
    /// Simulated milliseconds when it started.
    pub started_ms: u128,
    /// Simulated milliseconds when it ended; `None` while it runs.
    pub ended_ms: Option<u128>,
}

/// Every command's life, shared by the node hosts and the driver.
#[derive(Debug, Clone, Default)]
pub struct CommandLedger {
    lives: Arc<Mutex<Vec<CommandLife>>>,
}

impl CommandLedger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<CommandLife>> {
        self.lives.lock().expect("command ledger lock")
    }

    /// Records a command started now; returns its index.
    fn started(&self, node: &str, start: &StartRequest) -> usize {
        let mut lives = self.lock();
        lives.push(CommandLife {
            node: node.to_owned(),
            command_id: start.command_id.clone(),
            claim_id: start.claim.claim_id.clone(),
            started_ms: now_ms(),
            ended_ms: None,
        });
        lives.len() - 1
    }

    /// Records the end of command `index` at `at` (the first end recorded counts).
    fn ended(&self, index: usize, at: u128) {
        if let Some(life) = self.lock().get_mut(index) {
            life.ended_ms.get_or_insert(at);
        }
    }

    /// Every command still running on `node` ended at `at` (the node crashed).
    pub fn node_crashed(&self, node: &str, at: u128) {
        for life in self.lock().iter_mut().filter(|l| l.node == node) {
            life.ended_ms.get_or_insert(at);
        }
    }

    /// Every command's life so far, in start order.
    pub fn lives(&self) -> Vec<CommandLife> {
        self.lock().clone()
    }
}

/// Simulated milliseconds now (0 outside a host).
fn now_ms() -> u128 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis()
}

/// The supervisors of one node incarnation, by executor Pod UID.
pub struct NodeSupervisors {
    node: String,
    ledger: CommandLedger,
    seed: u64,
    by_pod: Mutex<BTreeMap<String, Arc<Supervisor>>>,
}

impl NodeSupervisors {
    /// No supervisor yet; their randomness derives from `seed` (one per node incarnation).
    pub fn new(node: String, ledger: CommandLedger, seed: u64) -> Self {
        Self {
            node,
            ledger,
            seed,
            by_pod: Mutex::default(),
        }
    }

    /// The node host's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The supervisor of the Pod `pod_uid` (its main process), started on first use with its
    /// deadline watcher.
    pub fn of_pod(&self, pod_uid: &str, environment: &str) -> Arc<Supervisor> {
        let mut by_pod = self.by_pod.lock().expect("node supervisors lock");
        if let Some(supervisor) = by_pod.get(pod_uid) {
            return supervisor.clone();
        }
        let ids_seed = self.seed ^ fnv(pod_uid.as_bytes()) ^ 0x5e9;
        let runtime = Runtime {
            clock: Arc::new(SkewedClock::exact()),
            ids: Arc::new(SeededIds::new(ids_seed)),
        };
        let reapers = Arc::new(ModelReapers {
            node: self.node.clone(),
            ledger: self.ledger.clone(),
        });
        let root = PathBuf::from(format!("{}/{environment}", crate::executor::WORKSPACE_ROOT));
        let supervisor = Supervisor::with_reapers(root, runtime, reapers);
        tokio::spawn(supervisor.clone().watch_deadlines());
        by_pod.insert(pod_uid.to_owned(), supervisor.clone());
        supervisor
    }

    /// Serves one supervisor session for the Pod `pod_uid` over `reader` and `writer`.
    pub async fn serve(
        &self,
        pod_uid: &str,
        environment: &str,
        reader: impl AsyncRead + Unpin,
        writer: impl AsyncWrite + Unpin,
    ) {
        let supervisor = self.of_pod(pod_uid, environment);
        execution_provider::helper::supervisor::channel::serve(supervisor, reader, writer).await;
    }
}

/// A stable hash (FNV-1a).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Starts model reapers on one node.
struct ModelReapers {
    node: String,
    ledger: CommandLedger,
}

impl ReaperHost for ModelReapers {
    fn launch(&self, start: &StartRequest) -> Result<Launch, ExecutorError> {
        let (ours, theirs) = tokio::io::duplex(LINK_BUFFER);
        let (our_reader, our_writer) = tokio::io::split(ours);
        let (their_reader, their_writer) = tokio::io::split(theirs);
        let index = self.ledger.started(&self.node, start);
        let ledger = self.ledger.clone();
        let task = tokio::spawn(play(their_reader, their_writer, ledger.clone(), index));
        let life = ModelLife {
            task: task.abort_handle(),
            ledger,
            index,
        };
        Ok(Launch::new(
            Box::new(our_reader),
            Box::new(our_writer),
            Box::new(life),
        ))
    }
}

/// A model reaper's end: the supervisor kills one that closed its link without its last
/// frame.
struct ModelLife {
    task: AbortHandle,
    ledger: CommandLedger,
    index: usize,
}

impl ReaperLife for ModelLife {
    fn close(self: Box<Self>, ended: bool, _sweep: bool) -> BoxFuture<'static, bool> {
        if !ended {
            self.task.abort();
            self.ledger.ended(self.index, now_ms());
        }
        Box::pin(async { true })
    }
}

/// One step of a model command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Wait this long.
    Sleep(Duration),
    /// Print this line.
    Echo(String),
    /// End with this code.
    Exit(i32),
}

/// The steps of a model command's text.
pub fn parse(command: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for part in command.split("; ") {
        let (word, rest) = part.split_once(' ').unwrap_or((part, ""));
        let step = match word {
            "sleep" => match rest.trim().parse::<u64>() {
                Ok(secs) => Step::Sleep(Duration::from_secs(secs)),
                Err(_) => Step::Exit(1),
            },
            "echo" => Step::Echo(rest.to_owned()),
            "exit" => Step::Exit(rest.trim().parse().unwrap_or(2)),
            "true" => continue,
            other => {
                steps.push(Step::Echo(format!("sh: {other}: not found")));
                Step::Exit(127)
            }
        };
        let ends = matches!(step, Step::Exit(_));
        steps.push(step);
        if ends {
            break;
        }
    }
    steps
}

/// Runs `steps`, printing through `out`; returns the exit code.
async fn run(steps: Vec<Step>, out: mpsc::UnboundedSender<FromReaper>) -> i32 {
    for step in steps {
        match step {
            Step::Sleep(time) => tokio::time::sleep(time).await,
            Step::Echo(words) => {
                let _ = out.send(FromReaper::Output {
                    stream: OutputStream::Stdout,
                    data: format!("{words}\n").into_bytes(),
                });
            }
            Step::Exit(code) => return code,
        }
    }
    0
}

/// The model reaper: reads the start, runs the command while it answers the supervisor's
/// frames, and records its end in the ledger before it reports it.
async fn play(
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    mut writer: impl AsyncWrite + Unpin + Send + 'static,
    ledger: CommandLedger,
    index: usize,
) {
    let Some(ToReaper::Start {
        command,
        timeout_ms,
        ..
    }) = next_frame(&mut reader).await
    else {
        ledger.ended(index, now_ms());
        return;
    };
    let (out, mut frames) = mpsc::unbounded_channel::<FromReaper>();
    let sending = tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            let body = serde_json::to_vec(&frame).expect("reaper frames encode");
            if write_frame(&mut writer, &[&body]).await.is_err() {
                break;
            }
        }
    });
    let _ = out.send(FromReaper::Started);
    let mut script = Box::pin(run(parse(&command), out.clone()));
    let mut timeout = Box::pin(async move {
        match timeout_ms {
            0 => std::future::pending().await,
            ms => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    });
    let (exit_code, interrupted) = loop {
        tokio::select! {
            code = &mut script => break (code, false),
            () = &mut timeout => break (-1, true),
            frame = next_frame(&mut reader) => match frame {
                Some(ToReaper::Cancel { .. }) | None => break (-1, true),
                Some(ToReaper::Signal { .. }) => break (-1, false),
                Some(ToReaper::Stdin { data }) => {
                    let _ = out.send(FromReaper::StdinWritten { bytes: data.len() as u64 });
                }
                Some(ToReaper::CloseStdin) => {
                    let _ = out.send(FromReaper::StdinClosed);
                }
                Some(ToReaper::Start { .. } | ToReaper::Resize { .. }) => {}
            },
        }
    };
    // The script's output sender goes with it, so that the sender below closes the channel.
    drop(script);
    ledger.ended(index, now_ms());
    let _ = out.send(FromReaper::Ended {
        exit_code,
        interrupted,
        proven: true,
    });
    drop(out);
    let _ = sending.await;
}

/// The next frame from the supervisor; `None` when the link closed or a frame is bad.
async fn next_frame(reader: &mut (impl AsyncRead + Unpin)) -> Option<ToReaper> {
    let frame = read_frame(reader, MAX_REAPER_FRAME).await.ok()??;
    decode_strict(&frame).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_command_parses_into_its_steps() {
        assert_eq!(
            parse("echo a b; sleep 3; exit 4; echo never"),
            vec![
                Step::Echo("a b".into()),
                Step::Sleep(Duration::from_secs(3)),
                Step::Exit(4),
            ]
        );
        assert_eq!(
            parse("rm -rf /"),
            vec![Step::Echo("sh: rm: not found".into()), Step::Exit(127)]
        );
        assert_eq!(parse("true"), Vec::<Step>::new());
    }
}
