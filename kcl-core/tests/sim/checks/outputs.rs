//! Invariants of exactly-once outputs, in the seeds whose processors commit their records'
//! outputs with their checkpoints (`sim/outputs.rs`). Both read the store: its journal (the
//! lease rows after every write) and the commits it applied, each journaled as the
//! `checkpoint` of its row under its own event number, merged in the order they happened.
//!
//! - output-once: no record's output is committed twice. An operator's reset of a shard's
//!   checkpoint back to P asks for the records after P again: their outputs committed
//!   before it are forgiven, and their next commit is not a duplicate.
//! - output-in-step: after every write of the lease table, for every shard, every committed
//!   output is of a record at or before the checkpoint in its row, and every owed record at
//!   or before it that has outputs has them committed. "At or before": a record's position
//!   against a sequence checkpoint (a KPL aggregate's user records by sub-sequence number),
//!   every record of the shard at `SHARD_END`, none at an initial position (`TRIM_HORIZON`,
//!   `LATEST`, `AT_TIMESTAMP`). A shard's checkpoint covers its own records only: a parent's
//!   outputs are judged against the parent's row, a child's against the child's. A deleted
//!   row (a finished shard cleaned up) keeps what it last held. Owed as `no-loss` has it:
//!   records of a shard that aged out of the stream are not owed (the worker ends such a
//!   shard itself, with nothing to commit). An operator's reset to P forgives the outputs
//!   after P (above) and excuses the owed records up to P that nobody committed.

use std::collections::{BTreeMap, BTreeSet};

use kcl_core::admin::RESET_OWNER;
use kcl_core::memory::{AppliedCommit, StoreEvent, WriteAction};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, ShardId};

use super::Evidence;
use super::records::owed_from;
use crate::sim::outputs::{record_key, writes_of};

/// Whether `checkpoint` covers the record at `position` of its own shard.
pub(super) fn covers(checkpoint: &Checkpoint, position: &ExtendedSequenceNumber) -> bool {
    match checkpoint {
        Checkpoint::Sequence(s) => position <= s,
        Checkpoint::ShardEnd => true,
        _ => false,
    }
}

/// One shard as the checks replay it.
#[derive(Default)]
struct Replayed {
    checkpoint: Option<Checkpoint>,
    /// Records whose outputs are committed (since a reset forgave them, if one did).
    committed: BTreeSet<ExtendedSequenceNumber>,
    /// Owed records a reset skipped.
    excused: BTreeSet<ExtendedSequenceNumber>,
}

/// Violations of one invariant: how many, and the first few.
pub(super) struct Tally {
    name: &'static str,
    count: usize,
    first: Vec<String>,
}

impl Tally {
    pub(super) fn new(name: &'static str) -> Self {
        Self {
            name,
            count: 0,
            first: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 3 {
            self.first.push(what);
        }
    }

    pub(super) fn report(self, v: &mut Vec<String>) {
        for (i, what) in self.first.iter().enumerate() {
            let of = if i == 0 {
                format!(" ({} in all)", self.count)
            } else {
                String::new()
            };
            v.push(format!("{}: {what}{of}", self.name));
        }
    }
}

/// One step of the replay: a write of the lease table, a commit, or both at once.
type Step<'a> = (u64, Option<&'a StoreEvent>, Option<&'a AppliedCommit>);

/// output-once and output-in-step (see the module docs).
pub(super) fn outputs(e: &Evidence<'_>, v: &mut Vec<String>) {
    let known: BTreeMap<String, (&ShardId, ExtendedSequenceNumber)> = e
        .records
        .iter()
        .chain(e.aged_out)
        .flat_map(|(shard, records)| {
            records
                .iter()
                .map(move |r| (record_key(shard, &r.position()), (shard, r.position())))
        })
        .collect();
    let owed: BTreeMap<&ShardId, Vec<ExtendedSequenceNumber>> = e
        .records
        .iter()
        .map(|(shard, records)| {
            let from = owed_from(e.start, e.openings, shard, records);
            let with_outputs = records[from..]
                .iter()
                .map(kcl_core::Record::position)
                .filter(|p| !writes_of(shard, p).is_empty());
            (shard, with_outputs.collect())
        })
        .collect();
    let mut steps: BTreeMap<u64, Step<'_>> = e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key))
        .map(|ev| (ev.seq, (ev.seq, Some(ev), None)))
        .collect();
    for c in e.commits {
        steps.entry(c.seq).or_insert((c.seq, None, None)).2 = Some(c);
    }
    let (mut once, mut step) = (Tally::new("output-once"), Tally::new("output-in-step"));
    let mut shards: BTreeMap<&ShardId, Replayed> = BTreeMap::new();
    for (_, event, commit) in steps.into_values() {
        if let Some(c) = commit {
            committed(c, &known, shards.entry(&c.shard).or_default(), &mut once);
        }
        let Some(shard) = event.map(|ev| &ev.lease.key).or(commit.map(|c| &c.shard)) else {
            continue;
        };
        let replayed = shards.entry(shard).or_default();
        let before = replayed.checkpoint.clone();
        if let Some(ev) = event.filter(|ev| ev.operation != "delete") {
            replayed.checkpoint = Some(ev.lease.checkpoint.clone());
            if ev.client == RESET_OWNER && ev.operation == "checkpoint" {
                reset(replayed, &ev.lease.checkpoint, owed.get(shard));
            }
        }
        if commit.is_some() || replayed.checkpoint != before {
            let at = event.map_or_else(|| "a commit without a row".to_owned(), describe);
            in_step(shard, replayed, owed.get(shard), &at, &mut step);
        }
    }
    once.report(v);
    step.report(v);
}

/// Takes in `c`'s writes of records' outputs.
fn committed(
    c: &AppliedCommit,
    known: &BTreeMap<String, (&ShardId, ExtendedSequenceNumber)>,
    replayed: &mut Replayed,
    once: &mut Tally,
) {
    for w in &c.writes {
        if !matches!(w.action, WriteAction::Add(_)) {
            continue;
        }
        match known.get(&w.key) {
            Some((shard, position)) if *shard == &c.shard => {
                if !replayed.committed.insert(position.clone()) {
                    once.push(format!(
                        "{}'s output of {position} on {shard} committed again (fence {}, checkpoint {} after {}, reported {})",
                        c.client, c.fence.0, c.checkpoint, c.before, c.reported
                    ));
                }
            }
            _ => once.push(format!(
                "{} committed {} on {}, no record of that shard's",
                c.client, w.key, c.shard
            )),
        }
    }
}

/// An operator's reset to `to`: the outputs after it are forgiven, the owed records up to
/// it that have none are excused.
fn reset(replayed: &mut Replayed, to: &Checkpoint, owed: Option<&Vec<ExtendedSequenceNumber>>) {
    replayed.committed.retain(|p| covers(to, p));
    for p in owed.into_iter().flatten().take_while(|p| covers(to, p)) {
        if !replayed.committed.contains(p) {
            replayed.excused.insert(p.clone());
        }
    }
}

/// Checks `replayed`'s outputs against its checkpoint, as of `at`.
fn in_step(
    shard: &ShardId,
    replayed: &Replayed,
    owed: Option<&Vec<ExtendedSequenceNumber>>,
    at: &str,
    step: &mut Tally,
) {
    let checkpoint = replayed
        .checkpoint
        .clone()
        .unwrap_or(Checkpoint::TrimHorizon);
    if let Some(past) = replayed.committed.iter().find(|p| !covers(&checkpoint, p)) {
        step.push(format!(
            "{shard}: the output of {past} committed, past the checkpoint {checkpoint} ({at})"
        ));
    }
    let missing = owed
        .into_iter()
        .flatten()
        .take_while(|p| covers(&checkpoint, p))
        .find(|p| !replayed.committed.contains(*p) && !replayed.excused.contains(*p));
    if let Some(missing) = missing {
        step.push(format!(
            "{shard}: checkpoint {checkpoint} passed {missing} without its output ({at})"
        ));
    }
}

fn describe(ev: &StoreEvent) -> String {
    format!(
        "{}'s {} seq {}, fence {:?}",
        ev.client,
        ev.operation,
        ev.seq,
        ev.lease.fence.map(|f| f.0)
    )
}
