//! The data plane: file operations and foreground commands under a current run claim.
//!
//! [`PeerPolicy`] is the store's §8.2 `policyCurrent` for one call: it re-authenticates the
//! call's peer chain against the security state in force at each moment the store asks
//! (validation, confirmation, every lease renewal, completion).

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::executor::protocol::ExecutorRequest;
use crate::security::{Client, Security};
use crate::server::limiter::Slot;
use crate::server::{convert, file_rules};
use crate::store::policy::{PolicyCheck, SharedPolicyCheck};

/// The caller's policy as in force now: the same peer chain still authenticates, to the same
/// client, which may still attest owners and use the environment's template.
///
/// It also keeps the call's limiter slot: the store holds this check until the dispatch's
/// executor call and completion write have ended, in their own task, so a call cancelled by
/// its client keeps its slot for as long as its work goes on (api-security §7).
struct PeerPolicy {
    security: Security,
    certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    uri: String,
    _slot: Option<Arc<Slot>>,
}

impl PolicyCheck for PeerPolicy {
    fn current(&self, template_id: &str) -> bool {
        let certs = self.certs.as_deref().map(Vec::as_slice);
        self.security
            .authenticate(certs)
            .is_ok_and(|c| c.uri == self.uri && c.policy.may_use_template(template_id))
    }
}

impl ProviderService {
    pub(super) async fn handle_files(
        &self,
        request: Request<pb::FileRequest>,
    ) -> Result<Response<pb::FileResponse>, Status> {
        let r = request.get_ref();
        let operation = convert::file_operation(r.operation);
        let client = self.client(&request)?;
        let operation = operation.ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        file_rules::check(&operation, r).map_err(|_| refuse(ErrorCode::InvalidArgument))?;
        let (caller, rc) =
            self.data_plane_context(&client, r.context.as_ref(), operation.as_str())?;
        let policy = self.peer_policy(&request, &client);
        let claim = self.store.validate_run_claim_under(&caller, &rc, policy);
        let claim = claim.await?;
        let response = self
            .store
            .execute_validated(claim, convert::file_request(operation, r))
            .await?;
        Ok(Response::new(convert::file_response(&response)))
    }

    pub(super) async fn handle_start_command(
        &self,
        request: Request<pb::CommandStartRequest>,
    ) -> Result<Response<pb::CommandStartResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let max = crate::executor::protocol::MAX_COMMAND_BYTES;
        if r.command.is_empty() || r.command.len() > max || r.timeout_millis < 0 {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        let (caller, rc) = self.data_plane_context(&client, r.context.as_ref(), "command.start")?;
        let policy = self.peer_policy(&request, &client);
        let claim = self.store.validate_run_claim_under(&caller, &rc, policy);
        let claim = claim.await?;
        if !super::commands::start_options_well_formed(r) {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        if r.detach {
            return self.start_supervised_command(claim, r).await;
        }
        if r.open_stdin {
            // Nobody could write to a foreground command's stdin before its answer: stdin
            // needs a detached start (refused with nothing written, nothing run).
            return Err(refuse(ErrorCode::Unimplemented));
        }
        if super::commands::needs_supervisor(r) {
            return self.start_supervised_command(claim, r).await;
        }
        let command_id = self.store.new_command_id();
        let mut helper_request = ExecutorRequest::command(command_id.clone(), r.command.clone());
        helper_request.timeout_ms = r.timeout_millis;
        let response = self.store.execute_validated(claim, helper_request).await?;
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

    /// The store's policy check for this call.
    pub(super) fn peer_policy<T>(
        &self,
        request: &Request<T>,
        client: &Client,
    ) -> SharedPolicyCheck {
        Arc::new(PeerPolicy {
            security: self.security.clone(),
            certs: request.peer_certs(),
            uri: client.uri.clone(),
            _slot: client.slot.clone(),
        })
    }
}
