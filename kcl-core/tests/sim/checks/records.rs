//! Invariants about records: none owed is lost, none from before the start is delivered,
//! order within an instance, and no repeats when only planned changes happened.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use kcl_core::{InitialPosition, Record, SequenceNumber, ShardId};

use super::{Evidence, Start};
use crate::sim::processor::Journal;

/// From which index on the records of `shard` are owed to the application.
fn owed_from(
    start: &Start,
    first_open: &BTreeMap<ShardId, usize>,
    shard: &ShardId,
    records: &[Record],
) -> usize {
    let after = |t: DateTime<Utc>| records.partition_point(|r| r.approximate_arrival < t);
    let owed = match &start.position {
        InitialPosition::TrimHorizon => 0,
        InitialPosition::AtTimestamp(t) => after(*t),
        InitialPosition::Latest => match (start.shards.get(shard), first_open.get(shard)) {
            // Born after the start, from shards the fleet tracked: all of it.
            (None, _) => 0,
            // Closed before the start: everything in it predates the consumer.
            (Some(true), _) => records.len(),
            // Open at the start: everything after the first open, or after the start if it
            // was never opened.
            (Some(false), Some(first)) => *first,
            (Some(false), None) => after(start.at),
        },
    };
    owed.min(records.len())
}

/// Per shard, the owed records never delivered (see [`no_loss`]), and how many were owed.
pub fn undelivered<'a>(
    journal: &Journal,
    records: &'a BTreeMap<ShardId, Vec<Record>>,
    first_open: &BTreeMap<ShardId, usize>,
    start: &Start,
) -> Vec<(&'a ShardId, Vec<&'a SequenceNumber>, usize)> {
    let delivered: BTreeSet<(&ShardId, &SequenceNumber)> = journal
        .deliveries
        .iter()
        .map(|d| (&d.shard, &d.sequence))
        .collect();
    records
        .iter()
        .map(|(shard, records)| {
            let owed = &records[owed_from(start, first_open, shard, records)..];
            let lost = owed
                .iter()
                .map(|r| &r.sequence_number)
                .filter(|s| !delivered.contains(&(shard, *s)))
                .collect();
            (shard, lost, owed.len())
        })
        .collect()
}

/// no-loss: every owed record was delivered at least once. Owed: everything (TRIM_HORIZON),
/// everything at or after the timestamp (AT_TIMESTAMP), everything written after the shard
/// was first opened (LATEST); records of shards that aged out are not owed.
pub(super) fn no_loss(e: &Evidence<'_>, v: &mut Vec<String>) {
    for (shard, lost, owed) in undelivered(e.journal, e.records, e.first_open, e.start) {
        if let Some(first) = lost.first() {
            v.push(format!(
                "no-loss: {} of {owed} owed records of {shard} never delivered (first {first})",
                lost.len(),
            ));
        }
    }
}

/// no-history: a consumer started at LATEST delivers nothing that arrived before it started
/// (less the pin's clock-skew margin); one started AT_TIMESTAMP nothing before the timestamp.
pub(super) fn no_history(e: &Evidence<'_>, v: &mut Vec<String>) {
    let floor = match &e.start.position {
        InitialPosition::TrimHorizon => return,
        InitialPosition::AtTimestamp(t) => *t,
        InitialPosition::Latest => {
            e.start.at - TimeDelta::from_std(e.start.skew).unwrap_or(TimeDelta::zero())
        }
    };
    let arrival: BTreeMap<(&ShardId, &SequenceNumber), DateTime<Utc>> = e
        .records
        .iter()
        .chain(e.aged_out)
        .flat_map(|(shard, records)| {
            records
                .iter()
                .map(move |r| ((shard, &r.sequence_number), r.approximate_arrival))
        })
        .collect();
    let old: Vec<_> = e
        .journal
        .deliveries
        .iter()
        .filter(|d| {
            arrival
                .get(&(&d.shard, &d.sequence))
                .is_some_and(|t| *t < floor)
        })
        .collect();
    if let Some(first) = old.first() {
        v.push(format!(
            "no-history: {} deliveries of records from before the start ({floor}), first {} of {}",
            old.len(),
            first.sequence,
            first.shard
        ));
    }
}

/// order: within one processor instance, deliveries are in strictly increasing order.
pub(super) fn order(e: &Evidence<'_>, v: &mut Vec<String>) {
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

/// no-duplicates (planned changes only): no record is delivered twice.
pub(super) fn no_duplicates(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut seen: BTreeMap<(&ShardId, &SequenceNumber), &str> = BTreeMap::new();
    let mut repeats = Vec::new();
    for d in &e.journal.deliveries {
        if let Some(first) = seen.insert((&d.shard, &d.sequence), &d.worker) {
            repeats.push((first, d));
        }
    }
    if let Some((first, d)) = repeats.first() {
        v.push(format!(
            "no-duplicates: {} records delivered twice with only planned changes, first {} of {} (to {first}, then {})",
            repeats.len(),
            d.sequence,
            d.shard,
            d.worker
        ));
    }
}
