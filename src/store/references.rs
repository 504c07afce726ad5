//! Binding references: committing a pending reference, and attaching to an exact healthy
//! environment through a reference it holds.

use super::cas::{self, Decision};
use super::ensure::exact_allocation;
use super::intents::Target;
use super::predicates::{
    active, creator_matches, env_ref, healthy, ready, reference_state, schema_current,
    template_retained,
};
use super::{Allocation, Caller, EnvRef, Store, StoreError, predicates};
use crate::kube::crd::ReferenceState;

impl Store {
    /// Publishes the binding's PendingCreate reference made by `operation_id`. Replaying a
    /// commit of an already Published reference by the same operation succeeds.
    pub async fn commit_reference(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let (from, to) = (
            ReferenceState::PendingCreate,
            Target::State(ReferenceState::Published),
        );
        self.transition_reference(env, caller, binding_id, operation_id, from, to)
            .await
    }

    /// Removes the binding's Published reference. No record is success (idempotent); a
    /// pending reference is a conflict. The run claim is untouched: a run bound to the released
    /// binding simply stops validating.
    pub async fn release_reference(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
    ) -> Result<(), StoreError> {
        cas::update_status(&self.api, &env.id, |o| {
            if !creator_matches(o, caller) {
                return Err(StoreError::not_found(&env.id, "creator or owner differs"));
            }
            if !schema_current(o) {
                return Err(StoreError::not_ready(&env.id, "incompatible schema"));
            }
            if predicates::status(o).lifecycle_operation.is_some() {
                return Err(StoreError::NotReady {
                    env: env.id.clone(),
                    reason: "lifecycle operation in progress",
                    retryable: true,
                });
            }
            if o.spec.revision != env.revision {
                return Err(StoreError::not_found(&env.id, "revision differs"));
            }
            let status = o.status.get_or_insert_with(Default::default);
            let Some(index) = status
                .references
                .iter()
                .position(|r| r.binding_id == binding_id)
            else {
                return Ok(Decision::Keep(()));
            };
            if status.references[index].state != ReferenceState::Published {
                return Err(StoreError::conflict(
                    &env.id,
                    "reference has a pending transaction",
                ));
            }
            status.references.remove(index);
            Ok(Decision::Write(()))
        })
        .await
    }

    /// Attaches to the exact, healthy, ready environment through the caller's binding.
    /// Validation only: nothing is written and no epoch changes.
    pub async fn attach(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
    ) -> Result<Allocation, StoreError> {
        let o = cas::get(&self.api, &env.id)
            .await?
            .ok_or_else(|| StoreError::not_found(&env.id, "environment does not exist"))?;
        if !creator_matches(&o, caller) {
            return Err(StoreError::not_found(&env.id, "creator or owner differs"));
        }
        if !schema_current(&o) {
            return Err(StoreError::not_ready(&env.id, "incompatible schema"));
        }
        let allocation = exact_allocation(&o, caller, binding_id)?;
        if !template_retained(&o, &self.templates) {
            return Err(StoreError::not_ready(&env.id, "template revoked"));
        }
        if env_ref(&o) != *env || !active(&o) {
            return Err(StoreError::conflict(&env.id, "revision unavailable"));
        }
        if !(ready(&o) && healthy(&o)) {
            return Err(StoreError::NotReady {
                env: env.id.clone(),
                reason: "environment is not ready",
                retryable: true,
            });
        }
        match reference_state(&o, binding_id) {
            Some(ReferenceState::PendingCreate | ReferenceState::Published) => Ok(allocation),
            _ => Err(StoreError::not_found(&env.id, "binding not attached")),
        }
    }
}
