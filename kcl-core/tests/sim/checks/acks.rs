//! Sparse acknowledgements (`kcl_core::ack::SparseAcks`, the lease row's `kclAcked`): the
//! records past a row's checkpoint that the row says finished are never handed to a processor
//! again; and, under `Parallel`, what a change of tenure does deliver again.
//!
//! - acked-skipped: a processor instance never handles (is handed, or runs the handler of) a
//!   record that its tenure's lease row said had finished when the instance opened the shard.
//!   "Its tenure": the take whose fencing token the instance's `initialize` got (every tenure
//!   begins with a take by its worker, an adoption after a restart or a leader's assignment
//!   included). "The row when it opened": the tenure's last write of the row (the lease after
//!   it, from the store's journal) before the instance's `initialize`, decoded as the worker
//!   decodes it (`SparseAcks::decode` against that row's checkpoint; a value written with
//!   another checkpoint, or corrupt, says nothing). For a tenure's first instance that is the
//!   row it took over (its writes before the first `initialize` — a pin of the start, keys
//!   parked in a parent — keep the value and the checkpoint), so a tenure never delivers
//!   what the row it took over said had finished. A later instance of the same tenure (after
//!   a processor failure) opens at the tenure's own last write, which may rightly say less:
//!   while a parked key's entry waits for a checkpoint that passes its record the tenure
//!   writes no value at all, and a value holds at most 2,048 characters (the runs furthest
//!   from the checkpoint left out). Those records are then delivered again, as at-least-once
//!   allows; judging later instances by their own opening row is what excuses them, and
//!   nothing else is excused. An operator's reset needs no exception: it is a take of its own
//!   (a new fence) that clears the value, so a tenure begun after it takes over a row that
//!   says nothing finished, and the instances of a tenure from before it still open at that
//!   tenure's rows, which the reset fenced off.
//! - The measure (`Again`), under `Parallel`: each record handled again by a tenure after an
//!   earlier tenure of its shard had handled it (no operator's reset of the shard in between),
//!   by why.

use std::collections::{BTreeMap, BTreeSet};

use kcl_core::ack::SparseAcks;
use kcl_core::admin::RESET_OWNER;
use kcl_core::memory::StoreEvent;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, FencingToken, ShardId};

use super::Evidence;

/// Records handled again after a change of tenure under `Parallel`, by why: each record
/// counted once per tenure that handled it again, judged against the instance the change
/// interrupted (the last instance of an earlier tenure to handle it) and the row the
/// instance handling it again opened at.
#[derive(Debug, Default, Clone, Copy)]
pub struct Again {
    /// Records handled again.
    pub total: usize,
    /// Of those, not finished in the interrupted instance (its handler had not returned
    /// `Ok`, nor its dead letter been accepted) when the shard was opened again.
    pub unfinished: usize,
    /// Finished by then, but not in the row: finished after the interrupted tenure's last
    /// write of the row carrying what had finished (written every `ack_checkpoint_every`
    /// records or `ack_checkpoint_interval`), or left out of it (see the module docs).
    pub lagging: usize,
    /// In the row: each one an `acked-skipped` violation.
    pub recorded: usize,
    /// What would have been handled again without sparse acknowledgements: every record an
    /// earlier tenure had handled past the checkpoint of the row the tenure took over, up to
    /// the furthest record the tenure handled.
    pub without: usize,
}

impl std::ops::AddAssign for Again {
    fn add_assign(&mut self, o: Self) {
        self.total += o.total;
        self.unfinished += o.unfinished;
        self.lagging += o.lagging;
        self.recorded += o.recorded;
        self.without += o.without;
    }
}

/// Where an instance opened the shard.
struct Opening<'a> {
    worker: &'a str,
    shard: &'a ShardId,
    /// When `initialize` was called.
    seq: u64,
    /// The take that began its tenure.
    take: &'a StoreEvent,
    /// The tenure's last write before it opened.
    row: &'a StoreEvent,
    /// What that row said had finished past its checkpoint.
    finished: SparseAcks,
}

/// Every instance that opened a shard under a tenure the store journaled, by instance.
fn openings<'a>(e: &Evidence<'a>) -> BTreeMap<u64, Opening<'a>> {
    let mut by_shard: BTreeMap<&ShardId, Vec<&StoreEvent>> = BTreeMap::new();
    for ev in e.store {
        by_shard.entry(&ev.lease.key).or_default().push(ev);
    }
    let mut openings = BTreeMap::new();
    for (instance, i) in &e.journal.instances {
        let Some(o) = &i.opened else { continue };
        let Some(events) = by_shard.get(&o.shard) else {
            continue;
        };
        let fence = Some(FencingToken(o.fence));
        let ours = |ev: &&&StoreEvent| {
            ev.lease.fence == fence
                && ev
                    .lease
                    .owner
                    .as_ref()
                    .is_some_and(|w| w.as_str() == o.worker)
                && ev.operation != "delete"
        };
        let take = events
            .iter()
            .filter(ours)
            .find(|ev| ev.operation == "take" && ev.client == o.worker);
        let row = events.iter().filter(ours).rfind(|ev| ev.seq < o.seq);
        let (Some(take), Some(row)) = (take, row) else {
            continue;
        };
        let finished = row
            .lease
            .acked
            .as_deref()
            .and_then(|value| SparseAcks::decode(value, &row.lease.checkpoint).ok())
            .unwrap_or_default();
        openings.insert(
            *instance,
            Opening {
                worker: &o.worker,
                shard: &o.shard,
                seq: o.seq,
                take,
                row,
                finished,
            },
        );
    }
    openings
}

/// Each record each instance handled, with when it first did: delivered to its processor, or
/// its handler started (under `Parallel`).
fn handled<'a>(e: &Evidence<'a>) -> BTreeMap<(u64, &'a ExtendedSequenceNumber), u64> {
    let mut first = BTreeMap::new();
    let deliveries = (e.journal.deliveries.iter()).map(|d| (d.instance, &d.position, d.seq));
    let runs = (e.journal.runs.iter()).map(|r| (r.instance, &r.position, r.start_seq));
    for (instance, position, seq) in deliveries.chain(runs) {
        let at: &mut u64 = first.entry((instance, position)).or_insert(seq);
        *at = (*at).min(seq);
    }
    first
}

/// acked-skipped: see the module docs.
pub(super) fn acked_skipped(e: &Evidence<'_>, v: &mut Vec<String>) {
    let openings = openings(e);
    for ((instance, position), _) in handled(e) {
        let Some(o) = openings.get(&instance) else {
            continue;
        };
        if o.finished.contains(position) {
            v.push(format!(
                "acked-skipped: instance {instance} of {} on {} (fence {}) handled {position}, which its tenure's row said had finished when it opened (checkpoint {}, {} by {}: {})",
                o.worker,
                o.shard,
                o.take.lease.counter,
                o.row.lease.checkpoint,
                o.row.operation,
                o.row.client,
                o.finished
            ));
        }
    }
}

/// One instance's first handling of a record: its tenure's take, when, which instance.
struct Handling {
    take: u64,
    seq: u64,
    instance: u64,
}

/// Under `Parallel`: the records handled again after a change of tenure, by why, and what
/// would have been without sparse acknowledgements (see [`Again`]).
pub fn again(e: &Evidence<'_>) -> Again {
    let mut again = Again::default();
    if !e.parallel {
        return again;
    }
    let openings = openings(e);
    // By shard and record, each instance's first handling, in the order they happened.
    let mut handlings: BTreeMap<&ShardId, BTreeMap<&ExtendedSequenceNumber, Vec<Handling>>> =
        BTreeMap::new();
    let mut by_seq: Vec<_> = handled(e).into_iter().collect();
    by_seq.sort_by_key(|(_, seq)| *seq);
    for ((instance, position), seq) in by_seq {
        let Some(o) = openings.get(&instance) else {
            continue;
        };
        let take = o.take.seq;
        let of_record = handlings.entry(o.shard).or_default().entry(position);
        of_record.or_default().push(Handling {
            take,
            seq,
            instance,
        });
    }
    let finished = finished(e);
    let letters = crate::sim::poison::accepted(&e.journal.letters);
    for (shard, records) in &handlings {
        let resets: Vec<u64> = e
            .store
            .iter()
            .filter(|ev| &ev.lease.key == *shard && ev.client == RESET_OWNER)
            .map(|ev| ev.seq)
            .collect();
        // No reset of the shard between `from` and `to`: what came after one was asked for.
        let unbroken = |from: u64, to: u64| !resets.iter().any(|r| from < *r && *r < to);
        for (position, list) in records {
            for (n, h) in list.iter().enumerate() {
                // Each tenure's first handling, after the instance the change interrupted:
                // the last of an earlier tenure to handle it.
                let earlier = &list[..n];
                let before = earlier
                    .iter()
                    .rfind(|y| y.take < h.take && unbroken(y.seq, h.seq));
                let first = earlier.iter().all(|y| y.take != h.take);
                let (true, Some(y), Some(o)) = (first, before, openings.get(&h.instance)) else {
                    continue;
                };
                again.total += 1;
                let key = ((*shard).clone(), (*position).clone());
                let done = finished.get(&(y.instance, *position)).into_iter();
                let done = done.chain(letters.get(&key)).any(|at| *at < o.seq);
                if o.finished.contains(position) {
                    again.recorded += 1;
                } else if done {
                    again.lagging += 1;
                } else {
                    again.unfinished += 1;
                }
            }
        }
        again.without += without(records, &openings, &unbroken);
    }
    again
}

/// When each instance first finished each record: its handler returned `Ok`.
fn finished<'a>(e: &Evidence<'a>) -> BTreeMap<(u64, &'a ExtendedSequenceNumber), u64> {
    let mut at = BTreeMap::new();
    for run in &e.journal.runs {
        if let Some((end, true)) = run.end {
            let first = at.entry((run.instance, &run.position)).or_insert(end);
            *first = (*first).min(end);
        }
    }
    at
}

/// Of one shard's records, those each tenure would have handled again without sparse
/// acknowledgements: handled by an earlier tenure (before the tenure's last handling, no
/// reset between), past the checkpoint of the row the tenure took over, up to the furthest
/// record it handled.
fn without(
    records: &BTreeMap<&ExtendedSequenceNumber, Vec<Handling>>,
    openings: &BTreeMap<u64, Opening<'_>>,
    unbroken: &dyn Fn(u64, u64) -> bool,
) -> usize {
    // Each tenure: the checkpoint it took over, its furthest record, its last handling.
    let mut tenures: BTreeMap<u64, (&Checkpoint, &ExtendedSequenceNumber, u64)> = BTreeMap::new();
    for (position, list) in records {
        for h in list {
            let Some(o) = openings.get(&h.instance) else {
                continue;
            };
            let t = tenures
                .entry(h.take)
                .or_insert((&o.take.lease.checkpoint, *position, h.seq));
            t.1 = t.1.max(*position);
            t.2 = t.2.max(h.seq);
        }
    }
    let mut count = 0;
    for (take, (checkpoint, furthest, last)) in &tenures {
        let low = match checkpoint {
            Checkpoint::Sequence(at) => Some(at),
            Checkpoint::ShardEnd => continue,
            _ => None,
        };
        let past: BTreeSet<_> = records
            .range::<&ExtendedSequenceNumber, _>(..=*furthest)
            .filter(|(p, _)| low.is_none_or(|low| **p > low))
            .filter(|(_, list)| {
                let mine = list.iter().find(|h| h.take == *take);
                list.iter().any(|y| {
                    y.take < *take
                        && match mine {
                            Some(h) => y.seq < h.seq && unbroken(y.seq, h.seq),
                            None => y.seq < *last && unbroken(y.seq, *take),
                        }
                })
            })
            .map(|(p, _)| *p)
            .collect();
        count += past.len();
    }
    count
}
