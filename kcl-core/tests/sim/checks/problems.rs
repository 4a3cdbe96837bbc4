//! Invariants of the problems workers report (`Status::problems`, sampled in
//! `sim/problems.rs` as they change): a stalled shard is reported, a shard whose checkpoint
//! moves is not, and a fleet short of room for its leases says so.
//!
//! The judged facts come from the store's journal (who held a lease when; when its
//! checkpoint moved: a `checkpoint` write that changed it, by any client, an operator's reset
//! included) and the application's (when each record was handed to which worker, and when
//! each fault was on).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kcl_core::memory::StoreEvent;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, ExtendedSequenceNumber, ProblemKind};
use tokio::time::Instant;

use super::Evidence;
use crate::sim::problems::{Report, UNOWNED_CLEARS};

/// How long a worker may take to tell, past `stalled_after`: its shard task sees the
/// checkpoint move at its next refresh (every taker interval), and the coordinator publishes
/// the stall age at the end of its next cycle (every taker interval, plus the cycle's own
/// calls). Seen at most 0.47 s over 200 seeds.
fn report_slack(e: &Evidence<'_>) -> Duration {
    e.poll * 2 + Duration::from_millis(250)
}

/// A checkpoint move this recent is not known to the worker yet (its shard task looks every
/// taker interval, and not while a hook runs): a report may appear this soon after one.
fn move_slack(e: &Evidence<'_>) -> Duration {
    e.poll * 2
}

/// A stall report still standing this long after the checkpoint moved is false: the shard
/// task sees the move within a taker interval (or the lease lost at its next renewal, within
/// a third of the failover time), and the next cycle publishes.
fn gone_within(e: &Evidence<'_>) -> Duration {
    e.poll * 2 + e.failover / 3 + Duration::from_millis(100)
}

/// Every non-coordination lease's writes, in the order applied.
fn writes<'a>(e: &'a Evidence<'_>) -> BTreeMap<&'a str, Vec<&'a StoreEvent>> {
    let mut by_key: BTreeMap<&str, Vec<&StoreEvent>> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key))
    {
        by_key.entry(ev.lease.key.as_str()).or_default().push(ev);
    }
    by_key
}

/// When a lease's checkpoint moved: its writes that changed it (a create sets the first).
fn moves<'a>(writes: &[&'a StoreEvent]) -> Vec<&'a StoreEvent> {
    let mut last: Option<&Checkpoint> = None;
    let mut moved = Vec::new();
    for ev in writes {
        if ev.operation == "delete" {
            last = None;
            continue;
        }
        if last.is_some_and(|c| *c != ev.lease.checkpoint) {
            moved.push(*ev);
        }
        last = Some(&ev.lease.checkpoint);
    }
    moved
}

/// The checkpoint as of `t` (the last write applied at or before it).
fn checkpoint_at<'a>(writes: &[&'a StoreEvent], t: Instant) -> Option<&'a Checkpoint> {
    let before = writes.iter().take_while(|ev| ev.at <= t);
    before.last().map(|ev| &ev.lease.checkpoint)
}

/// The checkpoint as of `t` as its writers could know it: the last write applied at or
/// before `t` whose answer was not lost (a renewal's answer shows a checkpoint written
/// before it).
fn known_checkpoint_at<'a>(writes: &[&'a StoreEvent], t: Instant) -> Option<&'a Checkpoint> {
    let before = writes.iter().take_while(|ev| ev.at <= t);
    before
        .filter(|ev| ev.reported)
        .last()
        .map(|ev| &ev.lease.checkpoint)
}

fn covers(checkpoint: Option<&Checkpoint>, p: &ExtendedSequenceNumber) -> bool {
    match checkpoint {
        Some(Checkpoint::Sequence(c)) => c >= p,
        Some(Checkpoint::ShardEnd) => true,
        _ => false,
    }
}

/// A worker's holding of a lease in the store: from the write that named it owner (a take
/// names it again: a new tenure) until the next write naming someone else or nobody, or the
/// row's deletion (`None`: to the end).
struct Tenure<'a> {
    worker: &'a str,
    from: Instant,
    until: Option<Instant>,
}

fn tenures<'a>(writes: &[&'a StoreEvent]) -> Vec<Tenure<'a>> {
    let mut all: Vec<Tenure<'a>> = Vec::new();
    let mut open: Option<usize> = None;
    for ev in writes {
        let owner = (ev.operation != "delete")
            .then(|| ev.lease.owner.as_ref().map(kcl_core::WorkerId::as_str))
            .flatten();
        let current = open.map(|i| all[i].worker);
        if current.is_some_and(|c| Some(c) != owner || ev.operation == "take")
            && let Some(i) = open.take()
        {
            all[i].until = Some(ev.at);
        }
        if open.is_none()
            && let Some(owner) = owner
        {
            all.push(Tenure {
                worker: owner,
                from: ev.at,
                until: None,
            });
            open = Some(all.len() - 1);
        }
    }
    all
}

/// Whether `worker`, or the store everyone calls, was disturbed (frozen, partitioned, its
/// host suspended; store faults) at some point in `[a, b]`.
fn disturbed(e: &Evidence<'_>, worker: &str, a: Instant, b: Instant) -> bool {
    let overlaps = |x: &Instant, y: &Instant| *x <= b && *y >= a;
    e.journal
        .worker_disturbed
        .iter()
        .any(|(w, x, y)| w == worker && overlaps(x, y))
        || e.journal.store_faulted.iter().any(|(x, y)| overlaps(x, y))
}

/// Whether `worker` was running (taking leases, publishing its problems) all through
/// `[a, b]`.
fn running(e: &Evidence<'_>, worker: &str, a: Instant, b: Instant) -> bool {
    let lives = e.journal.problems.running.iter();
    lives
        .filter(|r| r.worker == worker)
        .any(|r| r.from <= a && r.until.is_none_or(|u| u > b))
}

fn stalled<'a>(e: &'a Evidence<'_>) -> impl Iterator<Item = &'a Report> {
    let reports = e.journal.problems.reports.iter();
    reports.filter(|r| r.kind == ProblemKind::Stalled)
}

/// A stretch over which a worker's records waited on a checkpoint that stood still, long
/// enough that the worker must report the shard stalled (see [`stall_reported`]).
pub struct Stall<'a> {
    key: &'a str,
    worker: &'a str,
    checkpoint: Option<&'a Checkpoint>,
    /// The stretch (the checkpoint's last move, or the tenure's start, until the next move
    /// or the tenure's end).
    from: Instant,
    until: Option<Instant>,
    /// From when records waited, and by when the worker must have told.
    waiting: Instant,
    due: Instant,
}

/// Every stretch `stall-reported` judges.
pub fn stalls<'a>(e: &'a Evidence<'_>) -> Vec<Stall<'a>> {
    let mut all = Vec::new();
    for (key, writes) in writes(e) {
        let moved = moves(&writes);
        for tenure in tenures(&writes) {
            let handed: Vec<_> = e
                .journal
                .deliveries
                .iter()
                .filter(|d| d.worker == tenure.worker && d.shard.as_str() == key)
                .filter(|d| d.at >= tenure.from && tenure.until.is_none_or(|u| d.at < u))
                .collect();
            if handed.is_empty() {
                continue;
            }
            // The stretches of the tenure over which the checkpoint stood still.
            let mut starts = vec![tenure.from];
            let inside = |t: &Instant| *t > tenure.from && tenure.until.is_none_or(|u| *t < u);
            starts.extend(moved.iter().map(|m| m.at).filter(inside));
            for (i, &from) in starts.iter().enumerate() {
                let until = starts.get(i + 1).copied().or(tenure.until);
                let checkpoint = checkpoint_at(&writes, from);
                let waiting = handed
                    .iter()
                    .filter(|d| until.is_none_or(|u| d.at < u))
                    .filter(|d| !covers(checkpoint, &d.position))
                    .map(|d| d.at.max(from))
                    .min();
                let Some(waiting) = waiting else { continue };
                let due = waiting + e.stalled_after + report_slack(e);
                if until.is_none_or(|u| due >= u)
                    || !running(e, tenure.worker, waiting, due)
                    || disturbed(e, tenure.worker, waiting, due)
                {
                    continue;
                }
                all.push(Stall {
                    key,
                    worker: tenure.worker,
                    checkpoint,
                    from,
                    until,
                    waiting,
                    due,
                });
            }
        }
    }
    all
}

/// stall-reported: a shard whose records wait on a checkpoint that stands still is reported
/// stalled by its holder. Judged for each tenure of a worker on a lease (see [`Tenure`]) and
/// each stretch of it over which the stored checkpoint did not move: let `a` be the first
/// instant of the stretch at which a record handed to that worker in that tenure (as the
/// application journaled it: at the hook, or under `Parallel` once its handler finished,
/// later than the worker handed it over) is not covered by the checkpoint. If the stretch
/// lasts past `a + stalled_after + slack` (the slack: two taker intervals and a little, see
/// [`report_slack`]), and the worker was running and undisturbed (no freeze, partition or
/// suspend of it, no store faults) from `a` to then, the worker reports the shard stalled at
/// some instant from `a + stalled_after` to `a + stalled_after + slack`.
pub(super) fn stall_reported(e: &Evidence<'_>, v: &mut Vec<String>) {
    for s in stalls(e) {
        let told = stalled(e).any(|r| {
            r.worker == s.worker
                && r.key == s.key
                && r.from <= s.due
                && r.until.is_none_or(|u| u > s.waiting + e.stalled_after)
        });
        if !told {
            v.push(format!(
                "stall-reported: {}'s checkpoint stood at {} from {:?} to {:?} while records handed to {} waited from {:?}, and {} did not report it stalled by {:?} (stalled_after {:?})",
                s.key,
                s.checkpoint
                    .map_or_else(|| "nothing".to_owned(), ToString::to_string),
                s.from - e.start.instant,
                s.until.map(|u| u - e.start.instant),
                s.worker,
                s.waiting - e.start.instant,
                s.worker,
                s.due - e.start.instant,
                e.stalled_after,
            ));
            return;
        }
    }
}

/// no-false-stall: a shard reported stalled had a checkpoint that stood still, and records
/// waiting on it. For each report of a shard stalled by a worker, standing from `from` until
/// `until`:
/// - no write moved the shard's checkpoint from `from - stalled_after + slack` (a move that
///   recent may not be known to the worker yet, see [`move_slack`]) until `until - lag` (the
///   report goes within `lag` of a move, see [`gone_within`]) — unless the worker was frozen,
///   partitioned or suspended, or the store faulted, from the write's call until `lag` after
///   it was applied (its answer may have been lost: the worker cannot know it moved);
/// - in seeds without `Parallel` nor a failure policy (where the journal dates a record's
///   hand-over), a record
///   handed to the worker since it last became the lease's owner, at or before
///   `from - stalled_after + slack`, was not covered by the checkpoint `slack` before `from`
///   (as far as its writers could know it: a write whose answer was lost is not counted
///   until a later write's answer shows it).
pub(super) fn no_false_stall(e: &Evidence<'_>, v: &mut Vec<String>) {
    let (stall, slack, lag) = (e.stalled_after, move_slack(e), gone_within(e));
    let writes = writes(e);
    for report in stalled(e) {
        let Some(writes) = writes.get(report.key.as_str()) else {
            continue;
        };
        let since = report.from.checked_sub(stall - slack);

        let false_move = moves(writes).into_iter().find(|m| {
            since.is_none_or(|s| m.at > s)
                && report.until.is_none_or(|u| m.at + lag <= u)
                && !disturbed(e, &report.worker, m.started, m.at + lag)
        });
        if let Some(m) = false_move {
            v.push(format!(
                "no-false-stall: {} reported {} stalled from {:?} to {:?}, but {} moved its checkpoint to {} at {:?} (stalled_after {stall:?})",
                report.worker,
                report.key,
                report.from - e.start.instant,
                report.until.map(|u| u - e.start.instant),
                m.client,
                m.lease.checkpoint,
                m.at - e.start.instant,
            ));
            return;
        }
        // Under a failure policy the journal dates what was processed, not what was handed.
        if e.parallel || e.poison.is_some() {
            continue;
        }
        let owner_since = writes
            .iter()
            .take_while(|ev| ev.at <= report.from)
            .fold((None, None), |(since, owner), ev| {
                let now = ev.lease.owner.as_ref().map(kcl_core::WorkerId::as_str);
                let since = if now == Some(report.worker.as_str()) && owner != now {
                    Some(ev.at)
                } else {
                    since
                };
                (since, now)
            })
            .0;
        let Some(owner_since) = owner_since else {
            continue;
        };
        let checkpoint = known_checkpoint_at(
            writes,
            report.from.checked_sub(slack).unwrap_or(report.from),
        );
        let waited = e.journal.deliveries.iter().any(|d| {
            d.worker == report.worker
                && d.shard.as_str() == report.key
                && d.at >= owner_since
                && d.at + stall <= report.from + slack
                && !covers(checkpoint, &d.position)
        });
        if !waited {
            v.push(format!(
                "no-false-stall: {} reported {} stalled from {:?}, but no record it was handed since {:?} waited on the checkpoint {} for {stall:?} (stalled_after)",
                report.worker,
                report.key,
                report.from - e.start.instant,
                owner_since - e.start.instant,
                checkpoint.map_or_else(|| "nothing".to_owned(), ToString::to_string),
            ));
            return;
        }
    }
}

/// unowned: a fleet short of room for its leases says which it has no room for, and says
/// nothing of the kind otherwise.
/// - Uncapped seeds (`max_leases` unlimited): no worker ever reports a lease unowned.
/// - Capped seeds: once the faults stopped and nothing changes the fleet (no joins, leaves,
///   reshards), it is looked at every taker interval (`sim/problems.rs`) until it reports
///   what it has no room for, or for 40 s. At the last look, if ready leases outnumber the
///   room (live workers × `max_leases`) by `n`, at least `n` of the leases the live workers
///   report unowned are ready and held by no live worker.
/// - Workers are then added until every lease fits; no report of a lease unowned stands
///   [`UNOWNED_CLEARS`] (15 s, five failover times) later: the leader, or the new workers
///   looking for work, place every lease by then (seen within 7.3 s over 200 seeds), plus
///   the restart grace where workers keep leases through restarts (a kept lease is its
///   owner's for that much longer).
pub(super) fn unowned(e: &Evidence<'_>, v: &mut Vec<String>) {
    let unowned = || {
        let reports = e.journal.problems.reports.iter();
        reports.filter(|r| r.kind == ProblemKind::Unowned)
    };
    let Some(cap) = e.max_leases else {
        if let Some(r) = unowned().next() {
            v.push(format!(
                "unowned: {} reported {} unowned at {:?}, with max_leases unlimited",
                r.worker,
                r.key,
                r.from - e.start.instant
            ));
        }
        return;
    };
    let sampled = &e.journal.problems;
    if let Some(last) = sampled.rooms.last() {
        let short = last.ready.len().saturating_sub(last.workers * cap);
        let reported: BTreeSet<&str> = unowned()
            .filter(|r| r.from <= last.at && r.until.is_none_or(|u| u > last.at))
            .map(|r| r.key.as_str())
            .collect();
        let true_ones = reported
            .iter()
            .filter(|k| last.ready.contains(**k) && !last.held.contains_key(**k))
            .count();
        if true_ones < short {
            v.push(format!(
                "unowned: {} ready leases, {} workers × max_leases {cap}: {short} without room, but {true_ones} of them reported unowned at {:?} (reported {reported:?}, held {:?})",
                last.ready.len(),
                last.workers,
                last.at - e.start.instant,
                last.held,
            ));
        }
    }
    let Some(room) = sampled.room_from else {
        return;
    };
    // A lease kept for its owner's restart is reserved for the failover time and the grace
    // past its owner's last write, whoever has room: a worker that left for good frees it
    // only then (seed 200 of 1,000: the kept lease taken, and its report gone, 17.5 s after
    // there was room, within the 8 s grace and the bound).
    let bound = UNOWNED_CLEARS + e.restart_grace.unwrap_or_default();
    let late = unowned().find(|r| r.until.is_none_or(|u| u > room + bound));
    if let Some(r) = late {
        v.push(format!(
            "unowned: {} reported {} unowned from {:?} to {:?}, with room for every lease since {:?}",
            r.worker,
            r.key,
            r.from - e.start.instant,
            r.until.map(|u| u - e.start.instant),
            room - e.start.instant
        ));
    }
}
