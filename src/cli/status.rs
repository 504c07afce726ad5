//! `execution-provider client status`: one line per environment of the current owner, from
//! the RPCs that exist: `DescribeEnvironment` of every binding named with `--binding`, and of
//! every environment the owner's pending reference intents (`ListReferenceIntents`) name. The
//! wire has no listing of an owner's published environments, so a binding that is neither
//! named nor pending is not shown.

use std::collections::BTreeSet;

use serde_json::json;
use tonic::transport::Channel;

use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;

/// Options of `client status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// A binding of this client to include (repeatable).
    #[arg(long = "binding")]
    pub bindings: Vec<String>,
}

/// One environment as the summary shows it, or a binding that could not be described.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// A description.
    Described(Box<pb::DescribeEnvironmentResponse>),
    /// A named binding the provider did not describe (no environment, or refused).
    Missing {
        /// The binding.
        binding: String,
        /// Why, as `<gRPC code> (<ErrorDetail.code>)`.
        why: String,
    },
}

/// Describes the named bindings and the environments of the owner's pending intents.
pub async fn collect(
    mut client: ExecutionProviderServiceClient<Channel>,
    owner: &pb::Owner,
    args: &StatusArgs,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    for binding in &args.bindings {
        let request = pb::DescribeEnvironmentRequest {
            environment: None,
            owner: Some(owner.clone()),
            binding_id: binding.clone(),
        };
        match client.describe_environment(request).await {
            Ok(d) => {
                let d = d.into_inner();
                seen.insert(d.environment.clone().unwrap_or_default().id);
                rows.push(Row::Described(Box::new(d)));
            }
            Err(status) => rows.push(Row::Missing {
                binding: binding.clone(),
                why: super::describe(&anyhow::Error::from(status)),
            }),
        }
    }
    let intents = client
        .list_reference_intents(pb::ListReferenceIntentsRequest {
            owner: Some(owner.clone()),
            ..Default::default()
        })
        .await?
        .into_inner()
        .intents;
    for intent in intents {
        let env = intent.environment.unwrap_or_default();
        if !seen.insert(env.id.clone()) {
            continue;
        }
        let request = pb::DescribeEnvironmentRequest {
            environment: Some(pb::EnvironmentRef {
                id: env.id,
                revision: String::new(),
            }),
            owner: Some(owner.clone()),
            binding_id: String::new(),
        };
        if let Ok(d) = client.describe_environment(request).await {
            rows.push(Row::Described(Box::new(d.into_inner())));
        }
    }
    Ok(rows)
}

/// The JSON and text forms of the summary: a header line, one line per row, and a count by
/// phase.
pub fn render(rows: &[Row]) -> (serde_json::Value, String) {
    let mut lines =
        vec!["BINDING\tENVIRONMENT\tPHASE\tFENCE\tEPOCH\tRUN CLAIM\tNOT READY".to_owned()];
    let mut items = Vec::new();
    let mut phases = std::collections::BTreeMap::<String, usize>::new();
    for row in rows {
        match row {
            Row::Described(d) => {
                let env = d.environment.clone().unwrap_or_default();
                *phases.entry(d.phase.clone()).or_default() += 1;
                let claim = d.run_claim.as_ref().filter(|c| !c.expired).map(|c| {
                    format!(
                        "{} until {}",
                        c.run_id,
                        super::describe::time(c.expires_at.as_ref())
                    )
                });
                let not_ready = if d.reason.is_empty() {
                    "-".to_owned()
                } else {
                    d.reason.clone()
                };
                lines.push(format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    d.binding_id,
                    env.id,
                    d.phase,
                    if d.fence_state.is_empty() {
                        "-"
                    } else {
                        &d.fence_state
                    },
                    d.epoch,
                    claim.as_deref().unwrap_or("-"),
                    not_ready
                ));
                items.push(json!({
                    "bindingId": d.binding_id,
                    "environment": {"id": env.id, "revision": env.revision},
                    "phase": d.phase, "ready": d.ready, "fenceState": d.fence_state,
                    "epoch": d.epoch, "reason": d.reason,
                    "runClaim": d.run_claim.as_ref().map(|c| json!({"runId": c.run_id,
                        "expiresAt": super::describe::time(c.expires_at.as_ref()), "expired": c.expired})),
                }));
            }
            Row::Missing { binding, why } => {
                lines.push(format!("{binding}\t-\t-\t-\t-\t-\t{why}"));
                items.push(json!({"bindingId": binding, "error": why}));
            }
        }
    }
    let described: usize = phases.values().sum();
    let summary = phases
        .iter()
        .map(|(phase, n)| format!("{n} {phase}"))
        .collect::<Vec<_>>()
        .join(", ");
    lines.push(if described == 0 {
        "no environments (name bindings with --binding)".to_owned()
    } else {
        format!("{described} environments: {summary}")
    });
    (
        json!({"environments": items, "phases": phases}),
        lines.join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(binding: &str, phase: &str, reason: &str) -> Row {
        Row::Described(Box::new(pb::DescribeEnvironmentResponse {
            environment: Some(pb::EnvironmentRef {
                id: format!("exec-{binding}"),
                revision: "1".into(),
            }),
            binding_id: binding.into(),
            phase: phase.into(),
            ready: phase == "Ready",
            fence_state: "Healthy".into(),
            reason: reason.into(),
            epoch: 2,
            ..Default::default()
        }))
    }

    #[test]
    fn one_line_per_environment_and_a_count_by_phase() {
        let rows = [
            described("a", "Ready", ""),
            described("b", "Provisioning", "PodNotReady"),
            described("c", "Ready", ""),
            Row::Missing {
                binding: "gone".into(),
                why: "NotFound (not_found): environment not found".into(),
            },
        ];
        let (value, text) = render(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert_eq!(lines[1], "a\texec-a\tReady\tHealthy\t2\t-\t-");
        assert_eq!(
            lines[2],
            "b\texec-b\tProvisioning\tHealthy\t2\t-\tPodNotReady"
        );
        assert!(lines[4].starts_with("gone\t-\t"), "{text}");
        assert_eq!(lines[5], "3 environments: 1 Provisioning, 2 Ready");
        assert_eq!(value["phases"]["Ready"], 2);
        assert_eq!(value["environments"][3]["bindingId"], "gone");
    }

    #[test]
    fn an_empty_summary_says_how_to_name_bindings() {
        let (_, text) = render(&[]);
        assert!(text.ends_with("no environments (name bindings with --binding)"));
    }
}
