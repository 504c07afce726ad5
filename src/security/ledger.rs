//! The durable high-water mark of the security authority (api-security §6.4): a ConfigMap
//! whose `state.json` holds `{"generation":N,"digest":"<hex>"}`, advanced by compare-and-swap
//! so that every replica agrees on one authority and none can roll it back.
//!
//! Advance rules: a lower generation is a rollback; the same generation with another digest
//! is drift (only a higher generation recovers); the same generation and digest writes
//! nothing; a higher generation is written. A missing ConfigMap is created; a present but
//! empty key counts as generation 0; anything unparseable fails closed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

/// The data key of the ledger ConfigMap.
pub const STATE_KEY: &str = "state.json";
const MAX_ATTEMPTS: usize = 5;
const MAX_STATE_BYTES: usize = 64 * 1024;

/// One authority: a generation and the digest of its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerState {
    /// The manifest generation.
    pub generation: u64,
    /// The authority digest.
    pub digest: String,
}

/// Why the ledger refused or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The candidate's generation is below the ledger's.
    #[error("rollback rejected: generation {candidate} is below the ledger's {ledger}")]
    Rollback {
        /// The candidate generation.
        candidate: u64,
        /// The ledger generation.
        ledger: u64,
    },
    /// Same generation, different content.
    #[error("authority drift rejected: generation {0} already has another digest")]
    Drift(u64),
    /// The stored value does not decode, or has generation 0 or an empty digest.
    #[error("the authority ledger is corrupt")]
    Corrupt,
    /// Other writers kept winning.
    #[error("the authority ledger changed concurrently")]
    Contended,
    /// The Kubernetes API failed.
    #[error("the authority ledger is unreachable: {0}")]
    Api(#[from] kube::Error),
}

/// The ledger ConfigMap of one namespace.
#[derive(Clone)]
pub struct AuthorityLedger {
    api: Api<ConfigMap>,
    name: String,
}

impl AuthorityLedger {
    /// The ledger named `name` in `namespace`.
    pub fn new(kube: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(kube, namespace),
            name: name.to_owned(),
        }
    }

    /// The stored state (`None`: no ConfigMap or an empty key, generation 0).
    pub async fn read(&self) -> Result<Option<LedgerState>, LedgerError> {
        let map = self.api.get_opt(&self.name).await?;
        parse(map.as_ref())
    }

    /// Advances the ledger to `candidate` by the rules of the module header.
    pub async fn advance(&self, candidate: &LedgerState) -> Result<(), LedgerError> {
        for _ in 0..MAX_ATTEMPTS {
            let map = self.api.get_opt(&self.name).await?;
            if let Some(ledger) = parse(map.as_ref())? {
                if candidate.generation < ledger.generation {
                    return Err(LedgerError::Rollback {
                        candidate: candidate.generation,
                        ledger: ledger.generation,
                    });
                }
                if candidate.generation == ledger.generation {
                    return match candidate.digest == ledger.digest {
                        true => Ok(()),
                        false => Err(LedgerError::Drift(ledger.generation)),
                    };
                }
            }
            let text = serde_json::to_string(candidate).expect("ledger state serializes");
            let written = match map {
                Some(mut map) => {
                    map.data
                        .get_or_insert_with(BTreeMap::new)
                        .insert(STATE_KEY.to_owned(), text);
                    self.api
                        .replace(&self.name, &PostParams::default(), &map)
                        .await
                }
                None => {
                    let map = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            ..ObjectMeta::default()
                        },
                        data: Some(BTreeMap::from([(STATE_KEY.to_owned(), text)])),
                        ..ConfigMap::default()
                    };
                    self.api.create(&PostParams::default(), &map).await
                }
            };
            match written {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(LedgerError::Contended)
    }
}

/// Strictly decodes the ledger value of `map`.
pub fn parse(map: Option<&ConfigMap>) -> Result<Option<LedgerState>, LedgerError> {
    let Some(text) = map
        .and_then(|m| m.data.as_ref())
        .and_then(|d| d.get(STATE_KEY))
    else {
        return Ok(None);
    };
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() > MAX_STATE_BYTES {
        return Err(LedgerError::Corrupt);
    }
    let state: LedgerState = serde_json::from_str(text).map_err(|_| LedgerError::Corrupt)?;
    if state.generation == 0 || state.digest.is_empty() {
        return Err(LedgerError::Corrupt);
    }
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kube::apiserver::ApiServer;
    use crate::runtime::{SeededIds, SystemClock};

    fn state(generation: u64, digest: &str) -> LedgerState {
        LedgerState {
            generation,
            digest: digest.to_owned(),
        }
    }

    fn map(text: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([(STATE_KEY.to_owned(), text.to_owned())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_a_strict_nonzero_state_parses_and_an_empty_key_is_generation_zero() {
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some(&map(""))).unwrap(), None);
        let good = map(r#"{"generation":3,"digest":"ab"}"#);
        assert_eq!(parse(Some(&good)).unwrap(), Some(state(3, "ab")));
        for bad in [
            r#"{"generation":0,"digest":"ab"}"#,
            r#"{"generation":3,"digest":""}"#,
            r#"{"generation":3,"digest":"ab","fingerprints":{}}"#,
            r#"{"generation":3,"digest":"ab"} {}"#,
            "not json",
        ] {
            assert!(
                matches!(parse(Some(&map(bad))), Err(LedgerError::Corrupt)),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn the_ledger_advances_only_upwards_and_never_drifts() {
        let api = ApiServer::in_memory(Arc::new(SystemClock), Arc::new(SeededIds::new(3)));
        let ledger = AuthorityLedger::new(api.client("ns"), "ns", "authority");
        assert_eq!(ledger.read().await.unwrap(), None);
        ledger.advance(&state(1, "a")).await.unwrap();
        ledger.advance(&state(1, "a")).await.unwrap();
        assert!(matches!(
            ledger.advance(&state(1, "b")).await,
            Err(LedgerError::Drift(1))
        ));
        ledger.advance(&state(2, "b")).await.unwrap();
        assert!(matches!(
            ledger.advance(&state(1, "a")).await,
            Err(LedgerError::Rollback {
                candidate: 1,
                ledger: 2
            })
        ));
        assert_eq!(ledger.read().await.unwrap(), Some(state(2, "b")));
    }
}
