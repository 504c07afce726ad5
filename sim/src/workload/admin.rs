//! The client actions beyond the run-claim path: admin calls (revocation, lifecycle),
//! releasing a reference, and deliberately invalid requests that must be refused.

use execution_provider::api::pb;
use rand::RngExt;

use super::{Session, outcome};

impl Session {
    pub(super) async fn revoke(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let expected = self
            .shared_claims(binding)
            .last()
            .map_or(1, |c| c.grant_generation);
        let request = pb::RevokeEnvironmentRequest {
            environment: env,
            owner: Some(self.spec.owner.clone()),
            expected_grant_generation: expected,
            operation_id: self.next_id("revoke"),
        };
        let result = self.client().revoke_environment(request).await;
        self.trace(format!(
            "revoke {binding} g{expected} -> {}",
            outcome(&result)
        ));
    }

    pub(super) async fn lifecycle(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let epoch = self.shared_claims(binding).last().map_or(0, |c| c.epoch);
        let operation_id = self.next_id("lifecycle");
        let owner = Some(self.spec.owner.clone());
        let result = if self.rng.random_bool(0.5) {
            let request = pb::ReplaceExecutorRequest {
                environment: env,
                owner,
                expected_execution_epoch: epoch,
                operation_id,
                ..pb::ReplaceExecutorRequest::default()
            };
            self.client().replace_executor(request).await.map(|_| ())
        } else {
            let request = pb::RetireEnvironmentRequest {
                environment: env,
                owner,
                expected_execution_epoch: epoch,
                operation_id,
                ..pb::RetireEnvironmentRequest::default()
            };
            self.client().retire_environment(request).await.map(|_| ())
        };
        self.trace(format!(
            "lifecycle {binding} e{epoch} -> {}",
            outcome(&result)
        ));
    }

    pub(super) async fn release_reference(&mut self, binding: &str) {
        let Some(claim) = self.claim(binding) else {
            return;
        };
        let request = pb::ReleaseReferenceRequest {
            context: Some(self.context(binding, &claim)),
        };
        let result = self.client().release_reference(request).await;
        self.trace(format!(
            "release-reference {binding} -> {}",
            outcome(&result)
        ));
    }

    /// A request that must be refused; success is a violation.
    pub(super) async fn invalid(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let kind = self.rng.random_range(0..3);
        let (what, result) = match kind {
            0 => {
                let request = pb::AcquireRunRequest {
                    environment: env,
                    owner: Some(self.spec.owner.clone()),
                    binding_id: binding.to_owned(),
                    run_id: self.next_id("run"),
                    operation_id: self.next_id("acquire"),
                    ttl_millis: 1_000,
                };
                let r = self.client().acquire_run(request).await.map(|_| ());
                ("acquire with a TTL below the minimum", r)
            }
            1 => {
                let request = pb::AcquireRunRequest {
                    environment: env,
                    owner: Some(pb::Owner {
                        issuer: "https://issuer.sim".into(),
                        subject: "mallory".into(),
                    }),
                    binding_id: binding.to_owned(),
                    run_id: self.next_id("run"),
                    operation_id: self.next_id("acquire"),
                    ttl_millis: 30_000,
                };
                let r = self.client().acquire_run(request).await.map(|_| ());
                ("acquire as another owner", r)
            }
            _ => {
                let r = self
                    .stranger()
                    .list_execution_templates(pb::ListExecutionTemplatesRequest {})
                    .await
                    .map(|_| ());
                ("a call from an unadmitted client", r)
            }
        };
        self.trace(format!("invalid: {what} {binding} -> {}", outcome(&result)));
        if result.is_ok() {
            self.unexpected(format!("{}: {what} succeeded", self.spec.host));
        }
    }
}
