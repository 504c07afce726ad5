//! Catalogue RPCs: profiles and templates, read-only.

use tonic::{Request, Response, Status};

use super::CAPABILITIES;
use super::ProviderService;
use super::auth::*;
use crate::api::pb;
use crate::errors::ErrorCode;
use crate::server::validate;

impl ProviderService {
    pub(super) async fn handle_validate_profile(
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

    pub(super) async fn handle_list_execution_templates(
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

    pub(super) async fn handle_validate_template(
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
}
