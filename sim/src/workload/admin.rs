//! The client actions beyond the run-claim path: admin calls (revocation, lifecycle),
//! releasing a reference, and deliberately invalid requests that must be refused.

use execution_provider::api::pb;
use rand::RngExt;

use super::{Session, absent_environment, now_ms, outcome, proves_nothing, same_refusal};
use crate::invariants::{Incarnation, Revoked};

impl Session {
    pub(super) async fn revoke(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let expected = self
            .shared_claims(binding)
            .last()
            .map_or(1, |c| c.grant_generation);
        let operation_id = self.next_id("revoke");
        let request = pb::RevokeEnvironmentRequest {
            environment: env.clone(),
            owner: Some(self.spec.owner.clone()),
            expected_grant_generation: expected,
            operation_id: operation_id.clone(),
        };
        let result = self.client().revoke_environment(request).await;
        self.trace(format!(
            "revoke {binding} g{expected} -> {}",
            outcome(&result)
        ));
        self.note_refusal(&operation_id, &result);
        if let (Ok(response), Some(env)) = (result, env) {
            self.record
                .revoked
                .lock()
                .expect("revoked lock")
                .push(Revoked {
                    environment: Incarnation::of(&env),
                    grant_generation: response.into_inner().grant_generation,
                    answered_ms: now_ms(),
                });
        }
    }

    /// The epoch, Pod UID and PVC UID the environment's status shows now, as an
    /// administrator reads them before a lifecycle call (empty when unknown).
    fn exact_identity(&self, env: Option<&pb::EnvironmentRef>) -> (u64, String, String) {
        let Some(object) = self.stored(env) else {
            return (0, String::new(), String::new());
        };
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let epoch = object
            .pointer("/status/epoch")
            .and_then(|e| e.as_u64())
            .unwrap_or(0);
        (epoch, text("/status/pod/uid"), text("/status/pvc/uid"))
    }

    /// The stored object of exactly this environment incarnation, as an administrator
    /// reads it.
    fn stored(&self, env: Option<&pb::EnvironmentRef>) -> Option<serde_json::Value> {
        let env = env?;
        self.spec
            .api
            .objects_of_kind("ExecutionEnvironment")
            .into_iter()
            .find(|o| {
                o.pointer("/metadata/name").and_then(|n| n.as_str()) == Some(&env.id)
                    && o.pointer("/spec/revision").and_then(|n| n.as_str()) == Some(&env.revision)
            })
    }

    /// Whether the environment is retired with no lifecycle operation in progress.
    fn retired(&self, env: Option<&pb::EnvironmentRef>) -> bool {
        self.stored(env).is_some_and(|o| {
            let retired = o
                .pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c["type"].as_str() == Some("Retired")
                            && c["status"].as_str() == Some("True")
                    })
                });
            retired && o.pointer("/status/lifecycleOperation").is_none()
        })
    }

    /// DeleteRetiredEnvironment of a retired environment, naming its PVC; once it is
    /// acknowledged the binding starts afresh.
    async fn delete_retired(&mut self, binding: &str, env: pb::EnvironmentRef) {
        let (_, _, pvc) = self.exact_identity(Some(&env));
        let operation_id = self.next_id("delete");
        let request = pb::DeleteRetiredEnvironmentRequest {
            environment: Some(env.clone()),
            owner: Some(self.spec.owner.clone()),
            expected_pvc_uid: pvc,
            operation_id: operation_id.clone(),
        };
        let result = self.client().delete_retired_environment(request).await;
        self.trace(format!("delete-retired {binding} -> {}", outcome(&result)));
        self.note_refusal(&operation_id, &result);
        if result.is_ok() {
            self.record.note_deleted(&env);
            self.bindings.get_mut(binding).expect("known binding").env = None;
        }
    }

    /// ReplaceExecutor or RetireEnvironment naming the exact identities the status shows
    /// now (racing commands, claims and the reconciler), or the deletion of a retired
    /// environment.
    pub(super) async fn lifecycle(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        if let Some(retired) = env.clone().filter(|e| self.retired(Some(e))) {
            return self.delete_retired(binding, retired).await;
        }
        let (epoch, pod, pvc) = self.exact_identity(env.as_ref());
        let operation_id = self.next_id("lifecycle");
        let owner = Some(self.spec.owner.clone());
        let replace = self.rng.random_bool(0.5);
        let result = if replace {
            let request = pb::ReplaceExecutorRequest {
                environment: env,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id: operation_id.clone(),
            };
            self.client().replace_executor(request).await.map(|_| ())
        } else {
            let request = pb::RetireEnvironmentRequest {
                environment: env,
                owner,
                expected_execution_epoch: epoch,
                expected_pod_uid: pod,
                expected_pvc_uid: pvc,
                operation_id: operation_id.clone(),
            };
            self.client().retire_environment(request).await.map(|_| ())
        };
        let what = if replace { "replace" } else { "retire" };
        self.trace(format!(
            "lifecycle {what} {binding} e{epoch} -> {}",
            outcome(&result)
        ));
        self.note_refusal(&operation_id, &result);
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

    /// A request that must be refused; success is a violation. A request naming another
    /// owner must be refused exactly like one naming an absent environment (§10.5: no
    /// refusal leaks another owner's state).
    pub(super) async fn invalid(&mut self, binding: &str) {
        let env = self.bindings[binding].env.clone();
        let (what, result) = match self.rng.random_range(0..4) {
            0 => {
                let request = self.acquire_request(env, binding, self.spec.owner.clone(), 1_000);
                let r = self.client().acquire_run(request.clone()).await.map(|_| ());
                self.note_refusal(&request.operation_id, &r);
                ("acquire with a TTL below the minimum", r)
            }
            1 if env.is_some() => {
                let request = self.acquire_request(env, binding, mallory(), 30_000);
                let r = self.client().acquire_run(request.clone()).await.map(|_| ());
                self.note_refusal(&request.operation_id, &r);
                let absent =
                    self.acquire_request(Some(absent_environment()), binding, mallory(), 30_000);
                let probe = self.client().acquire_run(absent).await.map(|_| ());
                self.same_as_absent("acquire as another owner", &r, &probe);
                ("acquire as another owner", r)
            }
            2 if self.claim(binding).is_some() => {
                let Some(claim) = self.claim(binding) else {
                    return;
                };
                let mut request = pb::FileRequest {
                    context: Some(self.context(binding, &claim)),
                    operation: pb::FileOperation::Read as i32,
                    path: "f0.txt".to_owned(),
                    ..pb::FileRequest::default()
                };
                if let Some(context) = request.context.as_mut() {
                    context.owner = Some(mallory());
                }
                let r = self.client().files(request.clone()).await.map(|_| ());
                if let Some(context) = request.context.as_mut() {
                    context.environment = Some(absent_environment());
                }
                let probe = self.client().files(request).await.map(|_| ());
                self.same_as_absent("read a file as another owner", &r, &probe);
                ("read a file as another owner", r)
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

    fn acquire_request(
        &mut self,
        environment: Option<pb::EnvironmentRef>,
        binding: &str,
        owner: pb::Owner,
        ttl_millis: i64,
    ) -> pb::AcquireRunRequest {
        pb::AcquireRunRequest {
            environment,
            owner: Some(owner),
            binding_id: binding.to_owned(),
            run_id: self.next_id("run"),
            operation_id: self.next_id("acquire"),
            ttl_millis,
        }
    }

    /// §10.5: the refusal of a request about another owner's environment must be the very
    /// refusal an absent environment gets (same code, message and details), whatever
    /// state the environment is in. Answers the client cannot know (a lost connection) prove
    /// nothing either way.
    fn same_as_absent(
        &self,
        what: &str,
        result: &Result<(), tonic::Status>,
        probe: &Result<(), tonic::Status>,
    ) {
        let (Err(refusal), Err(absent)) = (result, probe) else {
            return;
        };
        if proves_nothing(refusal) || proves_nothing(absent) {
            return;
        }
        let same = same_refusal(refusal, absent);
        if !same {
            self.unexpected(format!(
                "§10.5 {}: {what} was refused with {:?} {:?}, unlike an absent environment ({:?} {:?})",
                self.spec.host,
                refusal.code(),
                refusal.details(),
                absent.code(),
                absent.details()
            ));
        }
    }
}

/// An owner no client of the simulation attests.
fn mallory() -> pb::Owner {
    pb::Owner {
        issuer: "https://issuer.sim".into(),
        subject: "mallory".into(),
    }
}
