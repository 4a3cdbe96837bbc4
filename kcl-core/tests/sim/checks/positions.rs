//! Invariants of exactly-once outputs into a sink that keeps each shard's position itself
//! (`sim/positions.rs`), in the seeds whose outputs go there. They replay three journals in
//! the order of their events: the sink's applied commits, the sink's opens as the workers saw
//! them return, and the lease table's writes.
//!
//! - output-once (into the sink): no record's output is applied twice, ever — an operator's
//!   reset behind the sink asks nothing again: the shard resumes after the sink's position.
//!   By the end, every owed record's output is applied exactly once (none lost, none twice).
//! - output-in-step (into the sink): after every applied commit, the outputs applied on its
//!   shard are those of the owed records at or before the sink's position: none past it,
//!   none missing before it.
//! - sink-fenced: every applied commit was made by the tenure the sink's row named then (the
//!   last open that fenced it, an open whose answer was lost included), and that tenure had
//!   held the lease. A commit of a tenure whose successor took the lease but had not opened
//!   the sink yet applies (the successor's open then returns its position), as does one made
//!   after an operator's reset took the lease from it: counted, not violations; once the
//!   successor opened, it is refused (counted as refused by fence).
//! - sink-resume: no record is handed to a processor at or before the position the sink
//!   returned when its tenure opened the shard (the later of lease checkpoint and sink
//!   position), and no processor starts without such an open of its tenure.
//! - lease-trails-sink: the lease row's checkpoint never moves past the sink's position on
//!   its shard (the plain write after each commit follows the sink; an open moves a lease
//!   behind up to it), except by the operator's reset.

use std::collections::{BTreeMap, BTreeSet};

use kcl_core::admin::RESET_OWNER;
use kcl_core::memory::{MemoryPositionSink, OutputItem, SinkCommit, WriteAction};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, ShardId};

use super::Evidence;
use super::outputs::{Tally, covers};
use super::records::owed_from;
use crate::sim::outputs::{record_key, writes_of};
use crate::sim::positions::SinkOpen;

/// What the sink holds at the end of a run.
pub struct SinkEvidence {
    pub commits: Vec<SinkCommit>,
    pub outputs: BTreeMap<String, OutputItem>,
    /// Commits refused because the row named another tenure.
    pub fenced_off: usize,
    pub opens: usize,
    /// Per shard, the sink's position after each applied commit, by event order.
    positions: BTreeMap<ShardId, Vec<(u64, Checkpoint)>>,
}

impl SinkEvidence {
    pub fn new(sink: &MemoryPositionSink) -> Self {
        let commits = sink.applied_commits();
        let mut positions: BTreeMap<ShardId, Vec<(u64, Checkpoint)>> = BTreeMap::new();
        for c in &commits {
            let at = positions.entry(c.shard.clone()).or_default();
            at.push((c.seq, c.checkpoint.clone()));
        }
        Self {
            commits,
            outputs: sink.outputs(),
            fenced_off: sink.fenced_off(),
            opens: sink.opens(),
            positions,
        }
    }

    /// The sink's position on `shard` just before event `seq`.
    pub fn position_at(&self, shard: &ShardId, seq: u64) -> Option<&Checkpoint> {
        let at = self.positions.get(shard)?;
        let i = at.partition_point(|(s, _)| *s < seq);
        i.checked_sub(1).map(|i| &at[i].1)
    }
}

/// How many owed records with outputs have none in the sink, nor will at the graceful stop:
/// not delivered to the last processor opened on their shard, still running on a `live`
/// worker, which commits what it was handed when it stops. The run drains until there are
/// none.
pub fn unsettled(
    journal: &crate::sim::processor::Journal,
    (records, openings, start): (
        &BTreeMap<ShardId, Vec<kcl_core::Record>>,
        &super::Openings,
        &super::Start,
    ),
    sink: &MemoryPositionSink,
    live: impl Fn(&str) -> bool,
) -> usize {
    let outputs = sink.outputs();
    let mut last: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for (instance, i) in &journal.instances {
        if let Some(o) = &i.opened {
            last.insert(&o.shard, *instance);
        }
    }
    let handed: BTreeSet<(&ShardId, &ExtendedSequenceNumber)> = journal
        .deliveries
        .iter()
        .filter(|d| last.get(&d.shard) == Some(&d.instance))
        .filter(|d| !journal.ended.contains(&d.instance) && live(&d.worker))
        .map(|d| (&d.shard, &d.position))
        .collect();
    let mut unsettled = 0;
    for (shard, records) in records {
        for r in &records[owed_from(start, openings, shard, records)..] {
            let p = r.position();
            let applied = outputs.contains_key(&record_key(shard, &p));
            if !applied && !writes_of(shard, &p).is_empty() && !handed.contains(&(shard, &p)) {
                unsettled += 1;
            }
        }
    }
    unsettled
}

/// What the sink seeds went through, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct SinkCounts {
    /// Opens that found the lease's checkpoint behind the sink's position, and of those,
    /// the ones whose tenure moved the lease up to it.
    pub behind: usize,
    pub forwarded: usize,
    /// Commits applied while the lease row already named the next tenure, which had not
    /// opened the sink yet; and while an operator's reset held it (the tenure it was taken
    /// from goes on until its validity runs out).
    pub before_successor: usize,
    pub after_reset: usize,
    /// Operator resets that went behind the sink's position.
    pub resets_behind: usize,
    /// Opens that let in a fence lower than the one the row named (a lease row made again).
    pub lower_fences: usize,
}

/// A tenure: its owner and fence.
type Tenure<'a> = (&'a str, u64);

/// Lease-row tenures by shard after each event; `None` when deleted or unowned.
type Tenures<'a> = BTreeMap<&'a ShardId, Vec<(u64, Option<Tenure<'a>>)>>;

fn tenures<'a>(e: &Evidence<'a>) -> Tenures<'a> {
    let mut out: Tenures<'a> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key))
    {
        let held = match (&ev.lease.owner, ev.lease.fence) {
            (Some(o), Some(f)) if ev.operation != "delete" => Some((o.as_str(), f.0)),
            _ => None,
        };
        out.entry(&ev.lease.key).or_default().push((ev.seq, held));
    }
    out
}

/// A position of the sink, `none` before its first commit.
fn shown(position: Option<&Checkpoint>) -> String {
    position.map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// The last entry of `history` before event `seq`.
fn before<T: Copy>(history: Option<&Vec<(u64, T)>>, seq: u64) -> Option<T> {
    let history = history?;
    let i = history.partition_point(|(s, _)| *s < seq);
    i.checked_sub(1).map(|i| history[i].1)
}

/// Every invariant of the module docs; fills in `counts`.
pub(super) fn sink(e: &Evidence<'_>, s: &SinkEvidence, v: &mut Vec<String>) -> SinkCounts {
    let mut counts = SinkCounts::default();
    once_and_in_step(e, s, v);
    fenced(e, s, v, &mut counts);
    resume(e, v);
    trails(e, s, v);
    opened(e, s, &mut counts);
    counts
}

/// Per shard, the owed records that have outputs.
fn owed<'a>(e: &Evidence<'a>) -> BTreeMap<&'a ShardId, Vec<ExtendedSequenceNumber>> {
    e.records
        .iter()
        .map(|(shard, records)| {
            let from = owed_from(e.start, e.openings, shard, records);
            let with_outputs = records[from..]
                .iter()
                .map(kcl_core::Record::position)
                .filter(|p| !writes_of(shard, p).is_empty());
            (shard, with_outputs.collect())
        })
        .collect()
}

/// output-once and output-in-step, into the sink.
fn once_and_in_step(e: &Evidence<'_>, s: &SinkEvidence, v: &mut Vec<String>) {
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
    let owed = owed(e);
    let (mut once, mut step) = (Tally::new("output-once"), Tally::new("output-in-step"));
    let mut committed: BTreeMap<&ShardId, BTreeSet<ExtendedSequenceNumber>> = BTreeMap::new();
    for c in &s.commits {
        let done = committed.entry(&c.shard).or_default();
        for w in c
            .writes
            .iter()
            .filter(|w| matches!(w.action, WriteAction::Add(_)))
        {
            match known.get(&w.key) {
                Some((shard, position)) if *shard == &c.shard => {
                    if !done.insert(position.clone()) {
                        once.push(format!(
                            "{}'s output of {position} on {shard} applied to the sink again (fence {}, {} to {})",
                            c.client, c.fence.0, shown(c.before.as_ref()), c.checkpoint
                        ));
                    }
                }
                _ => once.push(format!(
                    "{} applied {} on {}, no record of that shard's",
                    c.client, w.key, c.shard
                )),
            }
        }
        let at = format!(
            "{}'s commit to {} (fence {})",
            c.client, c.checkpoint, c.fence.0
        );
        if let Some(past) = done.iter().find(|p| !covers(&c.checkpoint, p)) {
            step.push(format!(
                "{}: the output of {past} in the sink, past its position ({at})",
                c.shard
            ));
        }
        let missing = owed
            .get(&c.shard)
            .into_iter()
            .flatten()
            .take_while(|p| covers(&c.checkpoint, p))
            .find(|p| !done.contains(*p));
        if let Some(missing) = missing {
            step.push(format!(
                "{}: the sink's position passed {missing} without its output ({at})",
                c.shard
            ));
        }
    }
    by_the_end(s, &owed, &mut once);
    once.report(v);
    step.report(v);
}

/// By the end, every owed record's output is in the sink once.
fn by_the_end(
    s: &SinkEvidence,
    owed: &BTreeMap<&ShardId, Vec<ExtendedSequenceNumber>>,
    once: &mut Tally,
) {
    let (mut lost, mut twice, mut all) = (Vec::new(), Vec::new(), 0);
    for (shard, positions) in owed {
        for p in positions {
            all += 1;
            match s.outputs.get(&record_key(shard, p)).map(|i| i.count) {
                None | Some(0) => {
                    let sink = s.positions.get(*shard).and_then(|at| at.last());
                    let sink = shown(sink.map(|(_, c)| c));
                    lost.push(format!("{p} of {shard}, the sink at {sink}"));
                }
                Some(1) => {}
                Some(n) => twice.push(format!("{p} of {shard} ({n} times)")),
            }
        }
    }
    if !lost.is_empty() || !twice.is_empty() {
        once.push(format!(
            "by the end, of {all} owed records with outputs, {} have none in the sink (first {:?}) and {} more than one (first {:?})",
            lost.len(),
            lost.first(),
            twice.len(),
            twice.first()
        ));
    }
}

/// sink-fenced.
fn fenced(e: &Evidence<'_>, s: &SinkEvidence, v: &mut Vec<String>, counts: &mut SinkCounts) {
    let tenures = tenures(e);
    let mut rows: BTreeMap<&ShardId, Vec<(u64, Tenure<'_>)>> = BTreeMap::new();
    for o in e.journal.sink_opens.iter().filter(|o| o.fenced) {
        let row = rows.entry(&o.shard).or_default();
        row.push((o.seq, (o.owner.as_str(), o.fence)));
    }
    let mut tally = Tally::new("sink-fenced");
    for c in &s.commits {
        let mine = (c.owner.as_str(), c.fence.0);
        let named = before(rows.get(&c.shard), c.seq);
        if named != Some(mine) {
            tally.push(format!(
                "{}'s commit on {} (fence {}, {} to {}) applied while the sink's row named {named:?}",
                c.client, c.shard, c.fence.0, shown(c.before.as_ref()), c.checkpoint
            ));
        }
        let history = tenures.get(&c.shard);
        let held = history.is_some_and(|h| {
            h.iter()
                .take_while(|(seq, _)| *seq < c.seq)
                .any(|(_, t)| *t == Some(mine))
        });
        if !held {
            tally.push(format!(
                "{}'s commit on {} applied under fence {}, which never held the lease",
                c.client, c.shard, c.fence.0
            ));
        }
        match before(history, c.seq).flatten() {
            Some(t) if t == mine => {}
            Some((RESET_OWNER, _)) => counts.after_reset += 1,
            _ => counts.before_successor += 1,
        }
    }
    tally.report(v);
}

/// The open that handed processor `instance` its start: the last of its tenure's that
/// fenced the sink and was answered before its `initialize`.
pub(super) fn open_of<'a>(e: &Evidence<'a>, instance: u64) -> Option<&'a SinkOpen> {
    let opened = e.journal.instances.get(&instance)?.opened.as_ref()?;
    e.journal.sink_opens.iter().rfind(|o| {
        o.seq < opened.seq
            && o.shard == opened.shard
            && o.owner == opened.worker
            && o.fence == opened.fence
            && o.fenced
            && o.answered.is_some()
    })
}

/// sink-resume.
fn resume(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut tally = Tally::new("sink-resume");
    let mut by_instance: BTreeMap<u64, Vec<&ExtendedSequenceNumber>> = BTreeMap::new();
    for d in &e.journal.deliveries {
        by_instance.entry(d.instance).or_default().push(&d.position);
    }
    for (instance, i) in &e.journal.instances {
        let Some(opened) = &i.opened else {
            continue;
        };
        let Some(open) = open_of(e, *instance) else {
            tally.push(format!(
                "instance {instance} of {} started on {} (fence {}) without an open of the sink by its tenure",
                opened.worker, opened.shard, opened.fence
            ));
            continue;
        };
        let Some(Some(position)) = &open.answered else {
            continue;
        };
        let early = by_instance
            .get(instance)
            .into_iter()
            .flatten()
            .find(|p| covers(position, p));
        if let Some(early) = early {
            tally.push(format!(
                "instance {instance} of {} on {} (fence {}) was handed {early}, at or before the sink's position {position} when its tenure opened",
                opened.worker, opened.shard, opened.fence
            ));
        }
    }
    tally.report(v);
}

/// lease-trails-sink.
fn trails(e: &Evidence<'_>, s: &SinkEvidence, v: &mut Vec<String>) {
    let mut tally = Tally::new("lease-trails-sink");
    let mut last: BTreeMap<&ShardId, &Checkpoint> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key))
    {
        let key = &ev.lease.key;
        if ev.operation == "delete" {
            last.remove(key);
            continue;
        }
        let cp = &ev.lease.checkpoint;
        let moved = last.insert(key, cp) != Some(cp);
        let progress = matches!(cp, Checkpoint::Sequence(_) | Checkpoint::ShardEnd);
        if !moved || !progress || ev.client == RESET_OWNER {
            continue;
        }
        let sink = s.position_at(key, ev.seq);
        let within = sink.is_some_and(|at| cp.progress_cmp(at).is_some_and(|o| o.is_le()));
        if !within {
            tally.push(format!(
                "{}'s {} moved {key}'s checkpoint to {cp}, past the sink's position {}",
                ev.client,
                ev.operation,
                shown(sink)
            ));
        }
    }
    tally.report(v);
}

/// The counts of opens: behind, moved up, lower fences let in; and resets behind the sink.
fn opened(e: &Evidence<'_>, s: &SinkEvidence, counts: &mut SinkCounts) {
    let mut checkpoints: BTreeMap<&ShardId, Vec<(u64, &Checkpoint)>> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key))
    {
        let at = checkpoints.entry(&ev.lease.key).or_default();
        at.push((ev.seq, &ev.lease.checkpoint));
        if ev.client == RESET_OWNER
            && ev.operation == "checkpoint"
            && s.position_at(&ev.lease.key, ev.seq).is_some_and(|p| {
                ev.lease
                    .checkpoint
                    .progress_cmp(p)
                    .is_some_and(|o| o.is_lt())
            })
        {
            counts.resets_behind += 1;
        }
    }
    let mut named: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for (i, o) in e.journal.sink_opens.iter().enumerate() {
        if !o.fenced {
            continue;
        }
        if named.insert(&o.shard, o.fence).is_some_and(|f| f > o.fence) {
            counts.lower_fences += 1;
        }
        let Some(Some(position)) = &o.answered else {
            continue;
        };
        let lease = before(checkpoints.get(&o.shard), o.seq);
        if !lease.is_some_and(|l| position.progress_cmp(l).is_some_and(|c| c.is_gt())) {
            continue;
        }
        counts.behind += 1;
        let next = e.journal.sink_opens[i + 1..]
            .iter()
            .find(|n| n.shard == o.shard)
            .map_or(u64::MAX, |n| n.seq);
        let moved = e.store.iter().any(|ev| {
            ev.seq > o.seq
                && ev.seq < next
                && ev.operation == "checkpoint"
                && ev.client == o.owner
                && ev.lease.key == o.shard
                && ev.lease.fence.is_some_and(|f| f.0 == o.fence)
                && &ev.lease.checkpoint == position
        });
        counts.forwarded += usize::from(moved);
    }
}
