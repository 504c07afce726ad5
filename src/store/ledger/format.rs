//! The stored form of the capacity ledger: how a template's slots are spread over the shard
//! ConfigMaps, each shard's share of the limit, and the strict encoding of one shard's entry
//! (and of the single-array entry of the format before sharding, which is still read).
//!
//! One shard entry (key `profile-<hex>.slots`) is
//! `{"slots":[["exec-…",1800000030],["exec-…",0]],"overflow":["exec-…"]}`: each slot is an
//! environment name with the create deadline of its newest reservation (unix seconds; `0` once
//! a created environment was seen holding it), sorted by name; `overflow` names environments
//! whose home is this shard but whose slot is in another shard (this one was full).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kube::crd::LEDGER_SHARDS;

/// A template whose limit is at most this keeps its slots in the root ConfigMap alone: one
/// object, exact and at most ~70 KiB. Larger limits spread over all [`LEDGER_SHARDS`].
pub const SINGLE_SHARD_LIMIT: u32 = 1024;

/// The largest value of one entry read back (the API server refuses objects over ~1.5 MiB).
const MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// How many shards a template with `limit` uses.
#[must_use]
pub fn shard_count(limit: u32) -> usize {
    if limit <= SINGLE_SHARD_LIMIT {
        1
    } else {
        LEDGER_SHARDS
    }
}

/// Shard `index`'s share of `limit` when the template uses `count` shards; the shares sum
/// to `limit` exactly.
#[must_use]
pub fn shard_capacity(limit: u32, count: usize, index: usize) -> usize {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let count = count.max(1);
    limit / count + usize::from(index < limit % count)
}

/// The shard an environment name tries first.
#[must_use]
pub fn home_shard(name: &str, count: usize) -> usize {
    let digest = Sha256::digest(name.as_bytes());
    usize::from(digest[0]) % count.max(1)
}

/// Which of `with_room` shards that still have room takes `name` when its home is full: the
/// second byte of SHA-256(name) modulo their number, so names that overflow at the same time
/// spread over every shard with room instead of all racing for the same one.
pub fn away_choice(name: &str, with_room: usize) -> usize {
    let digest = Sha256::digest(name.as_bytes());
    usize::from(digest[1]) % with_room.max(1)
}

/// One template's entry in one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardEntry {
    /// Environment name → create deadline (unix seconds) of its newest reservation; 0 once
    /// held by a created environment.
    pub slots: BTreeMap<String, u64>,
    /// Names whose home is this shard and whose slot was placed in another shard.
    pub overflow: BTreeSet<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    slots: Vec<(String, u64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    overflow: Vec<String>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 63
}

impl ShardEntry {
    /// Strictly decodes a stored entry; absent or empty text is the empty entry. Duplicate
    /// or empty names, unknown fields and trailing data are refused.
    pub fn decode(value: Option<&str>) -> Result<Self, &'static str> {
        let Some(text) = value.filter(|t| !t.trim().is_empty()) else {
            return Ok(Self::default());
        };
        if text.len() > MAX_ENTRY_BYTES {
            return Err("capacity ledger entry too large");
        }
        let stored: Stored = serde_json::from_str(text)
            .map_err(|_| "capacity ledger entry is not a slots object")?;
        let count = stored.slots.len();
        let slots: BTreeMap<String, u64> = stored.slots.into_iter().collect();
        let overflow_count = stored.overflow.len();
        let overflow: BTreeSet<String> = stored.overflow.into_iter().collect();
        let names_ok = slots.keys().chain(&overflow).all(|n| valid_name(n));
        if slots.len() != count || overflow.len() != overflow_count || !names_ok {
            return Err("capacity ledger entry has duplicate or malformed names");
        }
        Ok(Self { slots, overflow })
    }

    /// The stored text (sorted, so equal entries encode equally).
    #[must_use]
    pub fn encode(&self) -> String {
        let stored = Stored {
            slots: self.slots.iter().map(|(n, d)| (n.clone(), *d)).collect(),
            overflow: self.overflow.iter().cloned().collect(),
        };
        serde_json::to_string(&stored).unwrap_or_else(|_| r#"{"slots":[]}"#.to_owned())
    }

    /// Whether nothing is recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.overflow.is_empty()
    }

    /// Records a reservation of `name` whose create carries `deadline`: the recorded deadline
    /// never moves back while unconfirmed (an older create may still be in flight), and a
    /// confirmed slot takes the new deadline (every older create's deadline had passed when
    /// it was confirmed). Whether anything changed.
    pub fn record(&mut self, name: &str, deadline: u64) -> bool {
        let new = match self.slots.get(name) {
            Some(&0) | None => deadline,
            Some(&old) => old.max(deadline),
        };
        self.slots.insert(name.to_owned(), new) != Some(new)
    }
}

/// Strictly decodes an entry of the format before sharding: a JSON array of distinct,
/// non-empty names. Absent or empty text is the empty set.
pub fn decode_legacy(value: Option<&str>) -> Result<BTreeSet<String>, &'static str> {
    let Some(text) = value.filter(|t| !t.trim().is_empty()) else {
        return Ok(BTreeSet::new());
    };
    if text.len() > MAX_ENTRY_BYTES {
        return Err("capacity ledger entry too large");
    }
    let names: Vec<String> =
        serde_json::from_str(text).map_err(|_| "capacity ledger entry is not a JSON array")?;
    let count = names.len();
    let set: BTreeSet<String> = names.into_iter().collect();
    if set.len() != count || set.iter().any(|n| !valid_name(n)) {
        return Err("capacity ledger entry has duplicate or empty names");
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_names_spread_over_every_shard_with_room() {
        let mut chosen = [0usize; 3];
        for n in 0..900 {
            let name = format!("exec-{n}");
            chosen[away_choice(&name, 3)] += 1;
            assert_eq!(away_choice(&name, 1), 0);
        }
        assert!(chosen.iter().all(|&c| c > 200), "{chosen:?}");
        // Independent of the home: names of one home still spread.
        let same_home: Vec<String> = (0..2000)
            .map(|n| format!("exec-{n}"))
            .filter(|name| home_shard(name, 16) == 0)
            .collect();
        let spread: std::collections::BTreeSet<usize> =
            same_home.iter().map(|name| away_choice(name, 4)).collect();
        assert_eq!(spread.len(), 4, "{} names of home 0", same_home.len());
    }

    #[test]
    fn strict_decoding_refuses_what_is_not_a_clean_entry() {
        assert_eq!(ShardEntry::decode(None), Ok(ShardEntry::default()));
        assert!(ShardEntry::decode(Some("[]")).is_err());
        assert!(ShardEntry::decode(Some(r#"{"slots":[],"extra":1}"#)).is_err());
        assert!(ShardEntry::decode(Some(r#"{"slots":[["a",1],["a",2]]}"#)).is_err());
        assert!(ShardEntry::decode(Some(r#"{"slots":[["",1]]}"#)).is_err());
        assert!(ShardEntry::decode(Some(r#"{"slots":[],"overflow":["b","b"]}"#)).is_err());
        assert!(ShardEntry::decode(Some(r#"{"slots":[]} {}"#)).is_err());
        let entry = ShardEntry::decode(Some(r#"{"slots":[["b",0],["a",7]],"overflow":["c"]}"#))
            .expect("valid");
        assert_eq!(
            entry.encode(),
            r#"{"slots":[["a",7],["b",0]],"overflow":["c"]}"#
        );
        assert_eq!(decode_legacy(Some(r#"["b","a"]"#)).unwrap().len(), 2);
        assert!(decode_legacy(Some(r#"["a","a"]"#)).is_err());
        assert!(decode_legacy(Some("{}")).is_err());
    }

    #[test]
    fn a_recorded_deadline_never_moves_back_until_confirmed() {
        let mut entry = ShardEntry::default();
        assert!(entry.record("a", 10));
        assert!(!entry.record("a", 5), "an older deadline changes nothing");
        assert_eq!(entry.slots["a"], 10);
        assert!(entry.record("a", 20));
        entry.slots.insert("a".to_owned(), 0);
        assert!(
            entry.record("a", 15),
            "a confirmed slot takes the new deadline"
        );
        assert_eq!(entry.slots["a"], 15);
    }

    #[test]
    fn shard_shares_sum_to_the_limit() {
        for limit in [1, 2, 100, 1024, 1025, 9_999, 10_000] {
            let count = shard_count(limit);
            let total: usize = (0..count).map(|i| shard_capacity(limit, count, i)).sum();
            assert_eq!(total, limit as usize, "{limit}");
        }
        assert_eq!(shard_count(1024), 1);
        assert_eq!(shard_count(10_000), LEDGER_SHARDS);
    }

    /// 10,000 environments of one template, each with an unconfirmed deadline, fit every
    /// shard far below the API server's object limit (1 MiB of ConfigMap data), and a shard
    /// write costs the same whatever the number of environments beyond one shard's share.
    #[test]
    fn ten_thousand_environments_of_one_template_stay_small_per_shard() {
        let count = shard_count(10_000);
        let mut shards = vec![ShardEntry::default(); count];
        for i in 0..10_000u32 {
            let digest = Sha256::digest(i.to_be_bytes());
            let name = format!("exec-{}", hex::encode(&digest[..20]));
            let home = home_shard(&name, count);
            shards[home].record(&name, 1_800_000_030);
        }
        let largest = shards.iter().map(|s| s.encode().len()).max().unwrap();
        assert!(
            largest < 64 * 1024,
            "largest shard entry is {largest} bytes"
        );
        let total: usize = shards.iter().map(|s| s.slots.len()).sum();
        assert_eq!(total, 10_000);
    }
}
