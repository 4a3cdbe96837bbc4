//! Invariants of fleets that process with `Parallel`: order per key, and checkpoints that
//! never pass an unfinished record.

use std::collections::{BTreeMap, BTreeSet};

use kcl_core::admin::RESET_OWNER;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, ShardId};

use super::Evidence;
use crate::sim::handler::HandlerRun;

/// key-order: within one processor instance, the runs of one key never overlap and go in
/// sequence order; after a run failed, no later run of its key starts in that instance —
/// under a failure policy, but its own retry, or once it was dead-lettered.
pub(super) fn key_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    let given_up = crate::sim::poison::accepted(&e.journal.letters);
    let mut last: BTreeMap<(u64, &str), &HandlerRun> = BTreeMap::new();
    let mut runs: Vec<&HandlerRun> = e.journal.runs.iter().collect();
    runs.sort_by_key(|r| r.start_seq);
    for run in runs {
        let Some(previous) = last.insert((run.instance, &run.key), run) else {
            continue;
        };
        let retried = e.poison.is_some()
            && matches!(previous.end, Some((end, false)) if end < run.start_seq)
            && (run.position == previous.position
                || (run.position > previous.position
                    && given_up
                        .get(&(run.shard.clone(), previous.position.clone()))
                        .is_some_and(|at| *at < run.start_seq)));
        let why = match previous.end {
            _ if retried => continue,
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
    // Or, under a failure policy, the sink's first acceptance of its dead letter.
    let given_up = crate::sim::poison::accepted(&e.journal.letters);
    let mut finished: BTreeMap<(&ShardId, &ExtendedSequenceNumber), u64> = given_up
        .iter()
        .map(|((shard, position), at)| ((shard, position), *at))
        .collect();
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

/// held-bound: a processor instance never holds more than `max_unacknowledged` user records
/// (and the batch that crossed it) from its oldest unfinished record on, however long that
/// one takes: at every run's start, the user records from the oldest run of the instance not
/// yet finished with `Ok` up to the starting one are fewer than `max_unacknowledged` plus
/// those of the last `max_records` stream records up to it (one batch; a KPL aggregate
/// carries several user records). Records waiting for their key have no run yet, but the
/// oldest unfinished record is always running or about to, so the count is never too high.
pub(super) fn held_bound(e: &Evidence<'_>, v: &mut Vec<String>) {
    // Under a failure policy, when each record was resolved: a run of it succeeded, or the
    // sink took it as a dead letter.
    let mut resolved = crate::sim::poison::acceptances(&e.journal.letters);
    for run in &e.journal.runs {
        if let Some((end, true)) = run.end {
            let key = (run.shard.clone(), run.position.clone());
            resolved.entry(key).or_default().push(end);
        }
    }
    for seqs in resolved.values_mut() {
        seqs.sort_unstable();
    }
    let mut by_instance: BTreeMap<u64, Vec<&HandlerRun>> = BTreeMap::new();
    for run in &e.journal.runs {
        by_instance.entry(run.instance).or_default().push(run);
    }
    for runs in by_instance.values() {
        let Some(records) = runs.first().and_then(|r| e.records.get(&r.shard)) else {
            continue;
        };
        let positions: Vec<ExtendedSequenceNumber> = records.iter().map(|r| r.position()).collect();
        let index = |p: &ExtendedSequenceNumber| positions.partition_point(|q| q < p);
        // Starts and successful ends, in the order they happened.
        let mut events: Vec<(u64, bool, &HandlerRun)> = Vec::new();
        for run in runs {
            events.push((run.start_seq, true, run));
            match run.end {
                Some((end, true)) => events.push((end, false, run)),
                // A failed run ends, under a failure policy, when its record is resolved.
                Some((_, false)) if e.poison.is_some() => {
                    let key = (run.shard.clone(), run.position.clone());
                    let after = resolved
                        .get(&key)
                        .and_then(|all| all.iter().find(|at| **at > run.start_seq));
                    if let Some(at) = after {
                        events.push((*at, false, run));
                    }
                }
                _ => {}
            }
        }
        events.sort_by_key(|(seq, ..)| *seq);
        let mut unfinished: BTreeMap<&ExtendedSequenceNumber, usize> = BTreeMap::new();
        for (_, start, run) in events {
            if !start {
                if let Some(n) = unfinished.get_mut(&run.position) {
                    *n -= 1;
                    if *n == 0 {
                        unfinished.remove(&run.position);
                    }
                }
                continue;
            }
            *unfinished.entry(&run.position).or_default() += 1;
            let Some((oldest, _)) = unfinished.first_key_value() else {
                continue;
            };
            let (from, to) = (index(oldest), index(&run.position) + 1);
            let held = to.saturating_sub(from);
            // The user records of the last `max_records` stream records up to this one.
            let mut batch = 0;
            let mut sequences = 0;
            let mut previous: Option<&ExtendedSequenceNumber> = None;
            for p in positions[from.min(to)..to].iter().rev() {
                // A stream record is a run of user records with one sequence number.
                if previous.is_none_or(|q| q.sequence != p.sequence) {
                    sequences += 1;
                }
                previous = Some(p);
                if sequences > e.batch {
                    break;
                }
                batch += 1;
            }
            if held >= e.max_unacknowledged + batch {
                v.push(format!(
                    "held-bound: instance {} of {} on {} started {} with {held} records held from the unfinished {oldest} on (max_unacknowledged {}, the last batch's {batch})",
                    run.instance, run.worker, run.shard, run.position, e.max_unacknowledged
                ));
                break;
            }
        }
    }
}

/// start-order: with one record in flight (`max_in_flight(1)`), each instance handles its
/// records one by one in delivery order — the dispatcher starts the oldest ready record
/// first, so that the watermark moves as early as it can.
pub(super) fn start_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    if e.max_in_flight != Some(1) {
        return;
    }
    let mut runs: Vec<&HandlerRun> = e.journal.runs.iter().collect();
    runs.sort_by_key(|r| r.start_seq);
    let mut last: BTreeMap<u64, &ExtendedSequenceNumber> = BTreeMap::new();
    // Under a failure policy a failed record rests outside the slot, so later records of
    // other keys start meanwhile: the runs of its key after it are exempt.
    let mut failed: BTreeSet<(u64, &str)> = BTreeSet::new();
    for run in runs {
        if e.poison.is_some() && failed.contains(&(run.instance, run.key.as_str())) {
            continue;
        }
        if matches!(run.end, Some((_, false))) {
            failed.insert((run.instance, run.key.as_str()));
        }
        if let Some(previous) = last.insert(run.instance, &run.position)
            && *previous > run.position
        {
            v.push(format!(
                "start-order: instance {} of {} on {} started {} after {previous}, one at a time",
                run.instance, run.worker, run.shard, run.position
            ));
            return;
        }
    }
}
