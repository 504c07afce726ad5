//! Scripted client calls (`Action::Call`): a hand-driven race names exactly which platform
//! client calls which replica, for which owner and binding, at which simulated time. Each
//! scripted host (a turmoil client host of its own, added when the world is built) makes its
//! calls in time order and traces each as `HOST WHAT BINDING via replica-I -> OUTCOME`.

use std::collections::BTreeMap;
use std::time::Duration;

use execution_provider::api::pb;
use execution_provider::runtime::tls::Identity;
use rustls::pki_types::CertificateDer;

use super::{Record, channel, definitively_refused, outcome};

/// The run id of a scripted acquire by `host` of `binding` (also the marker a
/// [`crate::peer::CreatorChange`] can wait for).
pub fn run_id(host: &str, binding: &str) -> String {
    format!("{host}-run-{binding}")
}

/// One scripted call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The turmoil host making it (one host per name; its calls run in time order).
    pub host: String,
    /// The platform whose admitted client identity it presents (`world::platform_of`).
    pub platform: usize,
    /// The replica it calls.
    pub replica: u32,
    /// The attested owner's subject.
    pub owner: String,
    /// The binding.
    pub binding: String,
    /// What it asks.
    pub request: Request,
}

/// What a scripted call asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `EnsureTemplate` with this template id (at its listed revision), then, when it
    /// succeeds, `CommitReference` (as a platform does).
    Ensure(String),
    /// `AcquireRun` on the environment this host's last successful ensure of the binding
    /// returned (the run id is [`run_id`], with `-N` added for the host's Nth acquire of the
    /// binding, as is its operation id); a NOT_FOUND refusal is compared with the refusal
    /// of the same request naming an absent environment (traced ` as absent` or
    /// ` unlike absent (OUTCOME)`), and a definitive refusal's operation id goes to the
    /// history check (§10.6: it must appear nowhere in a stored status).
    Acquire,
    /// `StartCommand` with `detach` of this command text, under the claim this host's last
    /// successful acquire of the binding returned (traced `detach ... -> OUTCOME [ID]`).
    Detach(String),
}

/// What every scripted host shares.
#[derive(Clone)]
pub struct Desk {
    /// The admitted client identity of each platform.
    pub identities: Vec<Identity>,
    /// The CA of the replicas' server certificate.
    pub server_cas: Vec<CertificateDer<'static>>,
    /// The record (trace, acknowledged ensures).
    pub record: Record,
}

/// Runs one scripted host: each call at its time (simulated, from the start of the run).
pub async fn run(desk: Desk, mut calls: Vec<(Duration, Call)>) -> turmoil::Result {
    calls.sort_by_key(|(at, _)| *at);
    let mut held = Held::default();
    for (at, call) in calls {
        let now = turmoil::sim_elapsed().unwrap_or_default();
        tokio::time::sleep(at.saturating_sub(now)).await;
        desk.make(&call, &mut held).await;
    }
    Ok(())
}

fn owner(subject: &str) -> pb::Owner {
    pb::Owner {
        issuer: "https://issuer.sim".into(),
        subject: subject.to_owned(),
    }
}

/// What a scripted host's calls returned, by binding: the environment its last successful
/// ensure returned, the claim its last successful acquire returned, and how many acquires it
/// made.
#[derive(Default)]
struct Held {
    environments: BTreeMap<String, pb::EnvironmentRef>,
    claims: BTreeMap<String, pb::RunClaimResponse>,
    acquires: BTreeMap<String, u32>,
}

impl Desk {
    fn client(&self, call: &Call) -> super::Client {
        let identity = self.identities.get(call.platform).unwrap_or_else(|| {
            panic!(
                "a scripted call names platform {}, which does not exist",
                call.platform
            )
        });
        channel(
            &crate::world::replica_host(call.replica),
            identity,
            &self.server_cas,
        )
    }

    fn trace(&self, call: &Call, what: &str, result: String) {
        self.record.trace.record(
            &call.host,
            format!(
                "{what} {} via replica-{} -> {result}",
                call.binding, call.replica
            ),
        );
        *self.record.calls.lock().expect("calls lock") += 1;
    }

    async fn make(&self, call: &Call, held: &mut Held) {
        match &call.request {
            Request::Ensure(template) => {
                if let Some(env) = self.ensure(call, template).await {
                    held.environments.insert(call.binding.clone(), env);
                }
            }
            Request::Detach(command) => self.detach(call, command, held).await,
            Request::Acquire => {
                // A later acquire of the same binding is another request: ids of its own.
                let count = held.acquires.entry(call.binding.clone()).or_default();
                *count += 1;
                let again = if *count == 1 {
                    String::new()
                } else {
                    format!("-{count}")
                };
                let request = pb::AcquireRunRequest {
                    environment: held.environments.get(&call.binding).cloned(),
                    owner: Some(owner(&call.owner)),
                    binding_id: call.binding.clone(),
                    operation_id: format!("{}-acquire-{}{again}", call.host, call.binding),
                    run_id: format!("{}{again}", run_id(&call.host, &call.binding)),
                    ttl_millis: 30_000,
                };
                let result = self.client(call).acquire_run(request.clone()).await;
                if let Ok(claim) = &result {
                    held.claims
                        .insert(call.binding.clone(), claim.get_ref().clone());
                }
                if definitively_refused(&result) {
                    let mut refused = self.record.refused.lock().expect("refused lock");
                    refused.insert(request.operation_id.clone());
                }
                let mut traced = outcome(&result);
                if let Err(refusal) = &result
                    && refusal.code() == tonic::Code::NotFound
                {
                    traced.push_str(&self.compared_with_absent(call, request, refusal).await);
                }
                self.trace(call, "acquire", traced);
            }
        }
    }

    /// Starts `command` detached under the binding's held claim; an acknowledged start goes
    /// to the history check as any acknowledged call.
    async fn detach(&self, call: &Call, command: &str, held: &Held) {
        let Some(claim) = held.claims.get(&call.binding) else {
            return self.trace(call, "detach", "no claim held".to_owned());
        };
        let request = pb::CommandStartRequest {
            context: Some(pb::RequestContext {
                environment: claim.environment.clone(),
                owner: Some(owner(&call.owner)),
                binding_id: call.binding.clone(),
                epoch: claim.epoch,
                grant: claim.grant.clone(),
                run_id: claim.run_id.clone(),
                claim_id: claim.claim_id.clone(),
                grant_generation: claim.grant_generation,
            }),
            command: command.to_owned(),
            detach: true,
            ..Default::default()
        };
        let sent_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
        let result = self.client(call).start_command(request).await;
        let mut traced = outcome(&result);
        if let Ok(started) = &result {
            traced = format!("{traced} {}", started.get_ref().command_id);
            self.record
                .acknowledged
                .lock()
                .expect("acknowledged lock")
                .push(super::Acknowledged::under(
                    claim,
                    sent_ms,
                    format!("detached command `{command}`"),
                ));
        }
        self.trace(call, &format!("detach `{command}`"), traced);
    }

    /// §10.5: how a NOT_FOUND refusal compares with the refusal of the same request naming
    /// an absent environment (` as absent` when code, message and details are identical).
    async fn compared_with_absent(
        &self,
        call: &Call,
        mut request: pb::AcquireRunRequest,
        refusal: &tonic::Status,
    ) -> String {
        request.environment = Some(super::absent_environment());
        request.operation_id.push_str("-absent");
        match self.client(call).acquire_run(request).await {
            Err(absent) if super::same_refusal(&absent, refusal) => " as absent".to_owned(),
            other => format!(" unlike absent ({})", outcome(&other)),
        }
    }

    /// Lists the templates, ensures `template`'s listed revision, commits the reference;
    /// the environment when both succeeded.
    async fn ensure(&self, call: &Call, template: &str) -> Option<pb::EnvironmentRef> {
        let listed = self
            .client(call)
            .list_execution_templates(pb::ListExecutionTemplatesRequest {})
            .await;
        let selector = listed
            .ok()?
            .into_inner()
            .items
            .into_iter()
            .filter_map(|i| i.template)
            .find(|t| t.id == template);
        let Some(selector) = selector else {
            self.trace(call, &format!("ensure {template}"), "unlisted".to_owned());
            return None;
        };
        let operation_id = format!("{}-ensure-{}", call.host, call.binding);
        let request = pb::EnsureTemplateRequest {
            binding_id: call.binding.clone(),
            template: Some(selector),
            owner: Some(owner(&call.owner)),
            operation_id: operation_id.clone(),
        };
        let result = self.client(call).ensure_template(request).await;
        self.trace(call, &format!("ensure {template}"), outcome(&result));
        let env = result.ok()?.into_inner().environment?;
        self.record.note_ensured(&env);
        let commit = pb::ReferenceMutationRequest {
            environment: Some(env.clone()),
            owner: Some(owner(&call.owner)),
            binding_id: call.binding.clone(),
            operation_id,
        };
        let result = self.client(call).commit_reference(commit).await;
        self.trace(call, "commit-reference", outcome(&result));
        result.ok().map(|_| env)
    }
}
