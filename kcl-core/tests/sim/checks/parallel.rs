//! Invariants of fleets that process with `Parallel`: order per key, and checkpoints that
//! never pass an unfinished record.

use std::collections::BTreeMap;

use kcl_core::admin::RESET_OWNER;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, ShardId};

use super::Evidence;
use crate::sim::handler::HandlerRun;

/// key-order: within one processor instance, the runs of one key never overlap and go in
/// sequence order; after a run failed, no later run of its key starts in that instance.
pub(super) fn key_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut last: BTreeMap<(u64, &str), &HandlerRun> = BTreeMap::new();
    let mut runs: Vec<&HandlerRun> = e.journal.runs.iter().collect();
    runs.sort_by_key(|r| r.start_seq);
    for run in runs {
        let Some(previous) = last.insert((run.instance, &run.key), run) else {
            continue;
        };
        let why = match previous.end {
            _ if run.position <= previous.position => "out of sequence order after",
            None => "while still running (or after it was cut short):",
            Some((_, false)) => "after the failed",
            Some((end, true)) if end > run.start_seq => "overlapping",
            Some(_) => continue,
        };
        v.push(format!(
            "key-order: instance {} of {} on {} started {} of key {} {why} {}",
            run.instance, run.worker, run.shard, run.position, run.key, previous.position
        ));
    }
}

/// watermark: each checkpoint a worker writes (`SHARD_END` included) covers only records
/// whose handler had finished with `Ok` before the write: every record after the previous
/// checkpoint, up to the new one (from the first record handled, after a start at a
/// position rather than a sequence number). Operator resets set a new baseline; the end of a
/// shard that aged out is not checked.
pub(super) fn watermark(e: &Evidence<'_>, v: &mut Vec<String>) {
    // The first successful end of each record's handler.
    let mut finished: BTreeMap<(&ShardId, &ExtendedSequenceNumber), u64> = BTreeMap::new();
    for run in &e.journal.runs {
        if let Some((end, true)) = run.end {
            let at = finished.entry((&run.shard, &run.position)).or_insert(end);
            *at = (*at).min(end);
        }
    }
    let mut current: BTreeMap<&ShardId, &Checkpoint> = BTreeMap::new();
    let writes = e
        .store
        .iter()
        .filter(|ev| ev.operation == "checkpoint" && !is_coordination_key(&ev.lease.key));
    for ev in writes {
        let (shard, cp) = (&ev.lease.key, &ev.lease.checkpoint);
        let previous = current.insert(shard, cp);
        if ev.client == RESET_OWNER || previous == Some(cp) {
            continue;
        }
        let low = match previous {
            Some(Checkpoint::Sequence(p)) => Some(p.clone()),
            _ => None,
        };
        let (records, aged_out) = match e.records.get(shard) {
            Some(records) => (Some(records), false),
            None => (e.aged_out.get(shard), true),
        };
        let high = match cp {
            Checkpoint::Sequence(p) => Some(p),
            // A shard that aged out ends where reading found it gone, whatever was read: its
            // records are not owed (`no-loss`).
            Checkpoint::ShardEnd if aged_out => continue,
            Checkpoint::ShardEnd => None,
            _ => continue,
        };
        let first_handled = e
            .journal
            .runs
            .iter()
            .filter(|r| &r.shard == shard && r.start_seq < ev.seq)
            .map(|r| &r.position)
            .min();
        let unfinished = records
            .into_iter()
            .flatten()
            .map(|r| r.position())
            .find(|p| {
                let after_low = match &low {
                    Some(low) => p > low,
                    None => first_handled.is_some_and(|f| p >= f),
                };
                after_low
                    && high.is_none_or(|h| p <= h)
                    && finished.get(&(shard, p)).is_none_or(|end| *end > ev.seq)
            });
        if let Some(p) = unfinished {
            v.push(format!(
                "watermark: {} by {} checkpointed {cp} while {p} was unfinished",
                shard, ev.client
            ));
        }
    }
}
