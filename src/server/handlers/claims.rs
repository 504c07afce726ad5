//! Run claims: acquire, renew, release.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::server::{convert, validate};
use crate::store::claims::AcquireRequest;

impl ProviderService {
    pub(super) async fn handle_acquire_run(
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

    pub(super) async fn handle_renew_run(
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

    pub(super) async fn handle_release_run(
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
}
