//! Reference intents (store §6): the two-phase transactions on binding reference records
//! (commit, abort, prepare/confirm/cancel delete, reserve successor) and their discovery (exact
//! lookup, per-owner and per-client listings).
//!
//! Every mutation is a compare-and-swap that checks, in this order (DECISIONS 6): creator,
//! owner and revision (`not_found`), schema (`not_ready`), no lifecycle operation
//! (`not_ready`), then strict parsing of the records (`conflict`). Replaying a transition whose
//! target state is already reached with the same operation id succeeds; any other operation id
//! is a conflict.

use std::collections::BTreeSet;

use kube::api::ListParams;

use super::cas::{self, Decision};
use super::naming::{client_hash, owner_hash};
use super::predicates::{creator_matches, env_ref, healthy, schema_current};
use super::{Caller, EnvRef, Store, StoreError};
use crate::kube::crd::{ExecutionEnvironment, ReferenceRecord, ReferenceState, RfcTime};

/// The most reference records one environment holds, and the most intents one listing returns.
pub const MAX_REFERENCES: usize = 64;

/// Where a transition moves a record to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Set this state.
    State(ReferenceState),
    /// Remove the record.
    Removed,
}

/// One reference record as discovery reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceIntent {
    /// The environment.
    pub env: EnvRef,
    /// The record.
    pub record: ReferenceRecord,
    /// The attested owner `(issuer, subject)`, filled in by the client-scoped listing.
    pub owner: Option<(String, String)>,
}

/// Strictly validates the stored records: non-empty ids, unique bindings, at most 64.
pub fn parse_references(o: &ExecutionEnvironment) -> Result<&[ReferenceRecord], StoreError> {
    let env = o.metadata.name.as_deref().unwrap_or_default();
    let invalid = || StoreError::conflict(env, "reference records are invalid");
    let status = o.status.as_ref().ok_or_else(invalid)?;
    let records = &status.references;
    let mut seen = BTreeSet::new();
    for r in records {
        if r.binding_id.is_empty() || r.operation_id.is_empty() || !seen.insert(&r.binding_id) {
            return Err(invalid());
        }
    }
    if records.len() > MAX_REFERENCES {
        return Err(invalid());
    }
    Ok(records)
}

/// The gates of every reference mutation, in order.
fn mutation_gates(
    o: &ExecutionEnvironment,
    env: &EnvRef,
    caller: &Caller,
) -> Result<(), StoreError> {
    if !creator_matches(o, caller) || env_ref(o) != *env {
        return Err(StoreError::not_found(
            &env.id,
            "creator, owner or revision differs",
        ));
    }
    if !schema_current(o) {
        return Err(StoreError::not_ready(&env.id, "incompatible schema"));
    }
    if o.status
        .as_ref()
        .is_some_and(|s| s.lifecycle_operation.is_some())
    {
        return Err(StoreError::NotReady {
            env: env.id.clone(),
            reason: "lifecycle operation in progress",
            retryable: true,
        });
    }
    parse_references(o).map(|_| ())
}

/// Records kept sorted by binding id.
fn sort(records: &mut [ReferenceRecord]) {
    records.sort_by(|a, b| a.binding_id.cmp(&b.binding_id));
}

impl Store {
    /// The generic exact transition of `binding`'s record from `from` to `to` under
    /// `operation_id` (§6.2).
    pub async fn transition_reference(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
        from: ReferenceState,
        to: Target,
    ) -> Result<(), StoreError> {
        cas::update_status(&self.api, &env.id, |o| {
            mutation_gates(o, env, caller)?;
            let records = &mut o.status.get_or_insert_with(Default::default).references;
            let Some(index) = records.iter().position(|r| r.binding_id == binding_id) else {
                return match to {
                    Target::Removed => Ok(Decision::Keep(())),
                    Target::State(_) => Err(StoreError::not_found(&env.id, "reference not found")),
                };
            };
            let record = &mut records[index];
            if record.operation_id != operation_id {
                return Err(StoreError::conflict(
                    &env.id,
                    "reference transaction mismatch",
                ));
            }
            match to {
                Target::State(state) if record.state == state => Ok(Decision::Keep(())),
                _ if record.state != from => Err(StoreError::conflict(
                    &env.id,
                    "reference transaction mismatch",
                )),
                Target::State(state) => {
                    record.state = state;
                    Ok(Decision::Write(()))
                }
                Target::Removed => {
                    records.remove(index);
                    Ok(Decision::Write(()))
                }
            }
        })
        .await
    }

    /// AbortReference: removes a PendingCreate record made by `operation_id`.
    pub async fn abort_reference(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let from = ReferenceState::PendingCreate;
        self.transition_reference(env, caller, binding_id, operation_id, from, Target::Removed)
            .await
    }

    /// ConfirmReferenceDelete: removes a PendingDelete record prepared by `operation_id`.
    pub async fn confirm_reference_delete(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let from = ReferenceState::PendingDelete;
        self.transition_reference(env, caller, binding_id, operation_id, from, Target::Removed)
            .await
    }

    /// CancelReferenceDelete: returns a PendingDelete record to Published (it keeps the delete
    /// operation id and prepare time).
    pub async fn cancel_reference_delete(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let (from, to) = (
            ReferenceState::PendingDelete,
            Target::State(ReferenceState::Published),
        );
        self.transition_reference(env, caller, binding_id, operation_id, from, to)
            .await
    }

    /// PrepareReferenceDelete: a Published record becomes PendingDelete under `operation_id`.
    pub async fn prepare_reference_delete(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let now = RfcTime::from_system_time(self.now());
        cas::update_status(&self.api, &env.id, |o| {
            mutation_gates(o, env, caller)?;
            let records = &mut o.status.get_or_insert_with(Default::default).references;
            let record = records
                .iter_mut()
                .find(|r| r.binding_id == binding_id)
                .ok_or_else(|| StoreError::not_found(&env.id, "reference not found"))?;
            match record.state {
                ReferenceState::PendingDelete if record.operation_id == operation_id => {
                    Ok(Decision::Keep(()))
                }
                ReferenceState::Published => {
                    record.state = ReferenceState::PendingDelete;
                    record.operation_id = operation_id.to_owned();
                    record.created_at = now;
                    Ok(Decision::Write(()))
                }
                _ => Err(StoreError::conflict(
                    &env.id,
                    "reference transaction mismatch",
                )),
            }
        })
        .await
    }

    /// ReserveSuccessor (§6.4): a PendingCreate record for `destination` next to the Published
    /// `source`, on a quiescent environment; an expired run is reclaimed in the same write.
    pub async fn reserve_successor(
        &self,
        env: &EnvRef,
        caller: &Caller,
        source: &str,
        destination: &str,
        operation_id: &str,
    ) -> Result<(), StoreError> {
        let now = self.now();
        cas::update_status(&self.api, &env.id, |o| {
            mutation_gates(o, env, caller)?;
            let healthy = healthy(o);
            let status = o.status.get_or_insert_with(Default::default);
            let source_published = status
                .references
                .iter()
                .any(|r| r.binding_id == source && r.state == ReferenceState::Published);
            if !source_published {
                return Err(StoreError::not_found(&env.id, "source reference not found"));
            }
            if let Some(existing) = status
                .references
                .iter()
                .find(|r| r.binding_id == destination)
            {
                let replay = existing.state == ReferenceState::PendingCreate
                    && existing.operation_id == operation_id
                    && existing.source_binding_id.as_deref() == Some(source);
                return if replay {
                    Ok(Decision::Keep(()))
                } else {
                    Err(StoreError::conflict(
                        &env.id,
                        "destination reference conflicts",
                    ))
                };
            }
            let commands_open = status.commands.iter().any(|l| l.is_open());
            if status.active_operation.is_some() || !healthy || commands_open {
                return Err(StoreError::conflict(&env.id, "not quiescent"));
            }
            if let Some(run) = &status.active_run
                && (now < run.expires_at.to_system_time() || run.claim_id.is_empty())
            {
                return Err(StoreError::conflict(&env.id, "not quiescent"));
            }
            if status.references.len() >= MAX_REFERENCES {
                return Err(StoreError::ResourceExhausted {
                    env: env.id.clone(),
                    reason: "reference limit reached",
                });
            }
            status.active_run = None;
            status.references.push(ReferenceRecord {
                binding_id: destination.to_owned(),
                state: ReferenceState::PendingCreate,
                operation_id: operation_id.to_owned(),
                source_binding_id: Some(source.to_owned()),
                created_at: RfcTime::from_system_time(now),
            });
            sort(&mut status.references);
            Ok(Decision::Write(()))
        })
        .await
    }

    /// FindReferenceIntent: the first non-Published record of `binding` on the exact
    /// environment of this creator and owner. Not subject to the listing limit.
    pub async fn find_reference_intent(
        &self,
        env: &EnvRef,
        caller: &Caller,
        binding_id: &str,
    ) -> Result<ReferenceIntent, StoreError> {
        let o = cas::get(&self.api, &env.id)
            .await?
            .filter(|o| creator_matches(o, caller) && env_ref(o) == *env)
            .ok_or_else(|| StoreError::not_found(&env.id, "environment not found"))?;
        parse_references(&o)?
            .iter()
            .find(|r| r.binding_id == binding_id && r.state != ReferenceState::Published)
            .map(|r| ReferenceIntent {
                env: env.clone(),
                record: r.clone(),
                owner: None,
            })
            .ok_or_else(|| StoreError::not_found(&env.id, "intent not found"))
    }

    /// ListReferenceIntents: the non-Published records of this creator's environments for
    /// this owner, at most `limit` (0 or above 64 means 64). A corrupt record list on a
    /// matching environment fails the whole call.
    pub async fn list_reference_intents(
        &self,
        caller: &Caller,
        limit: usize,
    ) -> Result<Vec<ReferenceIntent>, StoreError> {
        let mine = |o: &ExecutionEnvironment| creator_matches(o, caller);
        self.list_intents(limit, &client_hash(&caller.client), mine, false)
            .await
    }

    /// ListReferenceIntentsForClient: as above over every owner of this client; each intent
    /// carries the stored, verified owner attestation. An environment whose attestation does
    /// not verify fails the whole call (conflict).
    pub async fn list_reference_intents_for_client(
        &self,
        client: &str,
        limit: usize,
    ) -> Result<Vec<ReferenceIntent>, StoreError> {
        let hash = client_hash(client);
        let mine = |o: &ExecutionEnvironment| o.spec.client_hash == hash;
        self.list_intents(limit, &hash, mine, true).await
    }

    async fn list_intents(
        &self,
        limit: usize,
        client_hash: &str,
        mine: impl Fn(&ExecutionEnvironment) -> bool,
        with_owner: bool,
    ) -> Result<Vec<ReferenceIntent>, StoreError> {
        let limit = if limit == 0 || limit > MAX_REFERENCES {
            MAX_REFERENCES
        } else {
            limit
        };
        let all = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(|e| StoreError::kube(client_hash, e))?;
        let mut intents = Vec::new();
        for o in all.items.iter().filter(|o| mine(o)) {
            let owner = if with_owner {
                Some(attested_owner(o)?)
            } else {
                None
            };
            for r in parse_references(o)? {
                if r.state == ReferenceState::Published {
                    continue;
                }
                if intents.len() == limit {
                    return Ok(intents);
                }
                intents.push(ReferenceIntent {
                    env: env_ref(o),
                    record: r.clone(),
                    owner: owner.clone(),
                });
            }
        }
        Ok(intents)
    }
}

/// The stored owner attestation, verified against the owner hash.
fn attested_owner(o: &ExecutionEnvironment) -> Result<(String, String), StoreError> {
    let env = o.metadata.name.as_deref().unwrap_or_default();
    let issuer = o.spec.owner_issuer.clone().unwrap_or_default();
    let subject = o.spec.owner_subject.clone().unwrap_or_default();
    if issuer.is_empty() || subject.is_empty() || owner_hash(&issuer, &subject) != o.spec.owner_hash
    {
        return Err(StoreError::conflict(env, "owner attestation is invalid"));
    }
    Ok((issuer, subject))
}
