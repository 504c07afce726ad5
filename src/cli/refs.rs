//! `execution-provider client refs ...`: the binding-reference transactions and their
//! discovery (store §6), on an exact environment named by id and revision.

use serde_json::json;
use tonic::transport::Channel;

use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;

/// The exact environment a command works on.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvArgs {
    /// The environment id (`exec-...`).
    #[arg(long = "env")]
    pub id: String,
    /// The environment revision.
    #[arg(long = "env-revision")]
    pub revision: String,
}

impl EnvArgs {
    /// The wire reference.
    pub fn wire(&self) -> pb::EnvironmentRef {
        pb::EnvironmentRef {
            id: self.id.clone(),
            revision: self.revision.clone(),
        }
    }
}

/// One exact reference transition.
#[derive(Debug, Clone, clap::Args)]
pub struct MutationArgs {
    #[command(flatten)]
    pub env: EnvArgs,
    /// The binding whose reference moves.
    #[arg(long)]
    pub binding: String,
    /// The transaction's operation id.
    #[arg(long)]
    pub op: String,
}

/// `client refs ...`.
#[derive(Debug, clap::Subcommand)]
pub enum RefsCommand {
    /// Lists pending intents: exact (--env and --binding), for the owner, or (--all-owners)
    /// for every owner of this client.
    #[command(after_help = crate::cli::examples::REFS_LIST)]
    List {
        /// Exact lookup on this environment (with --env-revision and --binding).
        #[arg(long = "env", requires_all = ["revision", "binding"])]
        id: Option<String>,
        /// The environment revision of an exact lookup.
        #[arg(long = "env-revision")]
        revision: Option<String>,
        /// The binding of an exact lookup.
        #[arg(long)]
        binding: Option<String>,
        /// Every owner of this client instead of the attested owner.
        #[arg(long, conflicts_with = "id")]
        all_owners: bool,
        /// At most this many (0: 64).
        #[arg(long, default_value_t = 0)]
        limit: i32,
    },
    /// Reserves a successor binding next to a published one.
    #[command(after_help = crate::cli::examples::REFS_RESERVE)]
    Reserve {
        #[command(flatten)]
        env: EnvArgs,
        /// The published source binding.
        #[arg(long)]
        source: String,
        /// The new binding.
        #[arg(long)]
        destination: String,
        /// The reservation's operation id.
        #[arg(long)]
        op: String,
    },
    /// Publishes a pending reference.
    #[command(after_help = crate::cli::examples::REFS_COMMIT)]
    Commit(MutationArgs),
    /// Drops a pending reference.
    #[command(after_help = crate::cli::examples::REFS_ABORT)]
    Abort(MutationArgs),
    /// Starts deleting a published reference.
    #[command(after_help = crate::cli::examples::REFS_PREPARE_DELETE)]
    PrepareDelete(MutationArgs),
    /// Finishes deleting a reference.
    #[command(after_help = crate::cli::examples::REFS_CONFIRM_DELETE)]
    ConfirmDelete(MutationArgs),
    /// Returns a reference being deleted to published.
    #[command(after_help = crate::cli::examples::REFS_CANCEL_DELETE)]
    CancelDelete(MutationArgs),
}

fn mutation(m: &MutationArgs, owner: &pb::Owner) -> pb::ReferenceMutationRequest {
    pb::ReferenceMutationRequest {
        environment: Some(m.env.wire()),
        owner: Some(owner.clone()),
        binding_id: m.binding.clone(),
        operation_id: m.op.clone(),
    }
}

fn intent_json(i: &pb::ReferenceIntent) -> serde_json::Value {
    let env = i.environment.clone().unwrap_or_default();
    let owner = i.owner.clone().unwrap_or_default();
    json!({
        "environment": {"id": env.id, "revision": env.revision},
        "bindingId": i.binding_id, "state": i.state, "operationId": i.operation_id,
        "sourceBindingId": i.source_binding_id,
        "owner": {"issuer": owner.issuer, "subject": owner.subject},
    })
}

/// Runs a `refs` command; returns what to print as (JSON, text).
pub async fn run(
    mut client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    command: RefsCommand,
) -> anyhow::Result<(serde_json::Value, String)> {
    let done = |what: &str| Ok((json!({"ok": true}), what.to_owned()));
    match command {
        RefsCommand::List {
            id,
            revision,
            binding,
            all_owners,
            limit,
        } => {
            let request = pb::ListReferenceIntentsRequest {
                owner: (!all_owners).then(|| owner.clone()),
                limit,
                environment: id.map(|id| pb::EnvironmentRef {
                    id,
                    revision: revision.unwrap_or_default(),
                }),
                binding_id: binding.unwrap_or_default(),
            };
            let list = client.list_reference_intents(request).await?.into_inner();
            let items: Vec<_> = list.intents.iter().map(intent_json).collect();
            let text = list
                .intents
                .iter()
                .map(|i| {
                    let env = i.environment.clone().unwrap_or_default();
                    format!(
                        "{}\t{}\t{}\t{}",
                        env.id, i.binding_id, i.state, i.operation_id
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((json!({"intents": items}), text))
        }
        RefsCommand::Reserve {
            env,
            source,
            destination,
            op,
        } => {
            let request = pb::ReserveSuccessorRequest {
                environment: Some(env.wire()),
                owner: Some(owner),
                source_binding_id: source,
                destination_binding_id: destination,
                operation_id: op,
            };
            client.reserve_successor(request).await?;
            done("reserved")
        }
        RefsCommand::Commit(m) => {
            client.commit_reference(mutation(&m, &owner)).await?;
            done("committed")
        }
        RefsCommand::Abort(m) => {
            client.abort_reference(mutation(&m, &owner)).await?;
            done("aborted")
        }
        RefsCommand::PrepareDelete(m) => {
            client
                .prepare_reference_delete(mutation(&m, &owner))
                .await?;
            done("delete prepared")
        }
        RefsCommand::ConfirmDelete(m) => {
            client
                .confirm_reference_delete(mutation(&m, &owner))
                .await?;
            done("deleted")
        }
        RefsCommand::CancelDelete(m) => {
            client.cancel_reference_delete(mutation(&m, &owner)).await?;
            done("delete cancelled")
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn parses(args: &[&str]) -> bool {
        let mut full = vec!["execution-provider", "client"];
        full.extend_from_slice(args);
        matches!(
            Cli::try_parse_from(full).map(|c| c.command),
            Ok(Command::Client(_))
        )
    }

    #[test]
    fn the_refs_admin_and_revoke_subcommands_parse_and_require_their_identities() {
        assert!(parses(&["refs", "list", "--all-owners"]));
        assert!(parses(&[
            "refs",
            "list",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--binding",
            "b"
        ]));
        assert!(!parses(&["refs", "list", "--env", "e"]));
        assert!(parses(&[
            "refs",
            "reserve",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--source",
            "a",
            "--destination",
            "b",
            "--op",
            "o"
        ]));
        assert!(parses(&[
            "refs",
            "commit",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--binding",
            "b",
            "--op",
            "o"
        ]));
        assert!(!parses(&[
            "refs",
            "commit",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--binding",
            "b"
        ]));
        assert!(parses(&[
            "admin",
            "retire",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--epoch",
            "2",
            "--pod-uid",
            "p",
            "--pvc-uid",
            "v",
            "--op",
            "o"
        ]));
        // The epoch and UIDs left out are filled from DescribeEnvironment and confirmed.
        assert!(parses(&[
            "admin",
            "retire",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--op",
            "o"
        ]));
        assert!(!parses(&["admin", "retire", "--env", "e", "--epoch", "2"]));
        assert!(parses(&[
            "admin",
            "delete-retired",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--pvc-uid",
            "v",
            "--op",
            "o"
        ]));
        assert!(parses(&[
            "revoke",
            "--env",
            "e",
            "--env-revision",
            "r",
            "--expected-generation",
            "1",
            "--op",
            "o"
        ]));
    }
}
