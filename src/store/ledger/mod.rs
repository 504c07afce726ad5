//! The capacity ledger (store §2.5, DECISIONS 16, docs/store.md "The capacity ledger"): per
//! template, the environments that occupy one of its `maxEnvironments` slots. A slot is
//! reserved by compare-and-swap before the environment resource is created; it is released
//! on a definitive rejection of that create, a lost template race or a retained deletion, and
//! reclaimed once it is proven that no create of it can still land ([`proof`]).
//!
//! The slots live in [`LEDGER_SHARDS`] ConfigMaps (the root `mecatl-execution-profile-
//! allocations` and `…-1` to `…-15`); a template whose limit is at most
//! [`format::SINGLE_SHARD_LIMIT`] uses the root alone, a larger one spreads over all of them,
//! each shard holding its fixed share of the limit ([`format`]), so every write is one
//! compare-and-swap of one shard, bounded in size whatever the number of environments. The
//! ConfigMaps are provided by the operator (Helm chart, `dev`): the store never creates them,
//! and a missing one refuses allocation with `not_ready` instead of guessing. A template's
//! entry of the format before sharding (one JSON array in the root) is migrated on first use
//! ([`migrate`]).

pub mod format;
mod migrate;
pub mod proof;
mod reserve;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

pub use self::format::{ShardEntry, decode_legacy};
pub use self::proof::{create_deadline, landed_late};
pub use self::reserve::Reservation;
use super::StoreError;
use crate::kube::crd::{
    ConditionStatus, ExecutionEnvironment, LEDGER_SHARDS, LifecyclePhase, LifecycleType,
    ledger_key, ledger_shard_name, ledger_slots_key,
};

/// How many compare-and-swap rounds a reservation or release takes before giving up.
const MAX_ROUNDS: usize = 8;

/// An environment in the last phase of retained deletion no longer holds a slot.
pub fn deallocating(o: &ExecutionEnvironment) -> bool {
    let Some(status) = o.status.as_ref() else {
        return false;
    };
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == t && c.status == ConditionStatus::True)
    };
    condition("Retired")
        && condition("ExecutorTerminated")
        && status.lifecycle_operation.as_ref().is_some_and(|op| {
            op.type_ == LifecycleType::DeleteRetiredEnvironment
                && op.phase == LifecyclePhase::ReleasingSlot
        })
}

/// The capacity ledger of one namespace.
#[derive(Clone)]
pub struct Ledger {
    config_maps: Api<ConfigMap>,
    environments: Api<ExecutionEnvironment>,
    /// Templates whose entry of the format before sharding this replica has migrated.
    migrated: Arc<Mutex<BTreeSet<String>>>,
}

/// One shard as read: its ConfigMap (for the compare-and-swap) and a template's entry.
struct Shard {
    index: usize,
    map: ConfigMap,
    entry: ShardEntry,
}

fn busy(env: &str) -> StoreError {
    StoreError::NotReady {
        env: env.to_owned(),
        reason: "capacity authority changed concurrently",
        retryable: true,
    }
}

fn missing(env: &str) -> StoreError {
    StoreError::not_ready(env, "capacity ledger ConfigMap is missing")
}

impl Ledger {
    /// The ledger of the namespace both APIs are scoped to.
    pub fn new(config_maps: Api<ConfigMap>, environments: Api<ExecutionEnvironment>) -> Self {
        Self {
            config_maps,
            environments,
            migrated: Arc::default(),
        }
    }

    async fn read_map(&self, env: &str, name: &str) -> Result<Option<ConfigMap>, StoreError> {
        self.config_maps
            .get_opt(name)
            .await
            .map_err(|e| StoreError::kube(env, e))
    }

    /// Shard `index` with `template_id`'s entry; `None` when its ConfigMap is missing.
    async fn load(
        &self,
        env: &str,
        template_id: &str,
        index: usize,
    ) -> Result<Option<Shard>, StoreError> {
        let Some(map) = self.read_map(env, &ledger_shard_name(index)).await? else {
            return Ok(None);
        };
        let key = ledger_slots_key(template_id);
        let text = map.data.as_ref().and_then(|d| d.get(&key));
        let entry = ShardEntry::decode(text.map(String::as_str))
            .map_err(|reason| StoreError::not_ready(env, reason))?;
        Ok(Some(Shard { index, map, entry }))
    }

    /// Shard `index`, which must exist.
    async fn load_required(
        &self,
        env: &str,
        template_id: &str,
        index: usize,
    ) -> Result<Shard, StoreError> {
        self.load(env, template_id, index)
            .await?
            .ok_or_else(|| missing(env))
    }

    /// Writes `shard`'s entry back by compare-and-swap; `false` when another writer won.
    async fn save(
        &self,
        env: &str,
        template_id: &str,
        shard: &mut Shard,
    ) -> Result<bool, StoreError> {
        let key = ledger_slots_key(template_id);
        let data = shard.map.data.get_or_insert_with(Default::default);
        if shard.entry.is_empty() {
            data.remove(&key);
        } else {
            data.insert(key, shard.entry.encode());
        }
        self.write(env, &shard.map).await
    }

    /// Fails clearly when a ledger ConfigMap is missing (start-up check, DECISIONS 16).
    pub async fn check_present(&self) -> Result<(), StoreError> {
        for index in 0..LEDGER_SHARDS {
            let name = ledger_shard_name(index);
            if self.read_map(&name, &name).await?.is_none() {
                return Err(StoreError::not_ready(
                    &name,
                    "capacity ledger ConfigMap is missing",
                ));
            }
        }
        Ok(())
    }

    /// Releases `allocation_id`'s slot of `template_id` wherever it is recorded (every
    /// shard, and the entry of the format before sharding). A recorded-nowhere name is
    /// success; a missing root ConfigMap is `not_ready`.
    pub async fn release(&self, template_id: &str, allocation_id: &str) -> Result<(), StoreError> {
        let env = allocation_id;
        for index in 0..LEDGER_SHARDS {
            let mut done = false;
            for _ in 0..MAX_ROUNDS {
                let Some(mut shard) = self.load(env, template_id, index).await? else {
                    if index == 0 {
                        return Err(missing(env));
                    }
                    done = true;
                    break;
                };
                let mut changed = shard.entry.slots.remove(allocation_id).is_some();
                changed |= shard.entry.overflow.remove(allocation_id);
                if index == 0 {
                    changed |= remove_legacy(env, &mut shard.map, template_id, allocation_id)?;
                }
                if !changed || self.save(env, template_id, &mut shard).await? {
                    done = true;
                    break;
                }
            }
            if !done {
                return Err(busy(env));
            }
        }
        Ok(())
    }

    /// The names holding a slot of `template_id`, as recorded in every shard and in the
    /// entry of the format before sharding.
    pub async fn entries(&self, template_id: &str) -> Result<BTreeSet<String>, StoreError> {
        let env = ledger_shard_name(0);
        let mut names = BTreeSet::new();
        for index in 0..LEDGER_SHARDS {
            let Some(shard) = self.load(&env, template_id, index).await? else {
                continue;
            };
            if index == 0 {
                names.extend(legacy_names(&env, &shard.map, template_id)?);
            }
            names.extend(shard.entry.slots.into_keys());
        }
        Ok(names)
    }

    /// Replaces a ConfigMap by compare-and-swap; `false` when another writer won.
    async fn write(&self, env: &str, map: &ConfigMap) -> Result<bool, StoreError> {
        let name = map.metadata.name.clone().unwrap_or_default();
        match self
            .config_maps
            .replace(&name, &PostParams::default(), map)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(StoreError::kube(env, e)),
        }
    }
}

/// The names of `template_id`'s entry of the format before sharding in the root `map`.
fn legacy_names(
    env: &str,
    map: &ConfigMap,
    template_id: &str,
) -> Result<BTreeSet<String>, StoreError> {
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(&ledger_key(template_id)));
    decode_legacy(text.map(String::as_str)).map_err(|reason| StoreError::not_ready(env, reason))
}

/// Removes `name` from the entry of the format before sharding in the root `map`.
fn remove_legacy(
    env: &str,
    map: &mut ConfigMap,
    template_id: &str,
    name: &str,
) -> Result<bool, StoreError> {
    let mut names = legacy_names(env, map, template_id)?;
    if !names.remove(name) {
        return Ok(false);
    }
    let text = serde_json::to_string(&names.iter().collect::<Vec<_>>())
        .unwrap_or_else(|_| "[]".to_owned());
    map.data
        .get_or_insert_with(Default::default)
        .insert(ledger_key(template_id), text);
    Ok(true)
}
