//! `execution-provider client admin ...` and `client revoke`: the administrator lifecycle
//! (store §7) on an exact environment and an exact executor incarnation.

use serde_json::json;
use tonic::transport::Channel;

use super::refs::EnvArgs;
use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;

/// The exact executor incarnation an epoch-based admin operation names.
#[derive(Debug, Clone, clap::Args)]
pub struct ExactArgs {
    #[command(flatten)]
    pub env: EnvArgs,
    /// The execution epoch observed.
    #[arg(long)]
    pub epoch: u64,
    /// The executor Pod UID observed.
    #[arg(long)]
    pub pod_uid: String,
    /// The workspace PVC UID observed.
    #[arg(long)]
    pub pvc_uid: String,
    /// The operation id (a retry with the same id is a replay).
    #[arg(long)]
    pub op: String,
}

/// `client admin ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Retires an unreferenced environment, keeping its workspace.
    Retire(ExactArgs),
    /// Replaces the executor Pod on the same workspace.
    Replace(ExactArgs),
    /// Clears an unknown fence once the exact executor Pod is proven terminated.
    Recover(ExactArgs),
    /// Deletes a retired environment and its workspace.
    DeleteRetired {
        #[command(flatten)]
        env: EnvArgs,
        /// The workspace PVC UID observed.
        #[arg(long)]
        pvc_uid: String,
        /// The operation id.
        #[arg(long)]
        op: String,
    },
    /// Upgrades an environment from an older schema version (refused: none is known).
    Migrate {
        #[command(flatten)]
        env: EnvArgs,
        /// The schema version the environment is expected to have.
        #[arg(long)]
        from_schema: u32,
        /// The executor Pod UID observed.
        #[arg(long)]
        pod_uid: String,
        /// The workspace PVC UID observed.
        #[arg(long)]
        pvc_uid: String,
        /// The operation id.
        #[arg(long)]
        op: String,
    },
}

/// Options of `client revoke`.
#[derive(Debug, Clone, clap::Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    pub env: EnvArgs,
    /// The grant generation to revoke.
    #[arg(long)]
    pub expected_generation: u64,
    /// The operation id (a retry with the same id is a replay).
    #[arg(long)]
    pub op: String,
}

/// Runs `client revoke`.
pub async fn revoke(
    mut client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    args: RevokeArgs,
) -> anyhow::Result<(serde_json::Value, String)> {
    let request = pb::RevokeEnvironmentRequest {
        environment: Some(args.env.wire()),
        owner: Some(owner),
        expected_grant_generation: args.expected_generation,
        operation_id: args.op,
    };
    let generation = client
        .revoke_environment(request)
        .await?
        .into_inner()
        .grant_generation;
    Ok((
        json!({"grantGeneration": generation}),
        format!("revoked; grant generation now {generation}"),
    ))
}

/// Runs a `client admin` command.
pub async fn run(
    mut client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    command: AdminCommand,
) -> anyhow::Result<(serde_json::Value, String)> {
    let done = |what: &str| Ok((json!({"ok": true}), what.to_owned()));
    let o = Some(owner);
    match command {
        AdminCommand::Retire(a) => {
            let r = pb::RetireEnvironmentRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: a.epoch,
                expected_pod_uid: a.pod_uid,
                expected_pvc_uid: a.pvc_uid,
                operation_id: a.op,
            };
            client.retire_environment(r).await?;
            done("retirement admitted")
        }
        AdminCommand::Replace(a) => {
            let r = pb::ReplaceExecutorRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: a.epoch,
                expected_pod_uid: a.pod_uid,
                expected_pvc_uid: a.pvc_uid,
                operation_id: a.op,
            };
            client.replace_executor(r).await?;
            done("replacement admitted")
        }
        AdminCommand::Recover(a) => {
            let r = pb::RecoverEnvironmentRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: a.epoch,
                expected_pod_uid: a.pod_uid,
                expected_pvc_uid: a.pvc_uid,
                operation_id: a.op,
            };
            client.recover_environment(r).await?;
            done("recovered")
        }
        AdminCommand::DeleteRetired { env, pvc_uid, op } => {
            let r = pb::DeleteRetiredEnvironmentRequest {
                environment: Some(env.wire()),
                owner: o,
                expected_pvc_uid: pvc_uid,
                operation_id: op,
            };
            client.delete_retired_environment(r).await?;
            done("deletion admitted")
        }
        AdminCommand::Migrate {
            env,
            from_schema,
            pod_uid,
            pvc_uid,
            op,
        } => {
            let r = pb::MigrateEnvironmentRequest {
                environment: Some(env.wire()),
                owner: o,
                expected_schema_version: Some(from_schema),
                expected_pod_uid: pod_uid,
                expected_pvc_uid: pvc_uid,
                operation_id: op,
            };
            client.migrate_environment(r).await?;
            done("migrated")
        }
    }
}
