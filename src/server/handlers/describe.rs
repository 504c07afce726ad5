//! `DescribeEnvironment` (operator tooling): a caller that may attest owners describes its own
//! environments, an administrator also those of the creators it administers. The request names
//! the environment exactly once (a reference or one of the caller's bindings); anything
//! malformed is INVALID_ARGUMENT before any lookup, and the store answers an environment out of
//! scope exactly like an absent one.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::refuse;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::security::Client;
use crate::server::convert;
use crate::server::validate::{self, valid_binding, valid_id};
use crate::store::describe::{DescribeRequest, DescribeTarget};

/// The describe gate and the request's shape.
fn describe_request(
    client: &Client,
    r: &pb::DescribeEnvironmentRequest,
) -> Result<DescribeRequest, Status> {
    if !client.policy.administrator && !client.policy.may_attest_owner {
        return Err(refuse(ErrorCode::PermissionDenied));
    }
    let invalid = || refuse(ErrorCode::InvalidArgument);
    let owner_hash = validate::owner(r.owner.as_ref()).ok_or_else(invalid)?;
    let target = match (r.environment.as_ref(), r.binding_id.as_str()) {
        (Some(env), "") if valid_id(&env.id) && env.revision.len() <= 1024 => {
            DescribeTarget::Environment {
                id: env.id.clone(),
                revision: env.revision.clone(),
            }
        }
        (None, binding) if valid_binding(binding) => DescribeTarget::Binding(binding.to_owned()),
        _ => return Err(invalid()),
    };
    let administrator_for = if client.policy.administrator {
        client.policy.administrator_for.clone()
    } else {
        Vec::new()
    };
    Ok(DescribeRequest {
        target,
        owner_hash,
        actor: client.uri.clone(),
        administrator_for,
    })
}

impl ProviderService {
    pub(super) async fn handle_describe_environment(
        &self,
        request: Request<pb::DescribeEnvironmentRequest>,
    ) -> Result<Response<pb::DescribeEnvironmentResponse>, Status> {
        let client = self.client(&request)?;
        let q = describe_request(&client, request.get_ref())?;
        let description = self.store.describe(&q).await?;
        Ok(Response::new(convert::description(&description)))
    }
}
