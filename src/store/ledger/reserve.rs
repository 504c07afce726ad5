//! Reserving a slot: in the name's home shard while it has room (one read, one write), else
//! in another shard with room after marking the home shard (so a retry finds it), else
//! `resource_exhausted` once the slots whose creates can provably no longer land are
//! reclaimed ([`super::proof`]). A few such slots are also tidied on every routine
//! reservation, so the unconfirmed ones never pile up.

use std::time::SystemTime;

use super::format::{away_choice, home_shard, shard_capacity, shard_count};
use super::proof::{can_no_longer_land, landed_late};
use super::{Ledger, MAX_ROUNDS, Shard, ShardEntry, busy};
use crate::store::StoreError;

/// Unconfirmed slots a routine reservation checks (one read each).
const ROUTINE_CHECKS: usize = 2;
/// Unconfirmed slots an exhausted reservation checks per shard before refusing.
const EXHAUSTED_CHECKS: usize = 64;

/// A reservation: the slot of `name` in `template_id`, whose create carries `deadline`.
#[derive(Debug, Clone, Copy)]
pub struct Reservation<'a> {
    /// The template.
    pub template_id: &'a str,
    /// The environment name (the allocation id).
    pub name: &'a str,
    /// The template's pooled limit.
    pub limit: u32,
    /// The create deadline (unix seconds, [`super::create_deadline`]).
    pub deadline: u64,
    /// The provider's clock, read before anything of this reservation.
    pub now: SystemTime,
}

fn exhausted(env: &str) -> StoreError {
    StoreError::ResourceExhausted {
        env: env.to_owned(),
        reason: "template capacity exhausted",
    }
}

impl Ledger {
    /// Reserves (or refreshes the deadline of) `r.name`'s slot. Idempotent.
    pub async fn reserve(&self, r: &Reservation<'_>) -> Result<(), StoreError> {
        let env = r.name;
        self.migrate_if_needed(r).await?;
        let count = shard_count(r.limit);
        let home = home_shard(r.name, count);
        let cap = shard_capacity(r.limit, count, home);
        for _ in 0..MAX_ROUNDS {
            let mut shard = self.load_required(env, r.template_id, home).await?;
            if shard.entry.slots.contains_key(r.name) {
                if !shard.entry.record(r.name, r.deadline)
                    || self.save(env, r.template_id, &mut shard).await?
                {
                    return Ok(());
                }
                continue;
            }
            let marked = shard.entry.overflow.contains(r.name);
            if !marked && shard.entry.slots.len() < cap {
                self.tidy(r, &mut shard.entry, ROUTINE_CHECKS).await?;
                shard.entry.record(r.name, r.deadline);
                if self.save(env, r.template_id, &mut shard).await? {
                    return Ok(());
                }
                continue;
            }
            if count > 1 {
                return self.reserve_away(r, count, home).await;
            }
            let (freed, changed) = self.tidy(r, &mut shard.entry, EXHAUSTED_CHECKS).await?;
            if freed > 0 {
                shard.entry.record(r.name, r.deadline);
            }
            if changed && !self.save(env, r.template_id, &mut shard).await? {
                continue;
            }
            if freed == 0 {
                return Err(exhausted(env));
            }
            return Ok(());
        }
        Err(busy(env))
    }

    /// The home shard is full (or marks the name as placed elsewhere): mark it, then find
    /// the name's slot in another shard, or room in any shard, or reclaim, or refuse.
    async fn reserve_away(
        &self,
        r: &Reservation<'_>,
        count: usize,
        home: usize,
    ) -> Result<(), StoreError> {
        let env = r.name;
        'round: for _ in 0..MAX_ROUNDS {
            let mut home_shard = self.load_required(env, r.template_id, home).await?;
            if home_shard.entry.slots.contains_key(r.name) {
                if !home_shard.entry.record(r.name, r.deadline)
                    || self.save(env, r.template_id, &mut home_shard).await?
                {
                    return Ok(());
                }
                continue;
            }
            if home_shard.entry.overflow.insert(r.name.to_owned())
                && !self.save(env, r.template_id, &mut home_shard).await?
            {
                continue;
            }
            let mut shards = vec![home_shard];
            for step in 1..count {
                let index = (home + step) % count;
                shards.push(self.load_required(env, r.template_id, index).await?);
            }
            if let Some(shard) = shards
                .iter_mut()
                .find(|s| s.entry.slots.contains_key(r.name))
            {
                if !shard.entry.record(r.name, r.deadline)
                    || self.save(env, r.template_id, shard).await?
                {
                    return Ok(());
                }
                continue;
            }
            let with_room: Vec<usize> = (0..shards.len())
                .filter(|&i| {
                    let shard = &shards[i];
                    shard.entry.slots.len() < shard_capacity(r.limit, count, shard.index)
                })
                .collect();
            if !with_room.is_empty() {
                let chosen = with_room[away_choice(r.name, with_room.len())];
                if self.place(r, &mut shards[chosen], home).await? {
                    return Ok(());
                }
                continue 'round;
            }
            for shard in &mut shards {
                let (freed, changed) = self.tidy(r, &mut shard.entry, EXHAUSTED_CHECKS).await?;
                if freed > 0 {
                    if self.place(r, shard, home).await? {
                        return Ok(());
                    }
                    continue 'round;
                }
                if changed && !self.save(env, r.template_id, shard).await? {
                    continue 'round;
                }
            }
            return Err(exhausted(env));
        }
        Err(busy(env))
    }

    /// Records the slot in `shard`, which has room (dropping the home mark when it is the
    /// home); `false` when another writer won the shard (the caller starts a new round).
    async fn place(
        &self,
        r: &Reservation<'_>,
        shard: &mut Shard,
        home: usize,
    ) -> Result<bool, StoreError> {
        if shard.index == home {
            shard.entry.overflow.remove(r.name);
        }
        shard.entry.record(r.name, r.deadline);
        self.save(r.name, r.template_id, shard).await
    }

    /// Checks up to `budget` slots of `entry` whose creates can no longer land (oldest
    /// deadline first) with one quorum read each, made after `r.now`: an environment of this
    /// template that did not land late holds its slot (confirmed, deadline 0); anything else
    /// (no object, a void one, another template's) frees it. Returns (freed, changed).
    async fn tidy(
        &self,
        r: &Reservation<'_>,
        entry: &mut ShardEntry,
        budget: usize,
    ) -> Result<(usize, bool), StoreError> {
        let mut candidates: Vec<(u64, String)> = entry
            .slots
            .iter()
            .filter(|(name, deadline)| {
                name.as_str() != r.name && can_no_longer_land(**deadline, r.now)
            })
            .map(|(name, deadline)| (*deadline, name.clone()))
            .collect();
        candidates.sort();
        candidates.truncate(budget);
        let (mut freed, mut changed) = (0, false);
        for (_, name) in candidates {
            let live = self
                .environments
                .get_opt(&name)
                .await
                .map_err(|e| StoreError::kube(r.name, e))?;
            let holds = live
                .as_ref()
                .is_some_and(|o| o.spec.template_id == r.template_id && !landed_late(o));
            changed = true;
            if holds {
                entry.slots.insert(name, 0);
            } else {
                tracing::info!(
                    env = %name,
                    template = r.template_id,
                    "capacity slot reclaimed: its create can no longer land"
                );
                entry.slots.remove(&name);
                freed += 1;
            }
        }
        Ok((freed, changed))
    }
}
