//! Allocation and attach: `EnsureTemplate`, `EnsureEnvironment`, `AttachEnvironment`.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::security::Client;
use crate::server::convert;
use crate::server::validate::{self, valid_binding, valid_id};
use crate::store::ensure::EnsureRequest;

impl ProviderService {
    pub(super) async fn handle_ensure_environment(
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

    pub(super) async fn handle_ensure_template(
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

    pub(super) async fn handle_attach_environment(
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
}
