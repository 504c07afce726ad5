//! End-to-end tests against a real Kubernetes control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler and kwok on 127.0.0.1, built from Go modules by
//! `tests/e2e/bin/build-bins.sh` and started by `tests/e2e/bin/start-control-plane.sh`), and a
//! real node beside it for the `real_node` tests (`tests/e2e/real_node.rs`).
//!
//! A `libtest-mimic` harness (`harness = false`), so that whether the cluster tests can run is
//! decided at run time: against `E2E_KUBECONFIG` when it is given, else against a control plane
//! this run builds (on first use) and starts itself; where neither is possible the cluster
//! tests are reported *ignored* with the reason (under `CI`, failed), never passed. Each test
//! takes its own namespace. See docs/e2e.md.

use std::future::Future;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

mod cluster;
mod commands;
#[path = "../common/mod.rs"]
mod common;
mod control_plane;
mod crd;
mod crd_admission;
mod fixtures;
mod flow;
mod foreground_delete;
#[path = "../k8s_bins/mod.rs"]
mod k8s_bins;
mod kwok_exec;
mod lifecycle;
mod pod_exec;
mod provider;
mod real_node;
mod recovery;
mod rolling;
mod upgrade_guard;

use cluster::Cluster;
use control_plane::Availability;

/// A test that needs the control plane: it runs on a runtime of its own (as
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` would) once one is up.
fn cluster_test<F, Fut>(name: &str, test: F) -> Trial
where
    F: FnOnce(Cluster) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::ignorable_test(name, move || match control_plane::availability() {
        Availability::Ready(cluster) => {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| Failed::from(format!("no tokio runtime: {e}")))?
                .block_on(test(cluster));
            Ok(Completion::Completed)
        }
        Availability::Impossible(reason) => Ok(Completion::ignored_with(reason)),
        Availability::Broken(failure) => Err(failure.into()),
    })
}

/// A test that needs the real node (a kubelet with containerd, runc and gVisor) beside the
/// control plane: ignored with the reason where neither or the node cannot run here.
fn node_test<F, Fut>(name: &str, test: F) -> Trial
where
    F: FnOnce(Cluster, real_node::RealNode) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::ignorable_test(name, move || {
        let cluster = match control_plane::availability() {
            Availability::Ready(cluster) => cluster,
            Availability::Impossible(reason) => return Ok(Completion::ignored_with(reason)),
            Availability::Broken(failure) => return Err(failure.into()),
        };
        let node = match real_node::availability(&cluster) {
            real_node::NodeAvailability::Ready(node) => node,
            real_node::NodeAvailability::Impossible(reason) => {
                return Ok(Completion::ignored_with(reason));
            }
            real_node::NodeAvailability::Broken(failure) => return Err(failure.into()),
        };
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Failed::from(format!("no tokio runtime: {e}")))?
            .block_on(test(cluster, node));
        Ok(Completion::Completed)
    })
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        cluster_test(
            "commands::a_detached_server_loop_outlives_its_serve_and_a_second_serve_follows_and_cancels_it",
            commands::a_detached_server_loop_outlives_its_serve_and_a_second_serve_follows_and_cancels_it,
        ),
        cluster_test(
            "crd::the_api_server_enforces_the_crd_and_kubectl_shows_its_printer_columns",
            crd::the_api_server_enforces_the_crd_and_kubectl_shows_its_printer_columns,
        ),
        cluster_test(
            "crd_admission::the_api_server_refuses_a_change_of_every_immutable_spec_field",
            crd_admission::the_api_server_refuses_a_change_of_every_immutable_spec_field,
        ),
        cluster_test(
            "crd_admission::the_api_server_admits_schema_version_2_only_in_spec_and_status",
            crd_admission::the_api_server_admits_schema_version_2_only_in_spec_and_status,
        ),
        cluster_test(
            "crd_admission::pruning_keeps_every_controller_owned_status_field_and_drops_removed_ones",
            crd_admission::pruning_keeps_every_controller_owned_status_field_and_drops_removed_ones,
        ),
        cluster_test(
            "flow::a_client_allocates_runs_commands_and_files_through_pods_exec_and_releases",
            flow::a_client_allocates_runs_commands_and_files_through_pods_exec_and_releases,
        ),
        cluster_test(
            "flow::a_provider_crash_mid_flow_loses_nothing_and_the_next_process_serves_the_same_claim",
            flow::a_provider_crash_mid_flow_loses_nothing_and_the_next_process_serves_the_same_claim,
        ),
        cluster_test(
            "flow::two_replicas_serve_one_environment_and_exactly_one_concurrent_claim_wins",
            flow::two_replicas_serve_one_environment_and_exactly_one_concurrent_claim_wins,
        ),
        cluster_test(
            "foreground_delete::a_foreground_cascading_delete_leaves_the_executor_pod_and_the_workspace",
            foreground_delete::a_foreground_cascading_delete_leaves_the_executor_pod_and_the_workspace,
        ),
        cluster_test(
            "lifecycle::revoke_refuses_old_grants_and_retire_then_delete_remove_pod_then_workspace",
            lifecycle::revoke_refuses_old_grants_and_retire_then_delete_remove_pod_then_workspace,
        ),
        cluster_test(
            "pod_exec::the_pod_exec_transport_runs_the_helper_in_a_kwok_pod_through_the_api_server",
            pod_exec::the_pod_exec_transport_runs_the_helper_in_a_kwok_pod_through_the_api_server,
        ),
        cluster_test(
            "recovery::a_serve_killed_mid_command_is_recovered_by_itself_and_a_manual_template_by_the_documented_path",
            recovery::a_serve_killed_mid_command_is_recovered_by_itself_and_a_manual_template_by_the_documented_path,
        ),
        cluster_test(
            "recovery::an_executor_pod_deleted_mid_command_is_recovered_by_itself_and_the_call_answers_fence_unknown",
            recovery::an_executor_pod_deleted_mid_command_is_recovered_by_itself_and_the_call_answers_fence_unknown,
        ),
        cluster_test(
            "rolling::a_rolling_upgrade_keeps_every_environment_serving_and_detached_commands_running",
            rolling::a_rolling_upgrade_keeps_every_environment_serving_and_detached_commands_running,
        ),
        cluster_test(
            "upgrade_guard::the_upgrade_guard_sees_the_live_namespace",
            upgrade_guard::the_upgrade_guard_sees_the_live_namespace,
        ),
        node_test(
            "real_node::a_killed_node_and_a_stopped_one_leave_the_host_as_they_found_it",
            real_node::a_killed_node_and_a_stopped_one_leave_the_host_as_they_found_it,
        ),
        node_test(
            "real_node::under_runc_the_executor_runs_hardened_and_serves_files_and_commands_through_the_kubelet",
            real_node::under_runc_the_executor_runs_hardened_and_serves_files_and_commands_through_the_kubelet,
        ),
        node_test(
            "real_node::under_gvisor_the_executor_runs_hardened_on_gvisors_kernel_and_serves_files_and_commands",
            real_node::under_gvisor_the_executor_runs_hardened_on_gvisors_kernel_and_serves_files_and_commands,
        ),
        node_test(
            "real_node::under_runc_the_workload_cannot_read_signal_or_outlive_the_supervisor",
            real_node::under_runc_the_workload_cannot_read_signal_or_outlive_the_supervisor,
        ),
        node_test(
            "real_node::under_gvisor_the_workload_cannot_read_or_outlive_the_supervisor",
            real_node::under_gvisor_the_workload_cannot_read_or_outlive_the_supervisor,
        ),
        // A gap this suite found in gVisor (docs/commands.md §9): fails, so ignored; run it
        // with `--ignored`.
        node_test(
            "real_node::under_gvisor_sigkill_and_sigstop_from_the_workload_leave_the_supervisor_running",
            real_node::under_gvisor_sigkill_and_sigstop_from_the_workload_leave_the_supervisor_running,
        )
        .with_ignored_flag(true),
        node_test(
            "real_node::the_default_deny_policy_cuts_the_executor_off_from_other_pods_while_exec_keeps_working",
            real_node::the_default_deny_policy_cuts_the_executor_off_from_other_pods_while_exec_keeps_working,
        ),
        node_test(
            "real_node::a_workspace_survives_the_replacement_of_its_pod_on_the_real_volume",
            real_node::a_workspace_survives_the_replacement_of_its_pod_on_the_real_volume,
        ),
        Trial::test(
            "fixtures::the_suite_template_catalogue_loads_with_the_revision_the_crate_computes",
            || {
                fixtures::the_suite_template_catalogue_loads_with_the_revision_the_crate_computes();
                Ok(())
            },
        ),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    // The real node first (its kubelet talks to the control plane); a host it did not leave
    // as it found it fails the run.
    let node_stopped = real_node::stop_if_started();
    control_plane::stop_if_started();
    match node_stopped {
        Ok(()) => conclusion.exit_code(),
        Err(difference) => {
            eprintln!("error: {difference}");
            std::process::ExitCode::FAILURE
        }
    }
}
