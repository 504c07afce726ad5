//! Reference intents: commit and release work; the other intents answer UNIMPLEMENTED until the store issue builds them.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::server::validate::{self, valid_binding, valid_id};

impl ProviderService {
    pub(super) async fn handle_commit_reference(
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

    pub(super) async fn handle_release_reference(
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

    pub(super) async fn handle_abort_reference(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_prepare_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_confirm_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_cancel_reference_delete(
        &self,
        request: Request<pb::ReferenceMutationRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_reserve_successor(
        &self,
        request: Request<pb::ReserveSuccessorRequest>,
    ) -> Result<Response<pb::ReferenceReservationResponse>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_list_reference_intents(
        &self,
        request: Request<pb::ListReferenceIntentsRequest>,
    ) -> Result<Response<pb::ListReferenceIntentsResponse>, Status> {
        self.not_yet(request).await
    }
}
