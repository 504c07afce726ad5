//! The durable high-water mark of the security authority (api-security §6.4): a ConfigMap
//! whose `state.json` holds `{"generation":N,"digest":"<hex>","fingerprints":{...}}`,
//! advanced by compare-and-swap so that every replica agrees on one authority and none can
//! roll it back.
//!
//! Advance rules: a lower generation is a rollback; the same generation with another digest
//! is drift (only a higher generation recovers); the same generation and digest writes
//! nothing; a higher generation is written. A missing ConfigMap is created; a present but
//! empty key counts as generation 0; anything unparseable fails closed.
//!
//! Key fingerprints (era A): `fingerprints` maps `<keyID>:<version>` to the SHA-256 of that
//! key's public key, for every key any published manifest ever listed. At the same
//! generation the ledger must already record every key of the candidate; an `id:version`
//! may never change its fingerprint; a new `id:version` must be above every version of that
//! id the ledger has seen ("version rollback rejected"); entries are never removed (the
//! written set is the union, so removed keys stay as tombstones), and a union above
//! [`MAX_FINGERPRINTS`] is refused ("rotate issuer"). The field is optional on read, so a
//! ledger written without it decodes (as recording no keys).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

use super::SecurityManifest;

/// The data key of the ledger ConfigMap.
pub const STATE_KEY: &str = "state.json";
/// The most key fingerprints a ledger holds; beyond it the issuer must be rotated.
pub const MAX_FINGERPRINTS: usize = 64;
const MAX_ATTEMPTS: usize = 5;
const MAX_STATE_BYTES: usize = 64 * 1024;
const MAX_KEY_ID: usize = 64;

/// One authority: a generation and the digest of its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerState {
    /// The manifest generation.
    pub generation: u64,
    /// The authority digest.
    pub digest: String,
}

/// Key fingerprints by `<keyID>:<version>`, each a lowercase hex SHA-256.
pub type Fingerprints = BTreeMap<String, String>;

/// An authority with the key fingerprints it publishes (a candidate) or that the ledger
/// has recorded so far (tombstones included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRecord {
    /// The generation and digest.
    pub state: LedgerState,
    /// The key fingerprints.
    pub fingerprints: Fingerprints,
}

impl LedgerRecord {
    /// The candidate a manifest publishes: its generation, digest and keyring.
    pub fn of(manifest: &SecurityManifest) -> Self {
        let fingerprints = manifest
            .keys
            .iter()
            .map(|k| {
                let print = k.public_key_sha256.to_ascii_lowercase();
                (format!("{}:{}", k.id, k.version), print)
            })
            .collect();
        Self {
            state: LedgerState {
                generation: manifest.generation,
                digest: super::digest::authority_digest(manifest),
            },
            fingerprints,
        }
    }
}

/// The stored JSON of `state.json`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    generation: u64,
    digest: String,
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "unique_entries"
    )]
    fingerprints: Fingerprints,
}

/// Decodes a JSON object into a map, refusing a key that appears twice.
fn unique_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Fingerprints, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = Fingerprints;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of key fingerprints")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Fingerprints, A::Error> {
            let mut entries = Fingerprints::new();
            while let Some((key, print)) = map.next_entry::<String, String>()? {
                if entries.insert(key, print).is_some() {
                    return Err(serde::de::Error::custom("duplicate key fingerprint"));
                }
            }
            Ok(entries)
        }
    }
    d.deserialize_map(Unique)
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
    /// Same generation, but the ledger does not record one of the candidate's keys.
    #[error("authority drift rejected: generation {generation} does not record key {key}")]
    KeyDrift {
        /// The generation.
        generation: u64,
        /// The unrecorded `id:version`.
        key: String,
    },
    /// An `id:version` the ledger knows comes back with another fingerprint.
    #[error("key reuse rejected: {0} was published with another fingerprint")]
    KeyReused(String),
    /// A new `id:version` is not above every version of that id the ledger has seen.
    #[error("version rollback rejected: {key} is not above version {newest} of that key")]
    VersionRollback {
        /// The new `id:version`.
        key: String,
        /// The highest version of that id the ledger has seen.
        newest: u64,
    },
    /// The union of fingerprints would exceed [`MAX_FINGERPRINTS`].
    #[error("the ledger would record {0} key fingerprints (at most 64): rotate issuer")]
    TooManyKeys(usize),
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

    /// The stored authority (`None`: no ConfigMap or an empty key, generation 0).
    pub async fn read(&self) -> Result<Option<LedgerState>, LedgerError> {
        Ok(self.read_record().await?.map(|r| r.state))
    }

    /// The stored authority with every key fingerprint recorded so far.
    pub async fn read_record(&self) -> Result<Option<LedgerRecord>, LedgerError> {
        let map = self.api.get_opt(&self.name).await?;
        parse_record(map.as_ref())
    }

    /// Advances the ledger to `candidate` publishing no keys (a peer whose keys are
    /// already recorded, or a ledger written by hand).
    pub async fn advance(&self, candidate: &LedgerState) -> Result<(), LedgerError> {
        self.publish(&LedgerRecord {
            state: candidate.clone(),
            fingerprints: Fingerprints::new(),
        })
        .await
    }

    /// Advances the ledger to `candidate` and its keys by the rules of the module header.
    pub async fn publish(&self, candidate: &LedgerRecord) -> Result<(), LedgerError> {
        for _ in 0..MAX_ATTEMPTS {
            let map = self.api.get_opt(&self.name).await?;
            let ledger = parse_record(map.as_ref())?;
            let Some(fingerprints) = decide(ledger.as_ref(), candidate)? else {
                return Ok(());
            };
            let text = serde_json::to_string(&Stored {
                generation: candidate.state.generation,
                digest: candidate.state.digest.clone(),
                fingerprints,
            })
            .expect("ledger state serializes");
            match self.write(map, text).await {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(LedgerError::Contended)
    }

    /// Replaces `map`'s value (optimistically, by its resourceVersion) or creates the map.
    async fn write(&self, map: Option<ConfigMap>, text: String) -> Result<(), kube::Error> {
        match map {
            Some(mut map) => {
                map.data
                    .get_or_insert_with(BTreeMap::new)
                    .insert(STATE_KEY.to_owned(), text);
                self.api
                    .replace(&self.name, &PostParams::default(), &map)
                    .await?;
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
                self.api.create(&PostParams::default(), &map).await?;
            }
        }
        Ok(())
    }
}

/// Judges `candidate` against what the ledger holds: `None` when nothing is to be written,
/// else the fingerprints to write (the union of both).
pub fn decide(
    ledger: Option<&LedgerRecord>,
    candidate: &LedgerRecord,
) -> Result<Option<Fingerprints>, LedgerError> {
    let empty = LedgerRecord {
        state: LedgerState {
            generation: 0,
            digest: String::new(),
        },
        fingerprints: Fingerprints::new(),
    };
    let ledger = ledger.unwrap_or(&empty);
    let (had, wants) = (&ledger.state, &candidate.state);
    if wants.generation < had.generation {
        return Err(LedgerError::Rollback {
            candidate: wants.generation,
            ledger: had.generation,
        });
    }
    if wants.generation == had.generation && wants.digest != had.digest {
        return Err(LedgerError::Drift(had.generation));
    }
    for (key, print) in &candidate.fingerprints {
        match ledger.fingerprints.get(key) {
            Some(known) if known == print => {}
            Some(_) => return Err(LedgerError::KeyReused(key.clone())),
            None if wants.generation == had.generation => {
                return Err(LedgerError::KeyDrift {
                    generation: had.generation,
                    key: key.clone(),
                });
            }
            None => check_version_is_new(&ledger.fingerprints, key)?,
        }
    }
    if wants.generation == had.generation {
        return Ok(None);
    }
    let mut union = ledger.fingerprints.clone();
    union.extend(candidate.fingerprints.clone());
    match union.len() > MAX_FINGERPRINTS {
        true => Err(LedgerError::TooManyKeys(union.len())),
        false => Ok(Some(union)),
    }
}

/// Requires the version of the new `key` to be above every recorded version of its id.
fn check_version_is_new(recorded: &Fingerprints, key: &str) -> Result<(), LedgerError> {
    let (id, version) = split_key(key).ok_or(LedgerError::Corrupt)?;
    let newest = recorded
        .keys()
        .filter_map(|k| split_key(k))
        .filter(|(other, _)| *other == id)
        .map(|(_, v)| v)
        .max();
    match newest {
        Some(newest) if version <= newest => Err(LedgerError::VersionRollback {
            key: key.to_owned(),
            newest,
        }),
        _ => Ok(()),
    }
}

/// Splits a canonical `<keyID>:<version>` (id of `[A-Za-z0-9_-]`, version a non-zero
/// decimal without leading zeros).
fn split_key(key: &str) -> Option<(&str, u64)> {
    let (id, version) = key.rsplit_once(':')?;
    let id_ok = !id.is_empty()
        && id.len() <= MAX_KEY_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let number: u64 = version.parse().ok()?;
    (id_ok && number != 0 && number.to_string() == version).then_some((id, number))
}

fn is_fingerprint(print: &str) -> bool {
    print.len() == 64
        && print
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Strictly decodes the ledger's authority in `map`.
pub fn parse(map: Option<&ConfigMap>) -> Result<Option<LedgerState>, LedgerError> {
    Ok(parse_record(map)?.map(|r| r.state))
}

/// Strictly decodes the ledger value of `map`, fingerprints included.
pub fn parse_record(map: Option<&ConfigMap>) -> Result<Option<LedgerRecord>, LedgerError> {
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
    let stored: Stored = serde_json::from_str(text).map_err(|_| LedgerError::Corrupt)?;
    let prints_ok = stored.fingerprints.len() <= MAX_FINGERPRINTS
        && stored
            .fingerprints
            .iter()
            .all(|(key, print)| split_key(key).is_some() && is_fingerprint(print));
    if stored.generation == 0 || stored.digest.is_empty() || !prints_ok {
        return Err(LedgerError::Corrupt);
    }
    Ok(Some(LedgerRecord {
        state: LedgerState {
            generation: stored.generation,
            digest: stored.digest,
        },
        fingerprints: stored.fingerprints,
    }))
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
