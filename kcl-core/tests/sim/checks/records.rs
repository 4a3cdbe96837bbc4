//! Invariants about records: none owed is lost, none from before the start is delivered,
//! order within an instance, and no repeats when only planned changes happened.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use kcl_core::{ExtendedSequenceNumber, InitialPosition, Record, ShardId};

use super::{Evidence, Start};
use crate::sim::processor::Journal;

/// Where the fleet first read each shard, and how it first leased each: what decides which
/// records are owed at `LATEST`.
pub struct Openings {
    /// Per shard, the index of the first record the first iterator opened on it pointed at.
    pub first_open: BTreeMap<ShardId, usize>,
    /// Per shard, whether its first lease was created at `LATEST`, and when (stream clock).
    pub first_lease: BTreeMap<ShardId, (bool, DateTime<Utc>)>,
    /// Shards closed at the end of the run.
    pub closed: BTreeSet<ShardId>,
    /// Shards with a parent that had a lease: the fleet tracked them from their birth.
    pub tracked: BTreeSet<ShardId>,
}

/// From which index on the records of `shard` are owed to the application.
///
/// At `LATEST`, as README states it: everything in a child of a shard the fleet tracked;
/// everything written after the fleet first opened a shard it leased at `LATEST` (never
/// opened: after the lease's creation; records written between a lease's creation and its
/// first open are not owed); nothing in a shard closed before the start; everything after
/// the start in any other.
pub(super) fn owed_from(
    start: &Start,
    openings: &Openings,
    shard: &ShardId,
    records: &[Record],
) -> usize {
    let after = |t: DateTime<Utc>| records.partition_point(|r| r.approximate_arrival < t);
    let owed = match &start.position {
        InitialPosition::TrimHorizon => 0,
        InitialPosition::AtTimestamp(t) => after(*t),
        InitialPosition::Latest if openings.tracked.contains(shard) => 0,
        InitialPosition::Latest => match openings.first_lease.get(shard) {
            Some((true, created)) => openings
                .first_open
                .get(shard)
                .copied()
                .unwrap_or_else(|| after(*created)),
            Some((false, _)) => 0,
            None if start.shards.get(shard) == Some(&true) => records.len(),
            // Never leased, so never opened, and closed since: its lease could not be created
            // (the table failing) before it closed. LATEST owes nothing before the first open.
            None if openings.closed.contains(shard) => records.len(),
            // Still open and never leased: the sync skipped it. Owed.
            None => after(start.at),
        },
    };
    owed.min(records.len())
}

/// Per shard, the owed records never delivered (see [`no_loss`]), and how many were owed.
pub fn undelivered<'a>(
    journal: &Journal,
    records: &'a BTreeMap<ShardId, Vec<Record>>,
    openings: &Openings,
    start: &Start,
) -> Vec<(&'a ShardId, Vec<ExtendedSequenceNumber>, usize)> {
    // Processed (under a failure policy, a delivery is logged once processed), or
    // dead-lettered once the sink accepted it.
    let letters: Vec<(&ShardId, ExtendedSequenceNumber)> = journal
        .letters
        .iter()
        .map(|(_, l)| (&l.shard, l.record.position()))
        .collect();
    let delivered: BTreeSet<(&ShardId, &ExtendedSequenceNumber)> = journal
        .deliveries
        .iter()
        .map(|d| (&d.shard, &d.position))
        .chain(letters.iter().map(|(s, p)| (*s, p)))
        .collect();
    records
        .iter()
        .map(|(shard, records)| {
            let owed = &records[owed_from(start, openings, shard, records)..];
            let lost = owed
                .iter()
                .map(Record::position)
                .filter(|p| !delivered.contains(&(shard, p)))
                .collect();
            (shard, lost, owed.len())
        })
        .collect()
}

/// no-loss: every owed record was delivered at least once (under a failure policy: processed,
/// or dead-lettered and accepted by the sink). Owed: everything (TRIM_HORIZON),
/// everything at or after the timestamp (AT_TIMESTAMP), everything written after the shard
/// was first opened (LATEST; see [`owed_from`]); records of shards that aged out are not
/// owed.
pub(super) fn no_loss(e: &Evidence<'_>, v: &mut Vec<String>) {
    for (shard, lost, owed) in undelivered(e.journal, e.records, e.openings, e.start) {
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
    let arrival: BTreeMap<(&ShardId, ExtendedSequenceNumber), DateTime<Utc>> = e
        .records
        .iter()
        .chain(e.aged_out)
        .flat_map(|(shard, records)| {
            records
                .iter()
                .map(move |r| ((shard, r.position()), r.approximate_arrival))
        })
        .collect();
    let old: Vec<_> = e
        .journal
        .deliveries
        .iter()
        .filter(|d| {
            arrival
                .get(&(&d.shard, d.position.clone()))
                .is_some_and(|t| *t < floor)
        })
        .collect();
    if let Some(first) = old.first() {
        v.push(format!(
            "no-history: {} deliveries of records from before the start ({floor}), first {} of {}",
            old.len(),
            first.position,
            first.shard
        ));
    }
}

/// order: within one processor instance, deliveries are in strictly increasing order (under
/// `Parallel`, per key: see `key-order`).
pub(super) fn order(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut last: BTreeMap<u64, &ExtendedSequenceNumber> = BTreeMap::new();
    for d in e.journal.deliveries.iter().filter(|d| !d.keyed) {
        if let Some(prev) = last.insert(d.instance, &d.position)
            && prev >= &d.position
        {
            v.push(format!(
                "order: instance {} on {} got {} after {prev}",
                d.instance, d.shard, d.position
            ));
        }
    }
}

/// no-duplicates (planned changes only): no record is delivered twice.
pub(super) fn no_duplicates(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut seen: BTreeMap<(&ShardId, &ExtendedSequenceNumber), &str> = BTreeMap::new();
    let mut repeats = Vec::new();
    for d in &e.journal.deliveries {
        if let Some(first) = seen.insert((&d.shard, &d.position), &d.worker) {
            repeats.push((first, d));
        }
    }
    if let Some((first, d)) = repeats.first() {
        v.push(format!(
            "no-duplicates: {} records delivered twice with only planned changes, first {} of {} (to {first}, then {})",
            repeats.len(),
            d.position,
            d.shard,
            d.worker
        ));
    }
}
