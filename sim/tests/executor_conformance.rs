//! The simulator's in-memory executor against the executor conformance cases shared with the
//! real helper (`tests/conformance`), twice: called in process, and hosted on an executor node
//! reached over turmoil TCP through [`HostedExecutor`] (the path replicas take when
//! `world::EXECUTOR_NODES` is above 0). Every case listed here passes both ways; the cases that
//! need what the in-memory model leaves out (symlinks, real processes, glob/grep) are listed in
//! sim/README.md and not run here (a command case listed here fails: `require_commands`).

#[path = "../../tests/conformance/mod.rs"]
#[macro_use]
mod conformance;

use execution_provider::executor::{
    BoxFuture, ExecutorEnvelope, ExecutorTarget, ExecutorTransport, TransportError,
};
use sim::executor::{MemExecutor, WORKSPACE_ROOT};
use sim::node::{HostedExecutor, add_nodes};

struct MemFixture {
    executor: MemExecutor,
    /// The transport to the node host, when the case runs over the simulated network.
    hosted: Option<HostedExecutor>,
    target: ExecutorTarget,
}

impl MemFixture {
    fn new() -> Self {
        Self {
            executor: MemExecutor::new(0, 0.0, std::time::Duration::ZERO),
            hosted: None,
            target: ExecutorTarget {
                namespace: "execution".into(),
                pod_name: "executor-conformance".into(),
                environment: "exec-conformance".into(),
            },
        }
    }

    fn hosted(executor: MemExecutor) -> Self {
        Self {
            executor,
            hosted: Some(HostedExecutor::new(1)),
            ..Self::new()
        }
    }
}

/// A simulation with one executor node and the case as a client host: `case` gets the node's
/// executor and runs inside the client.
fn hosted_simulation<F>(case: impl FnOnce(MemExecutor) -> F) -> turmoil::Sim<'static>
where
    F: std::future::Future<Output = ()> + 'static,
{
    let mut sim = turmoil::Builder::new()
        .simulation_duration(std::time::Duration::from_secs(600))
        .build();
    let executor = MemExecutor::new(0, 0.0, std::time::Duration::ZERO);
    add_nodes(&mut sim, &executor, 1);
    let case = case(executor);
    sim.client("replica-0", async move {
        case.await;
        Ok(())
    });
    sim
}

impl conformance::Fixture for MemFixture {
    fn transport(&self) -> &dyn ExecutorTransport {
        match &self.hosted {
            Some(hosted) => hosted,
            None => &self.executor,
        }
    }

    fn target(&self) -> &ExecutorTarget {
        &self.target
    }

    fn send_raw(&self, frame: Vec<u8>) -> BoxFuture<'_, Result<ExecutorEnvelope, TransportError>> {
        Box::pin(async move {
            match &self.hosted {
                Some(hosted) => hosted.send_frame(&self.target.environment, &frame).await,
                None => Ok(self.executor.apply_frame(&self.target.environment, &frame)),
            }
        })
    }

    fn symlink(&self, _link: &str, _target: &str) {
        panic!("the in-memory executor has no symlinks; this case is not run against it");
    }

    fn workspace_root(&self) -> String {
        WORKSPACE_ROOT.to_owned()
    }

    fn runs_commands(&self) -> bool {
        false
    }

    fn process_group_alive(&self, _group: i32) -> bool {
        false
    }

    fn process_alive(&self, _pid: i32) -> bool {
        false
    }
}

macro_rules! memory_cases {
    ($module:ident, $hosted:ident => $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = MemFixture::new();
                conformance::$module::$case(&fixture).await;
            }
        )*
        /// The same cases against the executor node, over turmoil TCP.
        mod $hosted {
            use super::*;
            $(
                #[test]
                fn $case() {
                    let mut sim = hosted_simulation(|executor| async move {
                        let fixture = MemFixture::hosted(executor);
                        conformance::$module::$case(&fixture).await;
                    });
                    sim.run().expect("the case runs over the executor node");
                }
            )*
        }
    };
}

memory_cases!(core, core_over_the_node =>
    create_then_read_returns_the_content_and_its_sha256_version,
    create_over_an_existing_file_is_already_exists_and_keeps_the_content,
    replace_with_a_wrong_version_is_version_mismatch_and_changes_nothing,
    replace_with_the_current_version_writes_and_returns_the_new_version,
    missing_files_are_not_found,
    reading_a_directory_is_an_internal_error,
    paths_climbing_out_of_the_workspace_are_permission_denied,
    absolute_paths_outside_the_workspace_are_permission_denied,
    absolute_paths_inside_the_workspace_are_accepted,
    stat_reports_go_file_modes_sizes_and_times,
    remove_deletes_a_file_or_an_empty_directory_and_refuses_a_non_empty_one,
    rename_and_copy_never_clobber,
    resolve_authority_returns_canonical_paths_inside_the_workspace,
    unknown_json_fields_are_invalid_argument,
    two_json_values_are_invalid_argument,
    duplicate_keys_are_invalid_argument,
    oversize_requests_are_resource_exhausted,
    provider_only_and_unknown_operations_are_invalid_argument,
    command_start_requires_an_id_and_a_bounded_command,
);

memory_cases!(bounds, bounds_over_the_node =>
    file_content_at_and_under_the_limit_is_accepted_and_over_it_refused,
    list_at_the_limit_is_accepted_and_over_it_refused,
    concurrent_replaces_with_the_same_version_have_exactly_one_winner,
);

/// Cancellation and deadlines of commands that run for a while (a hand-driven race's command
/// time): the helper's cancel contract (`closing_stdin_cancels_a_running_command`, which needs
/// real processes) in the in-memory model, in process and over the node.
mod cancel {
    use std::time::Duration;

    use execution_provider::executor::protocol::{CommandState, ExecutorRequest};
    use execution_provider::executor::{CancelHandle, CancelSignal, ExecutorTransport};
    use sim::executor::MemExecutor;
    use sim::node::{COMMAND_GRACE, HostedExecutor};

    use super::{MemFixture, hosted_simulation};

    const RUNS: Duration = Duration::from_secs(5);

    fn slow(id: &str, timeout_ms: i64) -> ExecutorRequest {
        let mut request = ExecutorRequest::command(id.to_owned(), "echo done".to_owned());
        request.timeout_ms = timeout_ms;
        request
    }

    fn cancelled_state(
        envelope: execution_provider::executor::ExecutorEnvelope,
    ) -> (CommandState, i32) {
        let status = envelope
            .into_outcome()
            .expect("one outcome")
            .expect("a command status")
            .command
            .expect("command");
        (status.state, status.exit_code)
    }

    /// Runs `slow` with a cancel 1 s in, then waits past its time: the answer says
    /// `cancelled` (-1) and the command never takes effect.
    async fn cancel_one_second_in(transport: &dyn ExecutorTransport, executor: &MemExecutor) {
        let fixture = MemFixture::new();
        let (handle, signal) = CancelHandle::new();
        let running = transport.execute(&fixture.target, slow("c-slow", 0), signal);
        let cancelling = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.cancel();
        };
        let started = tokio::time::Instant::now();
        let (envelope, ()) = tokio::join!(running, cancelling);
        let envelope = envelope.expect("an answer after the cancel");
        assert_eq!(cancelled_state(envelope), (CommandState::Cancelled, -1));
        assert!(
            started.elapsed() < RUNS,
            "the cancel did not stop the command"
        );
        tokio::time::sleep(RUNS * 2).await;
        assert!(executor.effects().is_empty(), "{:?}", executor.effects());
        let cancelled: Vec<String> = executor
            .cancelled()
            .into_iter()
            .map(|e| e.subject)
            .collect();
        assert_eq!(cancelled, ["c-slow"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_command_stops_without_its_effect_and_answers_cancelled() {
        let executor = MemExecutor::new(0, 0.0, Duration::ZERO);
        executor.set_command_time(RUNS);
        cancel_one_second_in(&executor, &executor).await;
    }

    #[test]
    fn a_cancelled_command_over_the_node_stops_without_its_effect_and_answers_cancelled() {
        let mut sim = hosted_simulation(|executor| async move {
            executor.set_command_time(RUNS);
            cancel_one_second_in(&HostedExecutor::new(1), &executor).await;
        });
        sim.run().expect("the case runs over the executor node");
    }

    #[test]
    fn a_command_whose_call_is_abandoned_stops_on_the_node_without_its_effect() {
        let mut sim = hosted_simulation(|executor| async move {
            executor.set_command_time(RUNS);
            let fixture = MemFixture::new();
            let transport = HostedExecutor::new(1);
            let call = transport.execute(&fixture.target, slow("c-gone", 0), CancelSignal::never());
            let abandoned = tokio::time::timeout(Duration::from_secs(1), call).await;
            assert!(abandoned.is_err(), "the command ended before its time");
            tokio::time::sleep(RUNS * 2).await;
            assert!(executor.effects().is_empty(), "{:?}", executor.effects());
            assert_eq!(executor.cancelled().len(), 1, "the node did not stop it");
        });
        sim.run().expect("the case runs over the executor node");
    }

    #[test]
    fn a_command_call_waits_for_the_commands_own_timeout_and_not_the_file_deadline() {
        let mut sim = hosted_simulation(|executor| async move {
            let fixture = MemFixture::new();
            let transport = HostedExecutor::new(1);
            executor.set_command_time(Duration::from_secs(14));
            let envelope = transport
                .execute(
                    &fixture.target,
                    slow("c-long", 15_000),
                    CancelSignal::never(),
                )
                .await
                .expect("a 14 s command within its 15 s timeout is answered");
            assert_eq!(cancelled_state(envelope), (CommandState::Succeeded, 0));
            let started = tokio::time::Instant::now();
            let late = transport
                .execute(
                    &fixture.target,
                    slow("c-late", 10_000),
                    CancelSignal::never(),
                )
                .await
                .expect_err("a 14 s command outlives its 10 s timeout and the grace");
            assert!(late.is_uncontrolled(), "{late}");
            let waited = started.elapsed();
            let deadline = Duration::from_secs(10) + COMMAND_GRACE;
            assert!(
                waited >= deadline && waited < deadline + Duration::from_millis(100),
                "{waited:?}"
            );
            let ran: Vec<String> = executor.effects().into_iter().map(|e| e.subject).collect();
            assert_eq!(
                ran,
                ["c-long"],
                "the late command took effect after its deadline"
            );
            tokio::time::sleep(Duration::from_secs(5)).await;
            let ran: Vec<String> = executor.effects().into_iter().map(|e| e.subject).collect();
            assert_eq!(
                ran,
                ["c-long"],
                "the abandoned late command still took effect"
            );
        });
        sim.run().expect("the case runs over the executor node");
    }
}
