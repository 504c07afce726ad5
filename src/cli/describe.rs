//! `execution-provider client describe`: what one environment looks like now (phase, fence,
//! epoch, executor identities, the operation in flight, the run claim), and the lookup the
//! admin commands use to fill the exact epoch and UIDs they must name.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;
use tonic::transport::Channel;

use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;

/// Which environment `describe` reads.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct DescribeArgs {
    /// One of this client's bindings.
    #[arg(long)]
    pub binding: Option<String>,
    /// An environment id (`exec-...`), for administrators of other creators.
    #[arg(long = "env")]
    pub env: Option<String>,
}

/// Optional revision of `--env` (any incarnation when left out).
#[derive(Debug, Clone, clap::Args)]
pub struct RevisionArg {
    /// The environment revision (default: whichever incarnation exists now).
    #[arg(long = "env-revision", requires = "env")]
    pub revision: Option<String>,
}

/// Asks for the description.
pub async fn fetch(
    client: &mut ExecutionProviderServiceClient<Channel>,
    owner: &pb::Owner,
    args: &DescribeArgs,
    revision: Option<&str>,
) -> anyhow::Result<pb::DescribeEnvironmentResponse> {
    let request = pb::DescribeEnvironmentRequest {
        environment: args.env.as_ref().map(|id| pb::EnvironmentRef {
            id: id.clone(),
            revision: revision.unwrap_or_default().to_owned(),
        }),
        owner: Some(owner.clone()),
        binding_id: args.binding.clone().unwrap_or_default(),
    };
    Ok(client.describe_environment(request).await?.into_inner())
}

/// The JSON and text forms of a description.
pub fn render(d: &pb::DescribeEnvironmentResponse) -> (serde_json::Value, String) {
    let env = d.environment.clone().unwrap_or_default();
    let identity = |o: &Option<pb::ObjectIdentity>| {
        o.as_ref()
            .map(|o| json!({"name": o.name, "uid": o.uid}))
            .unwrap_or(serde_json::Value::Null)
    };
    let operations: Vec<_> = d
        .operations
        .iter()
        .map(|o| {
            json!({"operationId": o.operation_id, "operation": o.operation, "runId": o.run_id,
                "epoch": o.epoch, "holderId": o.holder_id,
                "startedAt": time(o.started_at.as_ref()), "expiresAt": time(o.expires_at.as_ref())})
        })
        .collect();
    let claim = d.run_claim.as_ref().map(|c| {
        json!({"bindingId": c.binding_id, "runId": c.run_id, "epoch": c.epoch,
            "grantGeneration": c.grant_generation, "expiresAt": time(c.expires_at.as_ref()),
            "expired": c.expired})
    });
    let conditions: Vec<_> = d
        .conditions
        .iter()
        .map(|c| json!({"type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message}))
        .collect();
    let value = json!({
        "environment": {"id": env.id, "revision": env.revision},
        "bindingId": d.binding_id, "templateId": d.template_id,
        "templateRevision": d.template_revision, "phase": d.phase, "ready": d.ready,
        "fenceState": d.fence_state, "reason": d.reason, "message": d.message,
        "epoch": d.epoch, "grantGeneration": d.grant_generation,
        "pod": identity(&d.pod), "pvc": identity(&d.pvc), "operations": operations,
        "runClaim": claim, "lifecycle": d.lifecycle.as_ref().map(|l| json!({"operationId": l.operation_id, "type": l.r#type, "phase": l.phase})),
        "conditions": conditions, "schemaVersion": d.schema_version, "deleting": d.deleting,
    });
    (value, text(d))
}

fn text(d: &pb::DescribeEnvironmentResponse) -> String {
    let env = d.environment.clone().unwrap_or_default();
    let name_uid = |o: &Option<pb::ObjectIdentity>| {
        o.as_ref()
            .map_or("-".to_owned(), |o| format!("{} (uid {})", o.name, o.uid))
    };
    let mut lines = vec![
        format!("environment:  {} (revision {})", env.id, env.revision),
        format!("binding:      {}", d.binding_id),
        format!("template:     {} {}", d.template_id, d.template_revision),
        format!("phase:        {}", d.phase),
        format!("fence:        {}", dash(&d.fence_state)),
    ];
    if !d.reason.is_empty() {
        lines.push(format!("not ready:    {}: {}", d.reason, d.message));
    }
    lines.push(format!("epoch:        {}", d.epoch));
    lines.push(format!("grant gen.:   {}", d.grant_generation));
    lines.push(format!("pod:          {}", name_uid(&d.pod)));
    lines.push(format!("pvc:          {}", name_uid(&d.pvc)));
    for o in &d.operations {
        lines.push(format!(
            "operation:    {} {} (run {}, epoch {}, lease until {})",
            o.operation,
            o.operation_id,
            o.run_id,
            o.epoch,
            time(o.expires_at.as_ref())
        ));
    }
    match &d.run_claim {
        Some(c) => lines.push(format!(
            "run claim:    run {} of binding {}, epoch {}, {} {}",
            c.run_id,
            c.binding_id,
            c.epoch,
            if c.expired { "expired at" } else { "until" },
            time(c.expires_at.as_ref())
        )),
        None => lines.push("run claim:    none".to_owned()),
    }
    if let Some(l) = &d.lifecycle {
        lines.push(format!(
            "lifecycle:    {} {} at {}",
            l.r#type, l.operation_id, l.phase
        ));
    }
    for c in &d.conditions {
        lines.push(format!(
            "condition:    {}={} {} {}",
            c.r#type, c.status, c.reason, c.message
        ));
    }
    lines.join("\n")
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// RFC 3339 (UTC, seconds) of a wire timestamp, or `-`.
pub fn time(t: Option<&prost_types::Timestamp>) -> String {
    let Some(t) = t else {
        return "-".to_owned();
    };
    let Ok(secs) = u64::try_from(t.seconds) else {
        return "-".to_owned();
    };
    let at = UNIX_EPOCH + Duration::from_secs(secs);
    k8s_openapi::jiff::Timestamp::try_from(at)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "-".to_owned())
}

/// Asks the operator to confirm `what` on the terminal; `--yes` skips the question. Without a
/// terminal and without `--yes` nothing is done.
pub fn confirm(what: &str, yes: bool) -> anyhow::Result<()> {
    eprintln!("{what}");
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        anyhow::bail!("not confirmed: pass --yes to proceed without a terminal");
    }
    eprint!("proceed? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        anyhow::bail!("not confirmed: nothing was done")
    }
}
