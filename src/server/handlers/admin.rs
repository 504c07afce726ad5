//! The administrator lifecycle RPCs (api-security §4.3, store §7): retire, replace, recover,
//! delete retired, revoke and migrate. A caller without `Administrator`, and any malformed
//! identity of the gate (owner, environment, epoch, UIDs, operation id), gets
//! PERMISSION_DENIED before any lookup; the store applies the subject rules (an environment
//! out of the actor's scope is NOT_FOUND) and the exact identity checks.

use tonic::{Request, Response, Status};

use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::security::Client;
use crate::server::validate::{self, valid_id};
use crate::store::admin::AdminRequest;

/// The fields an admin request names.
struct Named<'a> {
    environment: Option<&'a pb::EnvironmentRef>,
    owner: Option<&'a pb::Owner>,
    epoch: Option<u64>,
    pod_uid: Option<&'a str>,
    pvc_uid: &'a str,
    operation_id: &'a str,
}

/// The admin gate: Administrator, then every named identity well-formed.
fn admin_request(client: &Client, n: Named<'_>) -> Result<AdminRequest, Status> {
    let denied = || refuse(ErrorCode::PermissionDenied);
    if !client.policy.administrator {
        return Err(denied());
    }
    let owner_hash = validate::owner(n.owner).ok_or_else(denied)?;
    let env = validate::env_ref(n.environment).ok_or_else(denied)?;
    let epoch_ok = n.epoch.is_none_or(|e| (1..=i64::MAX as u64).contains(&e));
    let pod_ok = n.pod_uid.is_none_or(valid_id);
    if !epoch_ok || !pod_ok || !valid_id(n.pvc_uid) || !valid_id(n.operation_id) {
        return Err(denied());
    }
    Ok(AdminRequest {
        env,
        owner_hash,
        actor: client.uri.clone(),
        administrator_for: client.policy.administrator_for.clone(),
        expected_epoch: n.epoch.unwrap_or(0),
        expected_pod_uid: n.pod_uid.unwrap_or_default().to_owned(),
        expected_pvc_uid: n.pvc_uid.to_owned(),
        operation_id: n.operation_id.to_owned(),
    })
}

macro_rules! exact {
    ($r:expr) => {
        Named {
            environment: $r.environment.as_ref(),
            owner: $r.owner.as_ref(),
            epoch: Some($r.expected_execution_epoch),
            pod_uid: Some(&$r.expected_pod_uid),
            pvc_uid: &$r.expected_pvc_uid,
            operation_id: &$r.operation_id,
        }
    };
}

impl ProviderService {
    pub(super) async fn handle_retire_environment(
        &self,
        request: Request<pb::RetireEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let q = admin_request(&client, exact!(request.get_ref()))?;
        self.store.retire_environment(&q).await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_replace_executor(
        &self,
        request: Request<pb::ReplaceExecutorRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let q = admin_request(&client, exact!(request.get_ref()))?;
        self.store.replace_executor(&q).await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_recover_environment(
        &self,
        request: Request<pb::RecoverEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let q = admin_request(&client, exact!(request.get_ref()))?;
        self.store.recover_environment(&q).await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_delete_retired_environment(
        &self,
        request: Request<pb::DeleteRetiredEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let q = admin_request(
            &client,
            Named {
                environment: r.environment.as_ref(),
                owner: r.owner.as_ref(),
                epoch: None,
                pod_uid: None,
                pvc_uid: &r.expected_pvc_uid,
                operation_id: &r.operation_id,
            },
        )?;
        self.store.delete_retired_environment(&q).await?;
        Ok(Response::new(()))
    }

    pub(super) async fn handle_revoke_environment(
        &self,
        request: Request<pb::RevokeEnvironmentRequest>,
    ) -> Result<Response<pb::RevokeEnvironmentResponse>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let denied = || refuse(ErrorCode::PermissionDenied);
        if !client.policy.administrator {
            return Err(denied());
        }
        let owner_hash = validate::owner(r.owner.as_ref()).ok_or_else(denied)?;
        let env = validate::env_ref(r.environment.as_ref()).ok_or_else(denied)?;
        let expected = r.expected_grant_generation;
        if !(1..i64::MAX as u64).contains(&expected) || !valid_id(&r.operation_id) {
            return Err(refuse(ErrorCode::InvalidArgument));
        }
        let q = AdminRequest {
            env,
            owner_hash,
            actor: client.uri.clone(),
            administrator_for: client.policy.administrator_for.clone(),
            expected_epoch: 0,
            expected_pod_uid: String::new(),
            expected_pvc_uid: String::new(),
            operation_id: r.operation_id.clone(),
        };
        let generation = self.store.revoke_environment(&q, expected).await?;
        Ok(Response::new(pb::RevokeEnvironmentResponse {
            grant_generation: generation,
        }))
    }

    pub(super) async fn handle_migrate_environment(
        &self,
        request: Request<pb::MigrateEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        let client = self.client(&request)?;
        let r = request.get_ref();
        let q = admin_request(
            &client,
            Named {
                environment: r.environment.as_ref(),
                owner: r.owner.as_ref(),
                epoch: None,
                pod_uid: Some(&r.expected_pod_uid),
                pvc_uid: &r.expected_pvc_uid,
                operation_id: &r.operation_id,
            },
        )?;
        let schema = r
            .expected_schema_version
            .filter(|v| *v <= 1)
            .ok_or_else(|| refuse(ErrorCode::InvalidArgument))?;
        self.store.migrate_environment(&q, schema).await?;
        Ok(Response::new(()))
    }
}
