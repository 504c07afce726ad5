//! The allocation actions of a client: ensuring a binding with one of the two templates (its
//! usual one, sometimes the other), committing the reference, and retrying before it leaves the
//! ensures it never got an answer for.

use std::time::Duration;

use execution_provider::api::pb;
use rand::RngExt;

use super::{Session, outcome};

impl Session {
    /// Before leaving, a platform retries the ensures it never got an answer for (a few
    /// times): the store must finish a pending ensure whose create succeeded but whose answer
    /// was lost.
    pub(super) async fn retry_unconfirmed_ensures(&mut self) {
        const ATTEMPTS: u32 = 3;
        for _ in 0..ATTEMPTS {
            let unconfirmed: Vec<String> = self
                .bindings
                .iter()
                .filter(|(_, b)| b.unconfirmed)
                .map(|(name, _)| name.clone())
                .collect();
            if unconfirmed.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            for binding in unconfirmed {
                self.ensure(&binding).await;
            }
        }
    }

    /// The template to ensure `binding` with: the one of its unconfirmed ensure (a platform
    /// retries the same request), else usually its home template, sometimes (at the
    /// spec's competing rate) the other one (two hosts of one platform then race the same
    /// binding with different templates: the loser is refused ALREADY_EXISTS).
    async fn template(&mut self, binding: &str) -> Option<pb::TemplateSelector> {
        let state = &self.bindings[binding];
        if state.unconfirmed
            && let Some(template) = state.template.clone()
        {
            return Some(template);
        }
        if self.templates.is_empty() {
            let result = self
                .client()
                .list_execution_templates(pb::ListExecutionTemplatesRequest {})
                .await;
            self.trace(format!("list-templates -> {}", outcome(&result)));
            let listed: Vec<pb::TemplateSelector> = result
                .ok()?
                .into_inner()
                .items
                .into_iter()
                .filter_map(|i| i.template)
                .collect();
            self.templates = ["default", crate::world::SECOND_TEMPLATE]
                .iter()
                .filter_map(|id| listed.iter().find(|t| t.id == *id).cloned())
                .collect();
        }
        let count = self.templates.len();
        if count == 0 {
            return None;
        }
        // The usual template alternates by binding and by owner (with one binding, `alice`
        // and `bob` still use both templates).
        let index = self.spec.bindings.iter().position(|b| b == binding);
        let home = index.unwrap_or(0) + usize::from(self.spec.owner.subject == "bob");
        let rate = self.spec.competing_template_rate;
        let other = usize::from(rate > 0.0 && self.side_rng.random_bool(rate));
        Some(self.templates[(home + other) % count].clone())
    }

    pub(super) async fn ensure(&mut self, binding: &str) {
        let Some(template) = self.template(binding).await else {
            return;
        };
        let operation_id = format!("ensure-{}-{binding}", self.spec.owner.subject);
        let request = pb::EnsureTemplateRequest {
            binding_id: binding.to_owned(),
            template: Some(template.clone()),
            owner: Some(self.spec.owner.clone()),
            operation_id: operation_id.clone(),
        };
        let result = self.client().ensure_template(request).await;
        self.trace(format!(
            "ensure {binding} {} -> {}",
            template.id,
            outcome(&result)
        ));
        let state = self.bindings.get_mut(binding).expect("known binding");
        // A binding held by the other template is a definitive answer, not one to retry.
        state.unconfirmed = result
            .as_ref()
            .is_err_and(|s| s.code() != tonic::Code::AlreadyExists);
        state.template = Some(template);
        let Ok(response) = result else { return };
        let env = response.into_inner().environment;
        if let Some(env) = &env {
            self.record.note_ensured(env);
        }
        let commit = pb::ReferenceMutationRequest {
            environment: env.clone(),
            owner: Some(self.spec.owner.clone()),
            binding_id: binding.to_owned(),
            operation_id,
        };
        let result = self.client().commit_reference(commit).await;
        self.trace(format!(
            "commit-reference {binding} -> {}",
            outcome(&result)
        ));
        if result.is_ok() {
            self.bindings.get_mut(binding).expect("known binding").env = env;
        }
    }
}
