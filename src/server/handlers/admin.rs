//! The admin lifecycle: retire, replace, recover, delete retired, revoke, migrate. Each
//! authenticates and then answers UNIMPLEMENTED until the store issue builds it.

use tonic::{Request, Response, Status};

use super::ProviderService;
use crate::api::pb;

impl ProviderService {
    pub(super) async fn handle_retire_environment(
        &self,
        request: Request<pb::RetireEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_replace_executor(
        &self,
        request: Request<pb::ReplaceExecutorRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_recover_environment(
        &self,
        request: Request<pb::RecoverEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_delete_retired_environment(
        &self,
        request: Request<pb::DeleteRetiredEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_revoke_environment(
        &self,
        request: Request<pb::RevokeEnvironmentRequest>,
    ) -> Result<Response<pb::RevokeEnvironmentResponse>, Status> {
        self.not_yet(request).await
    }

    pub(super) async fn handle_migrate_environment(
        &self,
        request: Request<pb::MigrateEnvironmentRequest>,
    ) -> Result<Response<()>, Status> {
        self.not_yet(request).await
    }
}
