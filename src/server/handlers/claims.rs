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
                caller: caller.clone(),
                binding_id: rc.binding_id,
                run_id: rc.run_id,
                operation_id: r.operation_id.clone(),
                ttl,
            })
            .await?;
        self.with_grant(&caller, &claim)
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
        self.with_grant(&caller, &claim)
    }

    /// The response to a successful acquire or renew: the claim plus a grant minted for it
    /// (DECISIONS 4). `expires_at` is the earlier of the claim's and the grant's expiry, the
    /// instant the pair stops authorizing the data plane. If no key may sign, the durable
    /// claim stands and the call fails; a retry with the same operation id replays the claim
    /// and signs again.
    fn with_grant(
        &self,
        caller: &crate::store::Caller,
        claim: &crate::store::RunClaim,
    ) -> Result<Response<pb::RunClaimResponse>, Status> {
        let rc = crate::store::ClaimContext {
            env: claim.env.clone(),
            binding_id: claim.binding_id.clone(),
            run_id: claim.run_id.clone(),
            claim_id: claim.claim_id.clone(),
            epoch: claim.epoch,
            grant_generation: claim.grant_generation,
        };
        let (grant, grant_expiry) = self
            .security
            .sign_grant(grant_binding(caller, &rc))
            .map_err(Status::from)?;
        let mut response = convert::run_claim(claim, grant);
        let expiry = claim.expires_at.min(grant_expiry);
        response.expires_at = Some(convert::timestamp(expiry));
        Ok(Response::new(response))
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
