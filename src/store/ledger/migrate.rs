//! Migrating a template's entry of the format before sharding (one JSON array of names under
//! `profile-<hex>.json` in the root ConfigMap) into shard entries, once, on its first
//! reservation: the names it lists together with every live environment of the template
//! (that format let the live environments count too) are placed like reservations, marked
//! held (their creates carried no deadline, so they are never reclaimed by proof), and the
//! array is removed in the same write as the root shard's entry. A crash part-way leaves the
//! array in place, so the next reservation migrates again; placing is idempotent.

use std::collections::BTreeSet;

use kube::api::ListParams;

use super::format::{home_shard, shard_capacity, shard_count};
use super::proof::landed_late;
use super::{Ledger, MAX_ROUNDS, Reservation, Shard, busy, deallocating, legacy_names};
use crate::kube::crd::ledger_key;
use crate::store::StoreError;

impl Ledger {
    /// Migrates `r.template_id`'s entry of the format before sharding, if there is one.
    pub(super) async fn migrate_if_needed(&self, r: &Reservation<'_>) -> Result<(), StoreError> {
        let done = |ledger: &Ledger| {
            ledger
                .migrated
                .lock()
                .is_ok_and(|m| m.contains(r.template_id))
        };
        if done(self) {
            return Ok(());
        }
        let env = r.name;
        for _ in 0..MAX_ROUNDS {
            let root = self.load_required(env, r.template_id, 0).await?;
            let key = ledger_key(r.template_id);
            if !root.map.data.as_ref().is_some_and(|d| d.contains_key(&key)) {
                if let Ok(mut m) = self.migrated.lock() {
                    m.insert(r.template_id.to_owned());
                }
                return Ok(());
            }
            let mut names = legacy_names(env, &root.map, r.template_id)?;
            names.extend(self.live_names(env, r.template_id).await?);
            let count = shard_count(r.limit);
            let mut shards = vec![root];
            for index in 1..count {
                shards.push(self.load_required(env, r.template_id, index).await?);
            }
            assign(r.limit, &mut shards, &names);
            let mut lost = false;
            for shard in shards.iter_mut().skip(1) {
                if !self.save(env, r.template_id, shard).await? {
                    lost = true;
                    break;
                }
            }
            if lost {
                continue;
            }
            let root = &mut shards[0];
            if let Some(data) = root.map.data.as_mut() {
                data.remove(&key);
            }
            if self.save(env, r.template_id, root).await? {
                tracing::info!(
                    template = r.template_id,
                    environments = names.len(),
                    "capacity ledger entry migrated to the sharded format"
                );
            }
        }
        if done(self) { Ok(()) } else { Err(busy(env)) }
    }

    /// Every live environment of `template_id` that holds a slot.
    async fn live_names(
        &self,
        env: &str,
        template_id: &str,
    ) -> Result<BTreeSet<String>, StoreError> {
        let live = self
            .environments
            .list(&ListParams::default())
            .await
            .map_err(|e| StoreError::kube(env, e))?;
        Ok(live
            .items
            .iter()
            .filter(|o| o.spec.template_id == template_id && !deallocating(o) && !landed_late(o))
            .filter_map(|o| o.metadata.name.clone())
            .collect())
    }
}

/// Places every name not yet recorded in `shards` (all of the template's shards, in index
/// order): its home shard while it has room, else the first shard with room (marking the
/// home), else its home beyond its share (the template is over its limit; nothing more is
/// admitted until it drains).
fn assign(limit: u32, shards: &mut [Shard], names: &BTreeSet<String>) {
    let count = shards.len();
    for name in names {
        if shards.iter().any(|s| s.entry.slots.contains_key(name)) {
            continue;
        }
        let home = home_shard(name, count);
        let room = |s: &Shard| s.entry.slots.len() < shard_capacity(limit, count, s.index);
        let target = if room(&shards[home]) {
            home
        } else {
            match shards.iter().position(room) {
                Some(other) => {
                    shards[home].entry.overflow.insert(name.clone());
                    other
                }
                None => home,
            }
        };
        shards[target].entry.slots.insert(name.clone(), 0);
    }
}
