//! A redrive of a parked key through its holders ([`failure::replay`](crate::failure)): which
//! rows to ask to replay which shards' letters, the requests, and when they are done.
//!
//! A parked key's letters were written by the shard that parked it and, after a reshard, by
//! the children that inherited the key. Each letter is replayed by the holder of the open
//! shard it was read from or, if that shard ended, of the one open shard descending from it
//! that parks the key: its records after the letters are there. A shard that split into
//! several children that all park the key has no such one: its letters are left out of the
//! plan, named, for the operator to decide (the stream route, `kcl-admin dead-letters redrive
//! --through-stream`).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::BackendError;
use crate::failure::{Entry, parse_entry, redrive_entry};
use crate::lease::{Lease, LeaseStore, LeaseStoreExtras};
use crate::types::{Checkpoint, ShardId};

/// One parked key's redrive through its holders: which rows to ask to replay which shards'
/// letters (see [`plan_redrive`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedrivePlan {
    /// The parked key (16 hex digits, a letter's `parked_key`).
    pub key: String,
    /// Open rows that park the key, each with its park entry and the request it gets: replay
    /// the letters read from the shards named (at least as many as counted), then unpark.
    pub requests: Vec<(ShardId, String, String)>,
    /// Ended rows that park the key: nobody holds them; unparked once the requests are done.
    pub ended: Vec<ShardId>,
    /// Shards whose letters no open row can replay, each with why.
    pub orphans: Vec<(ShardId, String)>,
}

/// Plans the redrive of `parked_key` from the table's `rows` and the count of the key's
/// letters by the shard they were read from.
pub fn plan_redrive(
    rows: &[Lease],
    parked_key: &str,
    letters: &BTreeMap<ShardId, usize>,
) -> RedrivePlan {
    let by_key: BTreeMap<&ShardId, &Lease> = rows.iter().map(|r| (&r.key, r)).collect();
    let parks = |row: &Lease| park_entry_of(row, parked_key);
    let open: Vec<&Lease> = rows
        .iter()
        .filter(|r| parks(r).is_some() && r.checkpoint != Checkpoint::ShardEnd)
        .collect();
    let mut assigned: BTreeMap<&ShardId, (usize, Vec<ShardId>)> = BTreeMap::new();
    let mut orphans = Vec::new();
    for (shard, count) in letters {
        let replayers: Vec<&ShardId> = open
            .iter()
            .filter(|r| r.key == *shard || descends(&by_key, &r.key, shard))
            .map(|r| &r.key)
            .collect();
        match replayers.as_slice() {
            [one] => {
                let entry = assigned.entry(*one).or_default();
                entry.0 += count;
                entry.1.push(shard.clone());
            }
            [] => orphans.push((
                shard.clone(),
                "no open shard that parks the key is this shard or descends from it".to_owned(),
            )),
            many => orphans.push((
                shard.clone(),
                format!(
                    "the shard split, and its children {} all park the key: which one's records \
                     come after these letters is not known",
                    many.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }
    let requests = open
        .iter()
        .filter_map(|row| {
            let park = parks(row)?;
            let (count, mut shards) = assigned.remove(&row.key).unwrap_or_default();
            // Ancestors' letters first: a shard's letters come before its children's.
            shards.sort_by_key(|s| std::cmp::Reverse(descends(&by_key, &row.key, s)));
            let request = redrive_entry(parked_key, count, &shards);
            Some((row.key.clone(), park, request))
        })
        .collect();
    let ended = rows
        .iter()
        .filter(|r| parks(r).is_some() && r.checkpoint == Checkpoint::ShardEnd)
        .map(|r| r.key.clone())
        .collect();
    RedrivePlan {
        key: parked_key.to_owned(),
        requests,
        ended,
        orphans,
    }
}

/// The row's entry parking `parked_key`, if it parks it.
fn park_entry_of(row: &Lease, parked_key: &str) -> Option<String> {
    let key = u64::from_str_radix(parked_key, 16).ok()?;
    row.parked_keys
        .iter()
        .find(|e| matches!(parse_entry(e), Some(Entry::Park(k, _)) if k == key))
        .cloned()
}

/// Whether `shard` is a strict ancestor of `row` (by the rows' parent links).
fn descends(by_key: &BTreeMap<&ShardId, &Lease>, row: &ShardId, shard: &ShardId) -> bool {
    let mut seen = BTreeSet::new();
    let mut next: Vec<&ShardId> = by_key
        .get(row)
        .map(|r| r.parent_shard_ids.iter().collect())
        .unwrap_or_default();
    while let Some(parent) = next.pop() {
        if parent == shard {
            return true;
        }
        if seen.insert(parent)
            && let Some(r) = by_key.get(parent)
        {
            next.extend(r.parent_shard_ids.iter());
        }
    }
    false
}

/// Writes the plan's requests: the rows asked (a row that no longer parks the key is left
/// out: its holder unparked it meanwhile).
pub async fn request_redrive<L: LeaseStore>(
    store: &L,
    plan: &RedrivePlan,
) -> Result<Vec<ShardId>, BackendError> {
    let mut asked = Vec::new();
    for (row, park, request) in &plan.requests {
        if store.request_redrive(row, park, request).await? {
            asked.push(row.clone());
        }
    }
    Ok(asked)
}

/// Whether the plan's requests are done (no row asked still parks the key: its holder
/// replayed the letters and unparked it), with the rows still waiting if not; once done,
/// unparks the ended rows that park it.
pub async fn redrive_done<L: LeaseStore + LeaseStoreExtras>(
    store: &L,
    plan: &RedrivePlan,
) -> Result<(bool, Vec<ShardId>), BackendError> {
    let prefix = format!("{}/", plan.key);
    let mut waiting = Vec::new();
    for (row, _, _) in &plan.requests {
        let parks = store
            .get(row)
            .await?
            .is_some_and(|r| r.parked_keys.iter().any(|e| e.starts_with(&prefix)));
        if parks {
            waiting.push(row.clone());
        }
    }
    if !waiting.is_empty() {
        return Ok((false, waiting));
    }
    for row in &plan.ended {
        let Some(lease) = store.get(row).await? else {
            continue;
        };
        let entries: Vec<String> = lease
            .parked_keys
            .iter()
            .filter(|e| e.starts_with(&prefix))
            .cloned()
            .collect();
        store.unpark(row, &entries).await?;
    }
    Ok((true, Vec::new()))
}
