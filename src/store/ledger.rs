//! The capacity ledger (store §2.5, DECISIONS 16): the ConfigMap
//! `mecatl-execution-profile-allocations` holds, per template, the sorted JSON array of the
//! environments that occupy one of its `maxEnvironments` slots. A slot is reserved by
//! compare-and-swap before the environment resource is created and released only on a
//! definitive rejection of that create (or a lost template race, or retained deletion).
//!
//! The ConfigMap is provided by the operator (Helm chart, `dev`): the store never creates it,
//! and a missing ledger refuses allocation with `not_ready` instead of guessing.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};

use super::StoreError;
use crate::kube::crd::{
    ConditionStatus, ExecutionEnvironment, LEDGER_CONFIGMAP_NAME, LifecyclePhase, LifecycleType,
    ledger_key,
};

/// How many compare-and-swap rounds a reservation or release takes before giving up.
const MAX_ROUNDS: usize = 8;

/// Strictly decodes one ledger entry: a JSON array of distinct, non-empty names, at most
/// `limit` of them. An absent or empty value is the empty ledger.
pub fn decode_entry(value: Option<&str>, limit: usize) -> Result<BTreeSet<String>, &'static str> {
    let Some(text) = value.filter(|t| !t.trim().is_empty()) else {
        return Ok(BTreeSet::new());
    };
    if text.len() > crate::executor::protocol::MAX_JSON_BODY {
        return Err("capacity ledger entry too large");
    }
    let names: Vec<String> =
        serde_json::from_str(text).map_err(|_| "capacity ledger entry is not a JSON array")?;
    let count = names.len();
    let set: BTreeSet<String> = names.into_iter().collect();
    if set.len() != count || set.iter().any(String::is_empty) {
        return Err("capacity ledger entry has duplicate or empty names");
    }
    if set.len() > limit {
        return Err("capacity ledger entry exceeds the template limit");
    }
    Ok(set)
}

/// Encodes a ledger entry: the sorted JSON array.
pub fn encode_entry(names: &BTreeSet<String>) -> String {
    serde_json::to_string(&names.iter().collect::<Vec<_>>()).unwrap_or_else(|_| "[]".to_owned())
}

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
}

fn busy(env: &str) -> StoreError {
    StoreError::NotReady {
        env: env.to_owned(),
        reason: "capacity authority changed concurrently",
        retryable: true,
    }
}

impl Ledger {
    /// The ledger of the namespace both APIs are scoped to.
    pub fn new(config_maps: Api<ConfigMap>, environments: Api<ExecutionEnvironment>) -> Self {
        Self {
            config_maps,
            environments,
        }
    }

    async fn read(&self, env: &str) -> Result<Option<ConfigMap>, StoreError> {
        self.config_maps
            .get_opt(LEDGER_CONFIGMAP_NAME)
            .await
            .map_err(|e| StoreError::kube(env, e))
    }

    /// Fails clearly when the ledger ConfigMap is missing (start-up check, DECISIONS 16).
    pub async fn check_present(&self) -> Result<(), StoreError> {
        match self.read(LEDGER_CONFIGMAP_NAME).await? {
            Some(_) => Ok(()),
            None => Err(StoreError::not_ready(
                LEDGER_CONFIGMAP_NAME,
                "capacity ledger ConfigMap is missing",
            )),
        }
    }

    /// Reserves a slot of `template_id` for `allocation_id`, counting every live environment
    /// of the template the ledger does not list yet. Idempotent.
    pub async fn reserve(
        &self,
        template_id: &str,
        allocation_id: &str,
        limit: u32,
    ) -> Result<(), StoreError> {
        let env = allocation_id;
        let key = ledger_key(template_id);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        for _ in 0..MAX_ROUNDS {
            let mut map = self.read(env).await?.ok_or_else(|| {
                StoreError::not_ready(env, "capacity ledger ConfigMap is missing")
            })?;
            let data = map.data.get_or_insert_with(Default::default);
            let mut names = decode_entry(data.get(&key).map(String::as_str), limit)
                .map_err(|reason| StoreError::not_ready(env, reason))?;
            if names.contains(allocation_id) {
                return Ok(());
            }
            let live = self
                .environments
                .list(&ListParams::default())
                .await
                .map_err(|e| StoreError::kube(env, e))?;
            for o in &live.items {
                if o.spec.template_id == template_id
                    && !deallocating(o)
                    && let Some(name) = o.metadata.name.clone()
                {
                    names.insert(name);
                }
            }
            if names.len() >= limit {
                return Err(StoreError::ResourceExhausted {
                    env: env.to_owned(),
                    reason: "template capacity exhausted",
                });
            }
            names.insert(allocation_id.to_owned());
            data.insert(key.clone(), encode_entry(&names));
            if self.write(env, &map).await? {
                return Ok(());
            }
        }
        Err(busy(env))
    }

    /// Releases `allocation_id`'s slot of `template_id`. An absent ledger or entry is success.
    pub async fn release(&self, template_id: &str, allocation_id: &str) -> Result<(), StoreError> {
        let env = allocation_id;
        let key = ledger_key(template_id);
        for _ in 0..MAX_ROUNDS {
            let Some(mut map) = self.read(env).await? else {
                return Ok(());
            };
            let data = map.data.get_or_insert_with(Default::default);
            let mut names = decode_entry(data.get(&key).map(String::as_str), usize::MAX)
                .map_err(|reason| StoreError::not_ready(env, reason))?;
            if !names.remove(allocation_id) {
                return Ok(());
            }
            data.insert(key.clone(), encode_entry(&names));
            if self.write(env, &map).await? {
                return Ok(());
            }
        }
        Err(busy(env))
    }

    /// The names holding a slot of `template_id`, as recorded.
    pub async fn entries(&self, template_id: &str) -> Result<BTreeSet<String>, StoreError> {
        let map = self.read(LEDGER_CONFIGMAP_NAME).await?;
        let value = map
            .as_ref()
            .and_then(|m| m.data.as_ref())
            .and_then(|d| d.get(&ledger_key(template_id)));
        decode_entry(value.map(String::as_str), usize::MAX)
            .map_err(|reason| StoreError::not_ready(LEDGER_CONFIGMAP_NAME, reason))
    }

    /// Replaces the ConfigMap by compare-and-swap; `false` when another writer won.
    async fn write(&self, env: &str, map: &ConfigMap) -> Result<bool, StoreError> {
        match self
            .config_maps
            .replace(LEDGER_CONFIGMAP_NAME, &PostParams::default(), map)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(StoreError::kube(env, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_decoding_refuses_what_is_not_a_clean_array() {
        assert_eq!(decode_entry(None, 2), Ok(BTreeSet::new()));
        assert_eq!(decode_entry(Some(""), 2), Ok(BTreeSet::new()));
        assert!(decode_entry(Some("{}"), 2).is_err());
        assert!(decode_entry(Some(r#"["a","a"]"#), 2).is_err());
        assert!(decode_entry(Some(r#"[""]"#), 2).is_err());
        assert!(decode_entry(Some(r#"["a","b","c"]"#), 2).is_err());
        assert!(decode_entry(Some(r#"["a"] ["b"]"#), 2).is_err());
        let names = decode_entry(Some(r#"["b","a"]"#), 2).expect("valid");
        assert_eq!(encode_entry(&names), r#"["a","b"]"#);
    }
}
