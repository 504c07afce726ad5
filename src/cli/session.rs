//! The client side of one binding: ensure (idempotent by a per-binding operation id), commit
//! the reference, wait until ready, then claims, files and commands on that environment.

use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use tonic::transport::Channel;

use super::client::Target;
use crate::api::pb;
use crate::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use crate::runtime::{IdSource, OsIds};
use crate::server::status::error_detail;

/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(250);
/// The lifetime of claims the client takes for a single command.
const ONE_SHOT_TTL: Duration = Duration::from_secs(60);

/// A run claim as the client holds it.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The run id.
    pub run_id: String,
    /// The claim id.
    pub claim_id: String,
    /// The epoch.
    pub epoch: u64,
    /// The grant generation.
    pub grant_generation: u64,
    /// The signed grant minted with the claim (empty when there is none).
    pub grant: String,
    /// When the claim expires, Unix milliseconds (0: not known).
    pub expires_unix_millis: i64,
}

impl Claim {
    /// No claim: the context of calls that need none (attach, reference release).
    fn none() -> Self {
        Self {
            run_id: String::new(),
            claim_id: String::new(),
            epoch: 0,
            grant_generation: 0,
            grant: String::new(),
            expires_unix_millis: 0,
        }
    }
}

/// A future borrowed from a session.
pub type SessionFuture<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// An ensured environment of one binding.
#[derive(Clone)]
pub struct Session {
    client: ExecutionProviderServiceClient<Channel>,
    owner: pb::Owner,
    binding: String,
    template: pb::TemplateSelector,
    allocation: pb::EnsureEnvironmentResponse,
}

impl Session {
    /// Ensures the binding's environment, commits its reference and waits until it is ready.
    pub async fn ensure(
        mut client: ExecutionProviderServiceClient<Channel>,
        owner: pb::Owner,
        target: &Target,
        spinner: bool,
    ) -> anyhow::Result<Self> {
        let revision = match &target.revision {
            Some(r) => r.clone(),
            None => default_revision(&mut client, &target.template).await?,
        };
        let request = pb::EnsureTemplateRequest {
            binding_id: target.binding.clone(),
            template: Some(pb::TemplateSelector {
                id: target.template.clone(),
                revision,
            }),
            owner: Some(owner.clone()),
            operation_id: format!("cli-ensure-{}", target.binding),
        };
        let allocation = client.ensure_template(request.clone()).await?.into_inner();
        client
            .commit_reference(pb::ReferenceMutationRequest {
                environment: allocation.environment.clone(),
                owner: Some(owner.clone()),
                binding_id: target.binding.clone(),
                operation_id: request.operation_id.clone(),
            })
            .await?;
        let mut session = Self {
            client,
            owner,
            binding: target.binding.clone(),
            template: request.template.clone().unwrap_or_default(),
            allocation,
        };
        session.wait_ready(&request, target.wait, spinner).await?;
        Ok(session)
    }

    async fn wait_ready(
        &mut self,
        request: &pb::EnsureTemplateRequest,
        limit: Duration,
        spinner: bool,
    ) -> anyhow::Result<()> {
        if self.allocation.ready {
            return Ok(());
        }
        // Progress only where a person watches: stderr is a terminal (stdout stays the answer).
        let bar = (spinner && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .expect("a valid progress template"),
            );
            bar.set_message(format!("waiting for {} to become ready", self.binding));
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        let deadline = tokio::time::Instant::now() + limit;
        while !self.allocation.ready {
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("the environment did not become ready within {limit:?}");
            }
            tokio::time::sleep(READY_POLL).await;
            self.allocation = self
                .client
                .ensure_template(request.clone())
                .await?
                .into_inner();
            if let Some(bar) = &bar {
                bar.set_message(self.waiting_for().await);
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(())
    }

    /// What the environment waits for, from its description: phase and not-ready reason.
    async fn waiting_for(&self) -> String {
        let request = pb::DescribeEnvironmentRequest {
            environment: None,
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
        };
        match self.client.clone().describe_environment(request).await {
            Ok(d) => {
                let d = d.into_inner();
                let reason = if d.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", d.reason)
                };
                format!("waiting for {}: {}{reason}", self.binding, d.phase)
            }
            Err(_) => format!("waiting for {} to become ready", self.binding),
        }
    }

    /// The allocation.
    pub fn allocation(&self) -> &pb::EnsureEnvironmentResponse {
        &self.allocation
    }

    /// A client for the calls the session has no method for.
    pub fn rpc(&self) -> ExecutionProviderServiceClient<Channel> {
        self.client.clone()
    }

    /// The binding.
    pub fn binding(&self) -> &str {
        &self.binding
    }

    /// The environment's id.
    pub fn environment_id(&self) -> &str {
        self.allocation
            .environment
            .as_ref()
            .map(|e| e.id.as_str())
            .unwrap_or_default()
    }

    /// The template's longest command duration.
    pub async fn max_command_duration(&self) -> anyhow::Result<Duration> {
        let request = pb::ValidateTemplateRequest {
            template: Some(self.template.clone()),
        };
        let bounds = self.client.clone().validate_template(request).await?;
        let ms = u64::try_from(bounds.into_inner().max_command_duration_millis).unwrap_or(0);
        Ok(Duration::from_millis(ms))
    }

    /// The request context of a call under `claim`.
    pub fn context(&self, claim: &Claim) -> pb::RequestContext {
        pb::RequestContext {
            environment: self.allocation.environment.clone(),
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
            epoch: claim.epoch,
            grant: claim.grant.clone(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            grant_generation: claim.grant_generation,
        }
    }

    /// Attaches to the environment.
    pub async fn attach(&self) -> anyhow::Result<pb::AttachEnvironmentResponse> {
        let mut context = self.context(&Claim::none());
        context.epoch = self.allocation.epoch;
        let request = pb::AttachEnvironmentRequest {
            context: Some(context),
            purpose: "session".to_owned(),
        };
        Ok(self
            .client
            .clone()
            .attach_environment(request)
            .await?
            .into_inner())
    }

    /// Takes the run claim.
    pub async fn acquire(&self, run_id: Option<String>, ttl: Duration) -> anyhow::Result<Claim> {
        let run_id = run_id.unwrap_or_else(|| format!("cli-{}", OsIds.hex(8)));
        let request = pb::AcquireRunRequest {
            environment: self.allocation.environment.clone(),
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
            run_id,
            operation_id: OsIds.hex(16),
            ttl_millis: millis(ttl),
        };
        match self.client.clone().acquire_run(request).await {
            Ok(response) => Ok(claim_of(response.into_inner())),
            Err(status) => {
                if error_detail(&status).is_some_and(|d| d.code == "conflict") {
                    self.explain_held_claim().await;
                }
                Err(status.into())
            }
        }
    }

    /// After a refused acquire: says which run holds the claim and until when, as far as the
    /// creator may learn it from `DescribeEnvironment` (the refusal itself stays generic).
    async fn explain_held_claim(&self) {
        let request = pb::DescribeEnvironmentRequest {
            environment: None,
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
        };
        let Ok(d) = self.client.clone().describe_environment(request).await else {
            return;
        };
        if let Some(c) = d.into_inner().run_claim.filter(|c| !c.expired) {
            eprintln!(
                "note: the run claim is held by run {} (binding {}) until {}; acquire again \
                 once it is released or has expired",
                c.run_id,
                c.binding_id,
                super::describe::time(c.expires_at.as_ref())
            );
        }
    }

    /// Renews a claim.
    pub async fn renew(&self, claim: &Claim, ttl: Duration) -> anyhow::Result<Claim> {
        let request = pb::RenewRunRequest {
            environment: self.allocation.environment.clone(),
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: OsIds.hex(16),
            ttl_millis: millis(ttl),
            grant_generation: claim.grant_generation,
        };
        Ok(claim_of(
            self.client.clone().renew_run(request).await?.into_inner(),
        ))
    }

    /// Releases a claim.
    pub async fn release(&self, claim: &Claim) -> anyhow::Result<()> {
        let request = pb::ReleaseRunRequest {
            environment: self.allocation.environment.clone(),
            owner: Some(self.owner.clone()),
            binding_id: self.binding.clone(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            operation_id: OsIds.hex(16),
            grant_generation: claim.grant_generation,
        };
        self.client.clone().release_run(request).await?;
        Ok(())
    }

    /// Releases the binding's reference.
    pub async fn release_reference(&self) -> anyhow::Result<()> {
        let mut context = self.context(&Claim::none());
        context.epoch = self.allocation.epoch;
        let request = pb::ReleaseReferenceRequest {
            context: Some(context),
        };
        self.client.clone().release_reference(request).await?;
        Ok(())
    }

    /// Runs `work` under `claim`, or under a claim taken for it and released afterwards.
    pub async fn with_claim<T>(
        &self,
        claim: Option<Claim>,
        work: impl for<'a> Fn(&'a Session, &'a Claim) -> SessionFuture<'a, T>,
    ) -> anyhow::Result<T> {
        if let Some(claim) = claim {
            return work(self, &claim).await;
        }
        let claim = self.acquire(None, ONE_SHOT_TTL).await?;
        let result = work(self, &claim).await;
        let released = self.release(&claim).await;
        let value = result?;
        released.context("the command ran, but its run claim could not be released")?;
        Ok(value)
    }

    /// Runs a shell command.
    pub async fn exec(
        &self,
        claim: &Claim,
        command: String,
        timeout: Duration,
    ) -> anyhow::Result<pb::CommandStartResponse> {
        let request = pb::CommandStartRequest {
            context: Some(self.context(claim)),
            command,
            timeout_millis: millis(timeout),
            ..Default::default()
        };
        Ok(self
            .client
            .clone()
            .start_command(request)
            .await?
            .into_inner())
    }

    /// Runs a file operation.
    pub async fn file(
        &self,
        claim: &Claim,
        mut request: pb::FileRequest,
    ) -> anyhow::Result<pb::FileResponse> {
        request.context = Some(self.context(claim));
        Ok(self.client.clone().files(request).await?.into_inner())
    }

    /// Creates the file, or replaces it by compare-and-swap on the version just read.
    pub async fn write_file(
        &self,
        claim: &Claim,
        path: String,
        data: Vec<u8>,
    ) -> anyhow::Result<String> {
        let read = pb::FileRequest {
            operation: pb::FileOperation::Read as i32,
            path: path.clone(),
            ..pb::FileRequest::default()
        };
        let write = match self.file(claim, read).await {
            Ok(current) => pb::FileRequest {
                operation: pb::FileOperation::Replace as i32,
                path,
                data,
                version: current.version,
                ..pb::FileRequest::default()
            },
            Err(e)
                if e.downcast_ref::<tonic::Status>()
                    .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
            {
                pb::FileRequest {
                    operation: pb::FileOperation::Create as i32,
                    path,
                    data,
                    ..pb::FileRequest::default()
                }
            }
            Err(e) => return Err(e),
        };
        let response = self.file(claim, write).await?;
        Ok(String::from_utf8_lossy(&response.version).into_owned())
    }
}

async fn default_revision(
    client: &mut ExecutionProviderServiceClient<Channel>,
    template: &str,
) -> anyhow::Result<String> {
    let list = client
        .list_execution_templates(pb::ListExecutionTemplatesRequest {})
        .await?
        .into_inner();
    list.items
        .into_iter()
        .filter_map(|i| i.template)
        .find(|t| t.id == template)
        .map(|t| t.revision)
        .with_context(|| {
            format!("template `{template}` is not offered to this client; see `client templates`")
        })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn claim_of(r: pb::RunClaimResponse) -> Claim {
    Claim {
        run_id: r.run_id,
        claim_id: r.claim_id,
        epoch: r.epoch,
        grant_generation: r.grant_generation,
        grant: r.grant,
        expires_unix_millis: r
            .expires_at
            .map(|t| t.seconds.saturating_mul(1000) + i64::from(t.nanos / 1_000_000))
            .unwrap_or(0),
    }
}
