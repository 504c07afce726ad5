//! `execution-provider client admin ...` and `client revoke`: the administrator lifecycle
//! (store §7) on an exact environment and an exact executor incarnation.

use serde_json::json;
use tonic::transport::Channel;

use super::describe::{self, DescribeArgs};
use super::refs::EnvArgs;
use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use crate::runtime::{IdSource, OsIds};

/// The exact executor incarnation an epoch-based admin operation names. The epoch and the
/// UIDs left out are read from `DescribeEnvironment`, printed, and confirmed before anything
/// is sent (`--yes` confirms without asking).
#[derive(Debug, Clone, clap::Args)]
pub struct ExactArgs {
    #[command(flatten)]
    pub env: EnvArgs,
    /// The execution epoch observed (default: the current one).
    #[arg(long)]
    pub epoch: Option<u64>,
    /// The executor Pod UID observed (default: the current one).
    #[arg(long)]
    pub pod_uid: Option<String>,
    /// The workspace PVC UID observed (default: the current one).
    #[arg(long)]
    pub pvc_uid: Option<String>,
    /// The operation id; a retry with the same id is a replay (default: a fresh one, printed).
    #[arg(long)]
    pub op: Option<String>,
    /// Proceed without asking when values were filled in from the description.
    #[arg(long)]
    pub yes: bool,
}

/// The exact identity an admin request sends.
struct Exact {
    epoch: u64,
    pod_uid: String,
    pvc_uid: String,
    op: String,
}

impl ExactArgs {
    /// The identity to send: as given, or completed from the environment's description and
    /// confirmed by the operator.
    async fn resolve(
        &self,
        client: &mut ExecutionProviderServiceClient<Channel>,
        owner: &pb::Owner,
        verb: &str,
    ) -> anyhow::Result<Exact> {
        let op = self
            .op
            .clone()
            .unwrap_or_else(|| format!("cli-{verb}-{}", OsIds.hex(8)));
        if let (Some(epoch), Some(pod), Some(pvc)) = (self.epoch, &self.pod_uid, &self.pvc_uid) {
            return Ok(Exact {
                epoch,
                pod_uid: pod.clone(),
                pvc_uid: pvc.clone(),
                op,
            });
        }
        let target = DescribeArgs {
            binding: None,
            env: Some(self.env.id.clone()),
        };
        let d = describe::fetch(client, owner, &target, Some(&self.env.revision)).await?;
        let uid = |o: &Option<pb::ObjectIdentity>| o.as_ref().map(|o| o.uid.clone());
        let exact = Exact {
            epoch: self.epoch.unwrap_or(d.epoch),
            pod_uid: self
                .pod_uid
                .clone()
                .or_else(|| uid(&d.pod))
                .unwrap_or_default(),
            pvc_uid: self
                .pvc_uid
                .clone()
                .or_else(|| uid(&d.pvc))
                .unwrap_or_default(),
            op,
        };
        describe::confirm(
            &format!(
                "{verb} {} (phase {}, fence {}): --epoch {} --pod-uid {} --pvc-uid {} --op {}",
                self.env.id,
                d.phase,
                d.fence_state,
                exact.epoch,
                exact.pod_uid,
                exact.pvc_uid,
                exact.op
            ),
            self.yes,
        )?;
        Ok(exact)
    }
}

/// `client admin ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Retires an unreferenced environment, keeping its workspace.
    #[command(after_help = crate::cli::examples::ADMIN_RETIRE)]
    Retire(ExactArgs),
    /// Replaces the executor Pod on the same workspace.
    #[command(after_help = crate::cli::examples::ADMIN_REPLACE)]
    Replace(ExactArgs),
    /// Clears an unknown fence once the exact executor Pod is proven terminated.
    #[command(after_help = crate::cli::examples::ADMIN_RECOVER)]
    Recover(ExactArgs),
    /// Deletes a retired environment and its workspace.
    #[command(after_help = crate::cli::examples::ADMIN_DELETE_RETIRED)]
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
    #[command(after_help = crate::cli::examples::ADMIN_MIGRATE)]
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
    let done = |what: &str, op: &str| {
        Ok((
            json!({"ok": true, "operationId": op}),
            format!("{what} (operation {op})"),
        ))
    };
    let o = Some(owner.clone());
    match command {
        AdminCommand::Retire(a) => {
            let x = a.resolve(&mut client, &owner, "retire").await?;
            let r = pb::RetireEnvironmentRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: x.epoch,
                expected_pod_uid: x.pod_uid,
                expected_pvc_uid: x.pvc_uid,
                operation_id: x.op.clone(),
            };
            client.retire_environment(r).await?;
            done("retirement admitted", &x.op)
        }
        AdminCommand::Replace(a) => {
            let x = a.resolve(&mut client, &owner, "replace").await?;
            let r = pb::ReplaceExecutorRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: x.epoch,
                expected_pod_uid: x.pod_uid,
                expected_pvc_uid: x.pvc_uid,
                operation_id: x.op.clone(),
            };
            client.replace_executor(r).await?;
            done("replacement admitted", &x.op)
        }
        AdminCommand::Recover(a) => {
            let x = a.resolve(&mut client, &owner, "recover").await?;
            let r = pb::RecoverEnvironmentRequest {
                environment: Some(a.env.wire()),
                owner: o,
                expected_execution_epoch: x.epoch,
                expected_pod_uid: x.pod_uid,
                expected_pvc_uid: x.pvc_uid,
                operation_id: x.op.clone(),
            };
            client.recover_environment(r).await?;
            done("recovered", &x.op)
        }
        AdminCommand::DeleteRetired { env, pvc_uid, op } => {
            let r = pb::DeleteRetiredEnvironmentRequest {
                environment: Some(env.wire()),
                owner: o,
                expected_pvc_uid: pvc_uid,
                operation_id: op,
            };
            client.delete_retired_environment(r.clone()).await?;
            done("deletion admitted", &r.operation_id)
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
            client.migrate_environment(r.clone()).await?;
            done("migrated", &r.operation_id)
        }
    }
}
