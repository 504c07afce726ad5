//! An executor transport whose supervisor sessions reach an in-process [`Supervisor`] (the
//! library's own journal, request handling and authenticated channel, over an in-memory
//! stream): the reconciler's tests drive its journal directly with the calls the supervisor's
//! call path makes (`begin_call`, `finish_call`), and can make it unreachable or silent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use execution_provider::executor::protocol::{CommandState, ExecutorEnvelope, ExecutorRequest};
use execution_provider::executor::supervisor_client::SupervisorConnection;
use execution_provider::executor::supervisor_protocol::{
    JournalEntry, SupervisorReply, derive_secret, operation_receipt,
};
use execution_provider::executor::transport::{
    BoxFuture, CancelSignal, ExecutorTarget, ExecutorTransport, SessionReader, SessionWriter,
    SupervisorSession, SupervisorTarget, TransportError,
};
use execution_provider::helper::supervisor::{Supervisor, channel};
use execution_provider::runtime::Runtime;
use tokio::sync::watch;

/// How the supervisor answers sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reach {
    /// Sessions open and requests are answered.
    Answering = 0,
    /// No session opens (the Pod is gone, the node unreachable).
    Unreachable = 1,
    /// A session never opens nor fails (a partitioned node): only a deadline ends the ask.
    Silent = 2,
}

/// The transport and its supervisor.
pub struct InProcessSupervisor {
    pub supervisor: Arc<Supervisor>,
    reach: AtomicU8,
}

impl InProcessSupervisor {
    pub fn new(runtime: Runtime) -> Arc<Self> {
        let supervisor = Supervisor::new(
            "/nonexistent/execution-helper".into(),
            "/nonexistent/workspace".into(),
            runtime,
        );
        Arc::new(Self {
            supervisor,
            reach: AtomicU8::new(Reach::Answering as u8),
        })
    }

    pub fn set_reach(&self, reach: Reach) {
        self.reach.store(reach as u8, Ordering::SeqCst);
    }

    /// Journals a call running under `id`, as the call path does before it starts the helper;
    /// returns the receiver that sees its cancel.
    pub fn running(&self, id: &str) -> watch::Receiver<bool> {
        let cancel = Arc::new(watch::channel(false).0);
        let cancelled = cancel.subscribe();
        self.supervisor
            .begin_call(id, cancel)
            .expect("a fresh operation id");
        cancelled
    }

    /// Journals the end of the call `id`, proven or not, with the receipt over `answer`.
    pub fn ended(&self, id: &str, state: CommandState, proven: bool, answer: &[u8]) {
        self.supervisor.finish_call(JournalEntry {
            command_id: id.to_owned(),
            claim_id: String::new(),
            state,
            exit_code: if proven { 0 } else { -1 },
            proven,
            terminal_receipt: if proven {
                operation_receipt(id, state, answer)
            } else {
                String::new()
            },
            never_started: false,
        });
    }

    async fn open(&self, target: &SupervisorTarget) -> Result<SupervisorSession, TransportError> {
        match self.reach.load(Ordering::SeqCst) {
            1 => return Err(TransportError::stream("no supervisor answered")),
            2 => std::future::pending::<()>().await,
            _ => {}
        }
        let secret = derive_secret(
            b"reconciler-test-key",
            &target.executor.namespace,
            &target.executor.pod_name,
            &target.pod_uid,
        );
        let (client, server) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server);
        tokio::spawn(channel::serve(
            self.supervisor.clone(),
            server_read,
            server_write,
        ));
        let (read, write) = tokio::io::split(client);
        let (read, write): (SessionReader, SessionWriter) = (Box::new(read), Box::new(write));
        let failed = |e| TransportError::stream(format!("{e}"));
        let mut session = SupervisorConnection::open(read, write, secret)
            .await
            .map_err(failed)?;
        if !session.enrolled_with_our_secret() {
            match session.enroll().await.map_err(failed)? {
                SupervisorReply::Enrolled { .. } => {}
                other => return Err(TransportError::stream(format!("{other:?}"))),
            }
        }
        Ok(session)
    }
}

impl ExecutorTransport for InProcessSupervisor {
    fn execute<'a>(
        &'a self,
        _target: &'a ExecutorTarget,
        _request: ExecutorRequest,
        _cancel: CancelSignal,
    ) -> BoxFuture<'a, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(async { Err(TransportError::stream("no one-shot calls here")) })
    }

    fn supervisor<'a>(
        &'a self,
        target: &'a SupervisorTarget,
    ) -> BoxFuture<'a, Result<SupervisorSession, TransportError>> {
        Box::pin(self.open(target))
    }
}
