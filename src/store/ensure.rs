//! Allocation (`EnsureTemplate`): idempotent per (client, owner, binding); creates the
//! environment resource and initializes its status with a PendingCreate reference record.

use kube::api::PostParams;
use kube::core::ObjectMeta;

use super::cas::{self, Decision};
use super::ledger::{Reservation, create_deadline, landed_late};
use super::naming::{allocation_name, client_hash, fingerprint};
use super::predicates::{self, creator_matches, healthy, ready, schema_current};
use super::{Allocation, Caller, Store, StoreError};
use crate::kube::crd::{
    Desired, ENVIRONMENT_FINALIZER, ExecutionEnvironment, ExecutionEnvironmentSpec,
    ExecutorResources, FenceState, ReferenceRecord, ReferenceState, RfcTime, SCHEMA_VERSION,
};

/// What an allocation asks for.
#[derive(Debug, Clone)]
pub struct EnsureRequest {
    /// The caller.
    pub caller: Caller,
    /// The owner's issuer, stored for discovery.
    pub owner_issuer: String,
    /// The owner's subject.
    pub owner_subject: String,
    /// The binding.
    pub binding_id: String,
    /// The template id.
    pub template_id: String,
    /// The exact template revision.
    pub template_revision: String,
    /// The client's operation id.
    pub operation_id: String,
}

impl EnsureRequest {
    fn fingerprint(&self) -> String {
        fingerprint(&[
            &self.caller.client,
            &self.caller.owner_hash,
            &self.binding_id,
            &self.template_id,
            &self.template_revision,
        ])
    }
}

impl Store {
    /// Creates the environment for (client, owner, binding) or returns the existing one if
    /// the same request (same fingerprint and operation id) made it.
    pub async fn ensure_template(&self, req: &EnsureRequest) -> Result<Allocation, StoreError> {
        if req.operation_id.is_empty() {
            return Err(StoreError::InvalidArgument(
                "operation identity is required",
            ));
        }
        let name = allocation_name(&req.caller.client, &req.caller.owner_hash, &req.binding_id);
        let object = match cas::get(&self.api, &name).await? {
            Some(existing) => existing,
            None => self.create_environment(&name, req).await?,
        };
        refuse_landed_late(&object)?;
        check_identity(&object, req)?;
        if !predicates::template_retained(&object, &self.templates) {
            return Err(StoreError::not_found(&name, "template not found"));
        }
        self.initialize_status(&name, req).await?;
        let object = cas::get(&self.api, &name)
            .await?
            .ok_or_else(|| StoreError::not_found(&name, "environment vanished"))?;
        let record_matches = object.status.as_ref().is_some_and(|s| {
            s.references.iter().any(|r| {
                r.binding_id == req.binding_id
                    && r.operation_id == req.operation_id
                    && matches!(
                        r.state,
                        ReferenceState::PendingCreate | ReferenceState::Published
                    )
            })
        });
        if !record_matches {
            return Err(StoreError::conflict(&name, "reference operation conflicts"));
        }
        exact_allocation(&object, &req.caller, &req.binding_id)
    }

    async fn create_environment(
        &self,
        name: &str,
        req: &EnsureRequest,
    ) -> Result<ExecutionEnvironment, StoreError> {
        let revision = self
            .templates
            .select_revision(&req.template_id, &req.template_revision)
            .map_err(|_| StoreError::not_found(name, "template revision not selectable"))?;
        let spec = revision.execution();
        let now = self.now();
        let deadline = create_deadline(now);
        let object = ExecutionEnvironment {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                finalizers: Some(vec![ENVIRONMENT_FINALIZER.to_owned()]),
                ..ObjectMeta::default()
            },
            spec: ExecutionEnvironmentSpec {
                schema_version: SCHEMA_VERSION,
                allocation_id: name.to_owned(),
                revision: self.runtime.ids.hex(16),
                owner_hash: req.caller.owner_hash.clone(),
                owner_issuer: Some(req.owner_issuer.clone()),
                owner_subject: Some(req.owner_subject.clone()),
                client_hash: client_hash(&req.caller.client),
                binding_id: req.binding_id.clone(),
                request_fingerprint: req.fingerprint(),
                template_id: req.template_id.clone(),
                template_revision: req.template_revision.clone(),
                template_digest: revision.digest().to_owned(),
                image: spec.image().to_owned(),
                storage_class: spec.storage_class().to_owned(),
                storage_size: spec.storage_size().as_str().to_owned(),
                resources: ExecutorResources {
                    cpu_request: spec.cpu_request().as_str().to_owned(),
                    memory_request: spec.memory_request().as_str().to_owned(),
                    cpu_limit: spec.cpu_limit().as_str().to_owned(),
                    memory_limit: spec.memory_limit().as_str().to_owned(),
                },
                desired: Desired::Active,
                create_deadline: Some(RfcTime::from_system_time(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(deadline),
                )),
            },
            status: None,
        };
        let limit = self.templates.capacity(&req.template_id).unwrap_or(0);
        self.ledger
            .reserve(&Reservation {
                template_id: &req.template_id,
                name,
                limit,
                deadline,
                now,
            })
            .await?;
        let winner = match self.api.create(&PostParams::default(), &object).await {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match cas::get(&self.api, name).await {
                    Ok(Some(winner)) => winner,
                    Ok(None) => {
                        return Err(StoreError::conflict(
                            name,
                            "environment changed concurrently",
                        ));
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(self.after_failed_create(name, req, e).await),
        };
        if winner.spec.template_id != req.template_id {
            let _ = self.release_detached(name, &req.template_id).await;
            return Err(StoreError::AlreadyExists {
                env: name.to_owned(),
                reason: "binding belongs to another template",
            });
        }
        Ok(winner)
    }

    /// A failed create: a definitive rejection releases the reserved slot; an ambiguous
    /// failure (transport, timeout, server error) keeps it, because the resource may exist.
    async fn after_failed_create(
        &self,
        name: &str,
        req: &EnsureRequest,
        error: kube::Error,
    ) -> StoreError {
        let definitive = matches!(&error, kube::Error::Api(s) if is_definitive(s.code));
        let failure = StoreError::kube(name, error);
        if definitive && let Err(release) = self.release_detached(name, &req.template_id).await {
            tracing::warn!(env = name, %release, "could not release the capacity slot");
        }
        failure
    }

    /// Releases a slot independently of the caller's cancellation (the work is spawned).
    async fn release_detached(&self, name: &str, template_id: &str) -> Result<(), StoreError> {
        let ledger = self.ledger.clone();
        let (name, template_id) = (name.to_owned(), template_id.to_owned());
        let env = name.clone();
        tokio::spawn(async move { ledger.release(&template_id, &name).await })
            .await
            .unwrap_or_else(|_| Err(StoreError::not_ready(&env, "capacity release interrupted")))
    }

    async fn initialize_status(&self, name: &str, req: &EnsureRequest) -> Result<(), StoreError> {
        let now = RfcTime::from_system_time(self.now());
        cas::update_status(&self.api, name, |o| {
            refuse_landed_late(o)?;
            check_identity(o, req)?;
            let status = o.status.get_or_insert_with(Default::default);
            if status.epoch.unwrap_or(0) > 0 {
                if !schema_current(o) {
                    return Err(StoreError::not_ready(name, "incompatible schema"));
                }
                return Ok(Decision::Keep(()));
            }
            status.schema_version = Some(SCHEMA_VERSION);
            status.epoch = Some(1);
            status.grant_generation = Some(1);
            status.fence_state = Some(FenceState::Healthy);
            status.references = vec![ReferenceRecord {
                binding_id: req.binding_id.clone(),
                state: ReferenceState::PendingCreate,
                operation_id: req.operation_id.clone(),
                source_binding_id: None,
                created_at: now,
            }];
            Ok(Decision::Write(()))
        })
        .await
    }
}

/// Kubernetes status codes that prove a create did not happen: BadRequest, Unauthorized,
/// Forbidden, MethodNotSupported, RequestEntityTooLarge, Invalid.
fn is_definitive(code: u16) -> bool {
    matches!(code, 400 | 401 | 403 | 405 | 413 | 422)
}

/// An object that landed after its create deadline is void (its slot may have been
/// reclaimed): it is never initialized or served, and the reconciler removes it.
fn refuse_landed_late(o: &ExecutionEnvironment) -> Result<(), StoreError> {
    if landed_late(o) {
        return Err(StoreError::NotReady {
            env: o.metadata.name.clone().unwrap_or_default(),
            reason: "an allocation attempt landed after its deadline and is being removed",
            retryable: true,
        });
    }
    Ok(())
}

/// The stored identity must be exactly the request's.
fn check_identity(o: &ExecutionEnvironment, req: &EnsureRequest) -> Result<(), StoreError> {
    let name = o.metadata.name.as_deref().unwrap_or_default();
    if !creator_matches(o, &req.caller) || o.spec.binding_id != req.binding_id {
        return Err(StoreError::conflict(name, "allocation identity differs"));
    }
    if o.spec.template_id != req.template_id {
        return Err(StoreError::AlreadyExists {
            env: name.to_owned(),
            reason: "binding belongs to another template",
        });
    }
    if o.spec.template_revision != req.template_revision
        || o.spec.request_fingerprint != req.fingerprint()
    {
        return Err(StoreError::conflict(name, "allocation request differs"));
    }
    Ok(())
}

/// The allocation `o` represents for `caller` and `binding_id`.
pub fn exact_allocation(
    o: &ExecutionEnvironment,
    caller: &Caller,
    binding_id: &str,
) -> Result<Allocation, StoreError> {
    let env = predicates::env_ref(o);
    if !creator_matches(o, caller) {
        return Err(StoreError::not_found(&env.id, "creator or owner differs"));
    }
    let status = predicates::status(o);
    let (epoch, generation) = (
        status.epoch.unwrap_or(0),
        status.grant_generation.unwrap_or(0),
    );
    if env.revision.is_empty() || epoch < 1 || generation < 1 {
        return Err(StoreError::conflict(
            &env.id,
            "allocation state is malformed",
        ));
    }
    Ok(Allocation {
        ready: ready(o) && healthy(o),
        env,
        epoch,
        grant_generation: generation,
        binding_id: binding_id.to_owned(),
    })
}
