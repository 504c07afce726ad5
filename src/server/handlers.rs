//! The gRPC handlers: authenticate, authorize, validate, call the store, map errors. Thin by
//! design; every decision about state lives in the store.

use tonic::{Request, Response, Status};

use super::convert;
use super::validate::{self, valid_binding, valid_id};
use crate::api::pb;
use crate::api::pb::execution_provider_service_server::ExecutionProviderService;
use crate::errors::{ErrorCode, WireError};
use crate::executor::protocol::ExecutorRequest;
use crate::security::{Client, Security};
use crate::store::claims::{AcquireRequest, in_token_range};
use crate::store::ensure::EnsureRequest;
use crate::store::{Caller, ClaimContext, Store};

/// Capabilities every template offers.
pub const CAPABILITIES: [&str; 2] = ["filesystem", "foreground-command"];

/// The service: the store and the security state.
#[derive(Clone)]
pub struct ProviderService {
    store: Store,
    security: Security,
}

impl ProviderService {
    /// A service over `store`, authorizing against `security`.
    pub fn new(store: Store, security: Security) -> Self {
        Self { store, security }
    }

    fn client<T>(&self, req: &Request<T>) -> Result<Client, Status> {
        let certs = req.peer_certs();
        self.security
            .authenticate(certs.as_deref().map(Vec::as_slice))
            .map_err(Status::from)
    }
}

fn refuse(code: ErrorCode) -> Status {
    WireError::fatal(code).into_status()
}

fn caller(client: &Client, owner_hash: String) -> Caller {
    Caller {
        client: client.uri.clone(),
        owner_hash,
    }
}

/// Parses a data-plane RequestContext (§4.4 step 3): anything missing is PERMISSION_DENIED.
fn claim_context(
    client: &Client,
    context: Option<&pb::RequestContext>,
) -> Result<(Caller, ClaimContext), Status> {
    let denied = || refuse(ErrorCode::PermissionDenied);
    let c = context.ok_or_else(denied)?;
    let owner_hash = validate::owner(c.owner.as_ref()).ok_or_else(denied)?;
    let env = validate::env_ref(c.environment.as_ref()).ok_or_else(denied)?;
    let well_formed = valid_binding(&c.binding_id)
        && valid_id(&c.run_id)
        && valid_id(&c.claim_id)
        && c.epoch != 0
        && c.grant_generation != 0;
    if !well_formed || !client.policy.may_attest_owner {
        return Err(denied());
    }
    let rc = ClaimContext {
        env,
        binding_id: c.binding_id.clone(),
        run_id: c.run_id.clone(),
        claim_id: c.claim_id.clone(),
        epoch: c.epoch,
        grant_generation: c.grant_generation,
    };
    Ok((caller(client, owner_hash), rc))
}

/// Checks for run-claim requests (§4.3): every failure is INVALID_ARGUMENT.
struct ClaimRequest<'a> {
    environment: Option<&'a pb::EnvironmentRef>,
    owner: Option<&'a pb::Owner>,
    binding_id: &'a str,
    run_id: &'a str,
    claim_id: Option<&'a str>,
    epoch: Option<u64>,
    grant_generation: Option<u64>,
    operation_id: &'a str,
}

impl ClaimRequest<'_> {
    fn check(&self, client: &Client) -> Result<(Caller, ClaimContext), Status> {
        let invalid = || refuse(ErrorCode::InvalidArgument);
        if !client.policy.may_attest_owner {
            return Err(invalid());
        }
        let owner_hash = validate::owner(self.owner).ok_or_else(invalid)?;
        let env = validate::env_ref(self.environment).ok_or_else(invalid)?;
        let ok = valid_binding(self.binding_id)
            && valid_id(self.run_id)
            && valid_id(self.operation_id)
            && self.claim_id.is_none_or(valid_id)
            && self.epoch.is_none_or(in_token_range)
            && self.grant_generation.is_none_or(in_token_range);
        if !ok {
            return Err(invalid());
        }
        let rc = ClaimContext {
            env,
            binding_id: self.binding_id.to_owned(),
            run_id: self.run_id.to_owned(),
            claim_id: self.claim_id.unwrap_or_default().to_owned(),
            epoch: self.epoch.unwrap_or_default(),
            grant_generation: self.grant_generation.unwrap_or_default(),
        };
        Ok((caller(client, owner_hash), rc))
    }
}

/// Authenticates, then answers UNIMPLEMENTED with an ErrorDetail: the RPC's logic belongs to a
/// later part of the provider.
macro_rules! not_yet {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                request: Request<$req>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<$resp>, Status>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    self.client(&request)?;
                    Err(refuse(ErrorCode::Unimplemented))
                })
            }
        )*
    };
}

#[tonic::async_trait]
impl ExecutionProviderService for ProviderService {
    not_yet! {
        abort_reference(pb::ReferenceMutationRequest) -> ();
        prepare_reference_delete(pb::ReferenceMutationRequest) -> ();
        confirm_reference_delete(pb::ReferenceMutationRequest) -> ();
        cancel_reference_delete(pb::ReferenceMutationRequest) -> ();
        reserve_successor(pb::ReserveSuccessorRequest) -> pb::ReferenceReservationResponse;
        list_reference_intents(pb::ListReferenceIntentsRequest) -> pb::ListReferenceIntentsResponse;
        retire_environment(pb::RetireEnvironmentRequest) -> ();
        replace_executor(pb::ReplaceExecutorRequest) -> ();
        recover_environment(pb::RecoverEnvironmentRequest) -> ();
        delete_retired_environment(pb::DeleteRetiredEnvironmentRequest) -> ();
        revoke_environment(pb::RevokeEnvironmentRequest) -> pb::RevokeEnvironmentResponse;
        migrate_environment(pb::MigrateEnvironmentRequest) -> ();
    }

    async fn validate_profile(
        &self,
        request: Request<pb::ValidateProfileRequest>,
    ) -> Result<Response<pb::ValidateProfileResponse>, Status> {
        let client = self.client(&request)?;
        let name = &request.get_ref().profile;
        let templates = self.store.templates();
        let entry = templates
            .default_revision(name)
            .and_then(|rev| templates.select_revision(name, rev).ok())
            .filter(|_| client.policy.may_use_template(name))
            .ok_or_else(|| refuse(ErrorCode::NotFound))?;
        let spec = entry.execution();
        Ok(Response::new(pb::ValidateProfileResponse {
            profile: name.clone(),
            digest: entry.digest().to_owned(),
            capabilities: CAPABILITIES.map(str::to_owned).to_vec(),
            max_file_bytes: spec.max_file_bytes() as i64,
            max_command_bytes: spec.max_command_bytes() as i64,
            max_command_duration_millis: spec.max_command_duration_millis() as i64,
        }))
    }

    async fn ensure_environment(
        &self,
        request: Request<pb::EnsureEnvironmentRequest>,
    ) -> Result<Response<pb::EnsureEnvironmentResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let revision = self
            .store
            .templates()
            .default_revision(&r.profile)
            .filter(|_| client.policy.may_use_template(&r.profile))
            .ok_or_else(|| refuse(ErrorCode::NotFound))?
            .to_owned();
        self.ensure(
            &client,
            &r.profile,
            &revision,
            r.owner.as_ref(),
            &r.binding_id,
            &r.operation_id,
        )
        .await
    }

    async fn list_execution_templates(
        &self,
        request: Request<pb::ListExecutionTemplatesRequest>,
    ) -> Result<Response<pb::ListExecutionTemplatesResponse>, Status> {
        let client = self.client(&request)?;
        let templates = self.store.templates();
        let visible: Vec<_> = templates
            .catalog()
            .into_iter()
            .filter(|item| client.policy.may_use_template(&item.id))
            .collect();
        let inventory_revision = crate::templates::TemplateRegistry::inventory_revision(&visible);
        let items = visible
            .into_iter()
            .map(|item| pb::TemplateCatalogItem {
                template: Some(pb::TemplateSelector {
                    id: item.id,
                    revision: item.revision,
                }),
                name: item.name,
                description: item.description,
                display_token: item.display_token,
                extensions: item.extensions,
                capabilities: item.capabilities,
            })
            .collect();
        Ok(Response::new(pb::ListExecutionTemplatesResponse {
            items,
            inventory_revision,
        }))
    }

    async fn validate_template(
        &self,
        request: Request<pb::ValidateTemplateRequest>,
    ) -> Result<Response<pb::ValidateTemplateResponse>, Status> {
        let client = self.client(&request)?;
        let selector = request.get_ref().template.clone();
        let (id, revision) = validate::template_selector(selector.as_ref())
            .filter(|(id, _)| client.policy.may_use_template(id))
            .ok_or_else(|| refuse(ErrorCode::NotFound))?;
        let entry = self
            .store
            .templates()
            .select_revision(&id, &revision)
            .map_err(|_| refuse(ErrorCode::NotFound))?;
        let spec = entry.execution();
        Ok(Response::new(pb::ValidateTemplateResponse {
            template: selector,
            capabilities: CAPABILITIES.map(str::to_owned).to_vec(),
            max_file_bytes: spec.max_file_bytes() as i64,
            max_command_bytes: spec.max_command_bytes() as i64,
            max_command_duration_millis: spec.max_command_duration_millis() as i64,
        }))
    }

    async fn ensure_template(
        &self,
        request: Request<pb::EnsureTemplateRequest>,
    ) -> Result<Response<pb::EnsureEnvironmentResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (id, revision) = validate::template_selector(r.template.as_ref())
            .filter(|(id, _)| client.policy.may_use_template(id))
            .ok_or_else(|| refuse(ErrorCode::NotFound))?;
        self.ensure(
            &client,
            &id,
            &revision,
            r.owner.as_ref(),
            &r.binding_id,
            &r.operation_id,
        )
        .await
    }

    async fn attach_environment(
        &self,
        request: Request<pb::AttachEnvironmentRequest>,
    ) -> Result<Response<pb::AttachEnvironmentResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let denied = || refuse(ErrorCode::PermissionDenied);
        let c = r.context.as_ref().ok_or_else(denied)?;
        let owner_hash = validate::owner(c.owner.as_ref()).ok_or_else(denied)?;
        let env = validate::env_ref(c.environment.as_ref()).ok_or_else(denied)?;
        if !valid_binding(&c.binding_id)
            || r.purpose != "session"
            || !client.policy.may_attest_owner
        {
            return Err(denied());
        }
        let a = self
            .store
            .attach(&env, &caller(&client, owner_hash), &c.binding_id)
            .await?;
        let wire = convert::allocation(&a);
        Ok(Response::new(pb::AttachEnvironmentResponse {
            environment: wire.environment,
            epoch: wire.epoch,
            ready: wire.ready,
            grant_generation: wire.grant_generation,
        }))
    }

    async fn acquire_run(
        &self,
        request: Request<pb::AcquireRunRequest>,
    ) -> Result<Response<pb::RunClaimResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, rc) = ClaimRequest {
            environment: r.environment.as_ref(),
            owner: r.owner.as_ref(),
            binding_id: &r.binding_id,
            run_id: &r.run_id,
            claim_id: None,
            epoch: None,
            grant_generation: None,
            operation_id: &r.operation_id,
        }
        .check(&client)?;
        let ttl =
            validate::run_ttl(r.ttl_millis).ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        let claim = self
            .store
            .acquire_run(&AcquireRequest {
                env: rc.env,
                caller,
                binding_id: rc.binding_id,
                run_id: rc.run_id,
                operation_id: r.operation_id.clone(),
                ttl,
            })
            .await?;
        Ok(Response::new(convert::run_claim(&claim, String::new())))
    }

    async fn renew_run(
        &self,
        request: Request<pb::RenewRunRequest>,
    ) -> Result<Response<pb::RunClaimResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, rc) = ClaimRequest {
            environment: r.environment.as_ref(),
            owner: r.owner.as_ref(),
            binding_id: &r.binding_id,
            run_id: &r.run_id,
            claim_id: Some(&r.claim_id),
            epoch: Some(r.epoch),
            grant_generation: Some(r.grant_generation),
            operation_id: &r.operation_id,
        }
        .check(&client)?;
        let ttl =
            validate::run_ttl(r.ttl_millis).ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        let claim = self
            .store
            .renew_run(&caller, &rc, &r.operation_id, ttl)
            .await?;
        Ok(Response::new(convert::run_claim(&claim, String::new())))
    }

    async fn release_run(
        &self,
        request: Request<pb::ReleaseRunRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, rc) = ClaimRequest {
            environment: r.environment.as_ref(),
            owner: r.owner.as_ref(),
            binding_id: &r.binding_id,
            run_id: &r.run_id,
            claim_id: Some(&r.claim_id),
            epoch: Some(r.epoch),
            grant_generation: Some(r.grant_generation),
            operation_id: &r.operation_id,
        }
        .check(&client)?;
        self.store.release_run(&caller, &rc).await?;
        Ok(Response::new(()))
    }

    async fn commit_reference(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let invalid = || refuse(ErrorCode::InvalidArgument);
        let owner_hash = validate::owner(r.owner.as_ref()).ok_or_else(invalid)?;
        let env = validate::env_ref(r.environment.as_ref()).ok_or_else(invalid)?;
        if !client.policy.may_attest_owner
            || !valid_binding(&r.binding_id)
            || !valid_id(&r.operation_id)
        {
            return Err(invalid());
        }
        self.store
            .commit_reference(
                &env,
                &caller(&client, owner_hash),
                &r.binding_id,
                &r.operation_id,
            )
            .await?;
        Ok(Response::new(()))
    }

    async fn release_reference(
        &self,
        request: Request<pb::ReleaseReferenceRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let invalid = || refuse(ErrorCode::InvalidArgument);
        let c = request.get_ref().context.as_ref().ok_or_else(invalid)?;
        let owner_hash = validate::owner(c.owner.as_ref()).ok_or_else(invalid)?;
        let env = validate::env_ref(c.environment.as_ref()).ok_or_else(invalid)?;
        if !client.policy.may_attest_owner || !valid_binding(&c.binding_id) {
            return Err(invalid());
        }
        self.store
            .release_reference(&env, &caller(&client, owner_hash), &c.binding_id)
            .await?;
        Ok(Response::new(()))
    }

    async fn files(
        &self,
        request: Request<pb::FileRequest>,
    ) -> Result<Response<pb::FileResponse>, Status> {
        let r = request.get_ref();
        let operation = convert::file_operation(r.operation);
        let client = self.client(&request)?;
        let operation = operation.ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        super::file_rules::check(&operation, r).map_err(|_| refuse(ErrorCode::InvalidArgument))?;
        let (caller, rc) = claim_context(&client, r.context.as_ref())?;
        self.store.validate_run_claim(&caller, &rc).await?;
        let response = self
            .store
            .execute(&caller, &rc, convert::file_request(operation, r))
            .await?;
        Ok(Response::new(convert::file_response(&response)))
    }

    async fn start_command(
        &self,
        request: Request<pb::CommandStartRequest>,
    ) -> Result<Response<pb::CommandStartResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let max = crate::executor::protocol::MAX_COMMAND_BYTES;
        if r.command.is_empty() || r.command.len() > max || r.timeout_millis < 0 {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        let (caller, rc) = claim_context(&client, r.context.as_ref())?;
        self.store.validate_run_claim(&caller, &rc).await?;
        let command_id = self.store.new_command_id();
        let mut helper_request = ExecutorRequest::command(command_id.clone(), r.command.clone());
        helper_request.timeout_ms = r.timeout_millis;
        let response = self.store.execute(&caller, &rc, helper_request).await?;
        let result = response
            .command
            .as_ref()
            .ok_or_else(|| refuse(ErrorCode::FenceUnknown))?;
        let status = convert::command_status(result);
        Ok(Response::new(pb::CommandStartResponse {
            command_id,
            state: status.state,
            result: Some(status),
        }))
    }

    async fn command_status(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        self.detached_control(request).await
    }

    async fn cancel_command(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        self.detached_control(request).await
    }
}

impl ProviderService {
    async fn ensure(
        &self,
        client: &Client,
        template_id: &str,
        revision: &str,
        owner: Option<&pb::Owner>,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<Response<pb::EnsureEnvironmentResponse>, Status> {
        let invalid = || refuse(ErrorCode::InvalidArgument);
        let owner_hash = validate::owner(owner).ok_or_else(invalid)?;
        let owner = owner.ok_or_else(invalid)?;
        if !valid_binding(binding_id) || !valid_id(operation_id) {
            return Err(invalid());
        }
        let allocation = self
            .store
            .ensure_template(&EnsureRequest {
                caller: caller(client, owner_hash),
                owner_issuer: owner.issuer.clone(),
                owner_subject: owner.subject.clone(),
                binding_id: binding_id.to_owned(),
                template_id: template_id.to_owned(),
                template_revision: revision.to_owned(),
                operation_id: operation_id.to_owned(),
            })
            .await?;
        Ok(Response::new(convert::allocation(&allocation)))
    }

    /// CommandStatus / CancelCommand: the data-plane chain first, then UNIMPLEMENTED
    /// (DECISIONS 5): commands are foreground only.
    async fn detached_control(
        &self,
        request: Request<pb::CommandQueryRequest>,
    ) -> Result<Response<pb::CommandStatusResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let (caller, rc) = claim_context(&client, r.context.as_ref())?;
        self.store.validate_run_claim(&caller, &rc).await?;
        if r.command_id.is_empty() || r.offset < 0 {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        Err(refuse(ErrorCode::Unimplemented))
    }
}
