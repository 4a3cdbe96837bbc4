//! The invariants every simulated run must keep.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kcl_core::memory::StoreEvent;
use kcl_core::{Checkpoint, SequenceNumber, Shard, ShardId};

use super::processor::Journal;

pub struct Evidence<'a> {
    pub journal: &'a Journal,
    pub store: &'a [StoreEvent],
    pub shards: &'a [Shard],
    pub written: &'a BTreeMap<ShardId, Vec<SequenceNumber>>,
    pub failover: Duration,
}

pub fn check(e: &Evidence<'_>) -> Vec<String> {
    let mut v = Vec::new();
    no_loss(e, &mut v);
    order(e, &mut v);
    checkpoints(e, &mut v);
    fencing(e, &mut v);
    lineage(e, &mut v);
    singleton(e, &mut v);
    v
}

/// Invariant 7: the fleet's singleton task never ran on two workers at once.
fn singleton(e: &Evidence<'_>, v: &mut Vec<String>) {
    let runs = &e.journal.singleton_runs;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            // A run still open when the other started overlaps it.
            let a_end = a
                .end
                .unwrap_or(b.start.max(a.start) + std::time::Duration::from_nanos(1));
            let b_end = b
                .end
                .unwrap_or(a.start.max(b.start) + std::time::Duration::from_nanos(1));
            if a.worker != b.worker && a.start < b_end && b.start < a_end {
                v.push(format!(
                    "singleton: {} and {} ran it at once ({a:?}, {b:?})",
                    a.worker, b.worker
                ));
            }
        }
    }
}

/// Invariant 1: Every appended record was delivered at least once.
fn no_loss(e: &Evidence<'_>, v: &mut Vec<String>) {
    let delivered: BTreeSet<(&ShardId, &SequenceNumber)> = e
        .journal
        .deliveries
        .iter()
        .map(|d| (&d.shard, &d.sequence))
        .collect();
    for (shard, seqs) in e.written {
        let lost: Vec<&SequenceNumber> = seqs
            .iter()
            .filter(|s| !delivered.contains(&(shard, *s)))
            .collect();
        if let Some(first) = lost.first() {
            v.push(format!(
                "loss: {} of {} records of {shard} never delivered (first {first})",
                lost.len(),
                seqs.len()
            ));
        }
    }
}

/// Invariant 2: Within one processor instance, deliveries are in strictly increasing sequence order.
fn order(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut last: BTreeMap<u64, &SequenceNumber> = BTreeMap::new();
    for d in &e.journal.deliveries {
        if let Some(prev) = last.insert(d.instance, &d.sequence)
            && prev >= &d.sequence
        {
            v.push(format!(
                "order: instance {} on {} got {} after {prev}",
                d.instance, d.shard, d.sequence
            ));
        }
    }
}

/// Invariant 3: Checkpoints never move backwards and never pass a record the writer had not delivered.
fn checkpoints(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut current: BTreeMap<&ShardId, &Checkpoint> = BTreeMap::new();
    for ev in e.store.iter().filter(|ev| ev.operation == "checkpoint") {
        let cp = &ev.lease.checkpoint;
        let prev = current.insert(&ev.lease.key, cp);
        if let Some(prev) = prev
            && prev.progress_cmp(cp).is_none_or(|o| o.is_gt())
        {
            v.push(format!(
                "checkpoint: {} moved back from {prev} to {cp}",
                ev.lease.key
            ));
        }
        // A prepared checkpoint rewrites the committed one unchanged: only changes count.
        if prev == Some(cp) {
            continue;
        }
        if let Checkpoint::Sequence(s) = cp {
            let delivered = e.journal.deliveries.iter().any(|d| {
                d.seq < ev.seq
                    && d.worker == ev.client
                    && d.shard == ev.lease.key
                    && d.sequence == s.sequence
            });
            if !delivered {
                v.push(format!(
                    "checkpoint: {} by {} at {s} before delivering it",
                    ev.lease.key, ev.client
                ));
            }
        }
    }
}

/// The owner of `shard` right after each store event, by event order.
fn owners(store: &[StoreEvent]) -> BTreeMap<&ShardId, Vec<(u64, Option<&str>)>> {
    let mut out: BTreeMap<&ShardId, Vec<(u64, Option<&str>)>> = BTreeMap::new();
    for ev in store {
        let owner = if ev.operation == "delete" {
            None
        } else {
            ev.lease.owner.as_ref().map(|o| o.as_str())
        };
        out.entry(&ev.lease.key).or_default().push((ev.seq, owner));
    }
    out
}

/// Invariant 4, fencing. A checkpoint succeeds only for the processor instance of the
/// writer's current tenure: never once another worker took the lease, nor for an instance
/// created before the writer last (re)acquired it. And no delivery comes later than the
/// failover time after the deliverer's last successful write of that lease.
fn fencing(e: &Evidence<'_>, v: &mut Vec<String>) {
    let owners = owners(e.store);
    for a in e.journal.attempts.iter().filter(|a| a.ok) {
        let Some(history) = owners.get(&a.shard) else {
            continue;
        };
        let before: Vec<&(u64, Option<&str>)> = history
            .iter()
            .filter(|(seq, _)| *seq < a.start_seq)
            .collect();
        let owner_now = before.last().and_then(|(_, o)| *o);
        if owner_now != Some(a.worker.as_str()) {
            v.push(format!(
                "fencing: {} checkpointed {} while {owner_now:?} owned it",
                a.worker, a.shard
            ));
            continue;
        }
        // When did the writer last become owner (the previous event had another owner)?
        let acquired = before
            .windows(2)
            .filter(|w| w[0].1 != Some(a.worker.as_str()) && w[1].1 == Some(a.worker.as_str()))
            .map(|w| w[1].0)
            .next_back();
        let created = e.journal.instances.get(&a.instance).map(|i| i.created_seq);
        if let (Some(acquired), Some(created)) = (acquired, created)
            && created < acquired
        {
            v.push(format!(
                "fencing: an instance of {} from before it retook {} checkpointed",
                a.worker, a.shard
            ));
        }
    }
    let mut writes: BTreeMap<(&str, &ShardId), Vec<&StoreEvent>> = BTreeMap::new();
    for ev in e.store {
        if ev
            .lease
            .owner
            .as_ref()
            .is_some_and(|o| o.as_str() == ev.client)
        {
            writes
                .entry((ev.client.as_str(), &ev.lease.key))
                .or_default()
                .push(ev);
        }
    }
    for d in &e.journal.deliveries {
        let last = writes
            .get(&(d.worker.as_str(), &d.shard))
            .and_then(|w| w.iter().rfind(|ev| ev.seq < d.seq));
        match last {
            Some(w) if d.at.saturating_duration_since(w.at) <= e.failover => {}
            Some(w) => v.push(format!(
                "fencing: {} delivered {} of {} {:?} after its last renewal",
                d.worker,
                d.sequence,
                d.shard,
                d.at.saturating_duration_since(w.at)
            )),
            None => v.push(format!(
                "fencing: {} delivered from {} without ever writing its lease",
                d.worker, d.shard
            )),
        }
    }
}

/// Invariant 5: Lineage: no record of a child is delivered before every parent reached SHARD_END.
fn lineage(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut ended: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| ev.operation == "checkpoint" && ev.lease.checkpoint == Checkpoint::ShardEnd)
    {
        ended.entry(&ev.lease.key).or_insert(ev.seq);
    }
    let mut first: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for d in &e.journal.deliveries {
        first.entry(&d.shard).or_insert(d.seq);
    }
    for shard in e.shards {
        let Some(start) = first.get(&shard.id) else {
            continue;
        };
        for parent in &shard.parent_shard_ids {
            match ended.get(parent) {
                Some(end) if end < start => {}
                _ => v.push(format!(
                    "lineage: {} delivered before its parent {parent} ended",
                    shard.id
                )),
            }
        }
    }
}
