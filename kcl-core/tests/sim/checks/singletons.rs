//! The applications' singletons: fencing tokens and the periodic job.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Evidence;
use crate::sim::fleet::PERIOD;
use crate::sim::processor::SingletonRun;
use kcl_core::ShardId;
use tokio::time::Instant;

/// fencing-token: every run of the singleton task carried a larger fencing token than every
/// run that started before it.
pub(super) fn tokens(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut runs: Vec<_> = e.journal.singleton_runs.iter().collect();
    runs.sort_by_key(|r| r.start);
    for pair in runs.windows(2) {
        if pair[1].token <= pair[0].token {
            v.push(format!(
                "fencing-token: {} started with token {} after {} had {}",
                pair[1].worker, pair[1].token, pair[0].worker, pair[0].token
            ));
        }
    }
}

/// periodic: the periodic job never ran twice for one period; and once the faults stopped,
/// it ran within the failover time plus one period (and a poll), then every period.
pub(super) fn periodic(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut by_period: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for run in &e.journal.periodic_runs {
        by_period.entry(run.index).or_default().push(&run.worker);
    }
    for (index, workers) in by_period.iter().filter(|(_, w)| w.len() > 1) {
        v.push(format!(
            "periodic: period {index} ran {} times: {workers:?}",
            workers.len()
        ));
    }
    let (from, to) = e.quiet;
    let slack = Duration::from_secs(1);
    let mut last = from;
    let bound = |at| {
        if at == from {
            e.singleton_recovery + PERIOD + slack * 2
        } else {
            PERIOD + slack
        }
    };
    for run in e
        .journal
        .periodic_runs
        .iter()
        .filter(|r| r.at > from && r.at <= to)
    {
        if run.at - last > bound(last) {
            v.push(format!(
                "periodic: {:?} without a run after the faults stopped (until period {})",
                run.at - last,
                run.index
            ));
        }
        last = run.at;
    }
    if to > last && to - last > bound(last) {
        v.push(format!(
            "periodic: no run in the last {:?} before the fleet stopped",
            to - last
        ));
    }
}

/// sends: a message sent to the singleton was put in an inbox at most once; one `send`
/// reported delivered was put in exactly one, of the instance started last before then; one
/// reported failed without `maybe_delivered` in none.
pub(super) fn sends(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut taken: BTreeMap<&str, Vec<&crate::sim::processor::Acceptance>> = BTreeMap::new();
    for a in &e.journal.acceptances {
        taken.entry(&a.message).or_default().push(a);
    }
    for (message, by) in taken.iter().filter(|(_, by)| by.len() > 1) {
        v.push(format!("sends: {message} put in {} inboxes", by.len()));
    }
    for send in &e.journal.sends {
        let by = taken
            .get(send.message.as_str())
            .map_or(&[][..], Vec::as_slice);
        match send.failed {
            None if by.len() != 1 => v.push(format!(
                "sends: {} reported delivered but put in {} inboxes",
                send.message,
                by.len()
            )),
            None => {
                // The accepting worker's instance is the last one started before then (a
                // frozen or dying instance may still hold the row: its lease is what counts,
                // and the `singleton` check keeps instances apart).
                let a = by[0];
                let latest = e
                    .journal
                    .singleton_runs
                    .iter()
                    .filter(|r| r.start <= a.at)
                    .max_by_key(|r| r.start);
                if latest.is_none_or(|r| r.worker != a.worker) {
                    v.push(format!(
                        "sends: {} taken by {} at {:?}, but the instance started last before then was {:?}",
                        send.message,
                        a.worker,
                        a.at,
                        latest.map(|r| (&r.worker, r.start))
                    ));
                }
            }
            Some(false) if !by.is_empty() => v.push(format!(
                "sends: {} reported not delivered but put in an inbox",
                send.message
            )),
            Some(_) => {}
        }
    }
}

/// standby-takeover: when the singleton's holder crashed while a standby held the first
/// standby row, and neither that standby nor the store was disturbed from a failover time
/// before until the bound (nor had the standby crashed or left by then), the next run started within the restart bound plus a poll (the
/// standby may have moved up within the last poll), whatever else happened in the fleet.
pub(super) fn standby_takeovers(e: &Evidence<'_>, v: &mut Vec<String>) {
    let (Some(bound), Some(row)) = (e.restart_bound, e.standby_row.as_ref()) else {
        return;
    };
    let bound = bound + e.poll;
    let runs = &e.journal.singleton_runs;
    for (worker, at) in &e.journal.crashes {
        let held = held_at(runs, worker, *at);
        if !held || *at + bound > e.quiet.1 {
            continue;
        }
        let Some(standby) = standby_at(e, row, *at) else {
            continue;
        };
        let (from, until) = (at.checked_sub(e.failover).unwrap_or(*at), *at + bound);
        let overlaps = |a: &Instant, b: &Instant| *a <= until && from <= *b;
        let disturbed = e
            .journal
            .worker_disturbed
            .iter()
            .any(|(w, a, b)| w == standby && overlaps(a, b))
            || e.journal.store_faulted.iter().any(|(a, b)| overlaps(a, b))
            // A standby that crashed or left before then is no standby, even if a write it
            // sent before landed later (the store's latency).
            || e.journal
                .crashes
                .iter()
                .chain(&e.journal.leaves)
                .any(|(w, when)| w == standby && *when <= until);
        if disturbed || standby == worker {
            continue;
        }
        let next = runs.iter().filter(|r| r.start > *at).map(|r| r.start).min();
        if next.is_none_or(|n| n > *at + bound) {
            v.push(format!(
                "standby-takeover: {worker} crashed holding it while {standby} held the standby row; the next instance started {:?} later (bound {bound:?})",
                next.map(|n| n - *at)
            ));
        }
    }
}

/// Whether `worker`'s run was the last to start by `at`: it held the singleton then.
fn held_at(runs: &[SingletonRun], worker: &str, at: Instant) -> bool {
    runs.iter()
        .filter(|r| r.start <= at)
        .max_by_key(|r| r.start)
        .is_some_and(|r| r.worker == worker)
}

/// Who held `row` at `at`: its last write before then, if it named an owner and was recent
/// enough (within the lease's validity) for the row to be held.
fn standby_at<'a>(e: &'a Evidence<'_>, row: &ShardId, at: Instant) -> Option<&'a str> {
    let last = e
        .store
        .iter()
        .filter(|ev| &ev.lease.key == row && ev.at <= at)
        .max_by_key(|ev| ev.seq)?;
    if last.operation == "delete" || last.operation == "release" || at - last.at > e.validity {
        return None;
    }
    last.lease.owner.as_ref().map(|o| o.as_str())
}

/// singleton-restart: when the singleton's holder crashed and nothing else was disturbed for
/// the failover time plus a poll (no freeze, store faults or partition), another instance
/// started within that long. With standbys, only if no other worker crashed, left or was
/// disturbed from `line_settle` before until then (the line was whole: its slow candidates
/// may need longer while it is not). Judged in the seeds without health mode (whose penalties keep
/// candidates away on purpose).
pub(super) fn restarts(e: &Evidence<'_>, v: &mut Vec<String>) {
    let Some(bound) = e.restart_bound else {
        return;
    };
    let runs = &e.journal.singleton_runs;
    for (worker, at) in &e.journal.crashes {
        let held = held_at(runs, worker, *at);
        let since = at.checked_sub(e.line_settle).unwrap_or(*at);
        let calm = !e
            .journal
            .disturbed
            .iter()
            .any(|(from, until)| *from <= *at + bound && since <= *until);
        let line_whole = !e
            .journal
            .crashes
            .iter()
            .chain(&e.journal.leaves)
            .any(|(other, when)| other != worker && since <= *when && *when <= *at + bound);
        if !line_whole {
            continue;
        }
        if !held || !calm || *at + bound > e.quiet.1 {
            continue;
        }
        let next = runs.iter().filter(|r| r.start > *at).map(|r| r.start).min();
        if next.is_none_or(|n| n > *at + bound) {
            v.push(format!(
                "singleton-restart: {worker} crashed holding it; the next instance started {:?} later (bound {bound:?})",
                next.map(|n| n - *at)
            ));
        }
    }
}
