//! The simulator's in-memory executor against the executor conformance cases shared with the
//! real helper (`tests/conformance`), twice: called in process, and hosted on an executor node
//! reached over turmoil TCP through [`HostedExecutor`] (the path replicas take when
//! `world::EXECUTOR_NODES` is above 0). Every case listed here passes both ways; the cases that
//! need what the in-memory model leaves out (symlinks, real processes, glob/grep) are listed in
//! sim/README.md and not run here.

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
    reading_a_file_over_the_limit_is_resource_exhausted,
);

memory_cases!(bounds, bounds_over_the_node =>
    file_content_at_and_under_the_limit_is_accepted_and_over_it_refused,
    list_at_the_limit_is_accepted_and_over_it_refused,
    concurrent_replaces_with_the_same_version_have_exactly_one_winner,
);
