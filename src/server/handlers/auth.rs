//! Who is calling and with what: authentication of the peer, and the shape checks of the
//! ownership and claim tuples that the handlers share.

use tonic::{Request, Status};

use super::ProviderService;
use crate::api::pb;
use crate::errors::{ErrorCode, WireError};
use crate::security::Client;
use crate::security::grant::{GrantBinding, GrantEnvironment, MAX_GRANT_BYTES};
use crate::server::validate::{self, valid_binding, valid_id};
use crate::store::claims::in_token_range;
use crate::store::{Caller, ClaimContext};

impl ProviderService {
    pub(super) fn client<T>(&self, req: &Request<T>) -> Result<Client, Status> {
        let certs = req.peer_certs();
        self.security
            .admit(certs.as_deref().map(Vec::as_slice))
            .map_err(Status::from)
    }
}

pub(super) fn refuse(code: ErrorCode) -> Status {
    WireError::fatal(code).into()
}

pub(super) fn caller(client: &Client, owner_hash: String) -> Caller {
    Caller {
        client: client.uri.clone(),
        owner_hash,
    }
}

/// The exact binding a grant for this caller and claim must carry.
pub(super) fn grant_binding(caller: &Caller, rc: &ClaimContext) -> GrantBinding {
    GrantBinding {
        client: caller.client.clone(),
        owner: caller.owner_hash.clone(),
        binding_id: rc.binding_id.clone(),
        run_id: rc.run_id.clone(),
        claim_id: rc.claim_id.clone(),
        environment: GrantEnvironment {
            id: rc.env.id.clone(),
            revision: rc.env.revision.clone(),
        },
        epoch: rc.epoch,
        grant_generation: rc.grant_generation,
    }
}

impl ProviderService {
    /// The data-plane authorization chain of §4.4 after authentication: the context
    /// (steps 3-4, PERMISSION_DENIED), then the grant for `operation` (step 5: expired is
    /// UNAUTHENTICATED retryable, anything else PERMISSION_DENIED). The durable run claim is
    /// checked by the caller next (steps 6-7); both must hold (DECISIONS 4).
    pub(super) fn data_plane_context(
        &self,
        client: &Client,
        context: Option<&pb::RequestContext>,
        operation: &str,
    ) -> Result<(Caller, ClaimContext), Status> {
        let (caller, rc) = claim_context(client, context)?;
        let token = context.map(|c| c.grant.as_str()).unwrap_or_default();
        self.security
            .verify_grant(token, &grant_binding(&caller, &rc), operation)
            .map_err(Status::from)?;
        Ok((caller, rc))
    }
}

/// Parses a data-plane RequestContext (§4.4 step 3): anything missing is PERMISSION_DENIED.
pub(super) fn claim_context(
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
        && c.grant_generation != 0
        && !c.grant.is_empty()
        && c.grant.len() <= MAX_GRANT_BYTES;
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
pub(super) struct ClaimRequest<'a> {
    pub environment: Option<&'a pb::EnvironmentRef>,
    pub owner: Option<&'a pb::Owner>,
    pub binding_id: &'a str,
    pub run_id: &'a str,
    pub claim_id: Option<&'a str>,
    pub epoch: Option<u64>,
    pub grant_generation: Option<u64>,
    pub operation_id: &'a str,
}

impl ClaimRequest<'_> {
    pub fn check(&self, client: &Client) -> Result<(Caller, ClaimContext), Status> {
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
