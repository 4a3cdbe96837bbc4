//! Invariants about leases: checkpoints, fencing in counter and in time, exclusive
//! ownership at every delivery and every completed batch, lineage, and the singleton.

use std::collections::BTreeMap;

use kcl_core::admin::RESET_OWNER;
use kcl_core::memory::StoreEvent;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, Record, ShardId};

use super::Evidence;

/// The client of the operator's hand on rows (`sim/operator.rs`, `sim/positions.rs`).
const OPERATOR: &str = "operator";

/// checkpoints: never move backwards, never pass a record the writer had not delivered, and
/// a position past the last delivered record (mid-aggregate too) is refused.
/// (A singleton's row is not a shard's: the periodic job records its periods there, which
/// the `periodic` check judges.)
///
/// With a sink that keeps positions (`sim/positions.rs`): a checkpoint moved up to the
/// sink's position when a shard opened is the sink's, not the writer's, to have delivered;
/// and a row the operator deleted starts over when the shard sync makes it again.
pub(super) fn checkpoints(e: &Evidence<'_>, v: &mut Vec<String>) {
    v.extend(e.journal.accepted_beyond.iter().cloned());
    let mut current: BTreeMap<&ShardId, &Checkpoint> = BTreeMap::new();
    let shard_events = e
        .store
        .iter()
        .filter(|ev| !is_coordination_key(&ev.lease.key));
    for ev in shard_events {
        if ev.operation == "delete" && ev.client == OPERATOR {
            current.remove(&ev.lease.key);
        }
        if ev.operation != "checkpoint" {
            continue;
        }
        let cp = &ev.lease.checkpoint;
        let prev = current.insert(&ev.lease.key, cp);
        if ev.client == RESET_OWNER {
            continue; // an operator's reset: the new baseline (see `reset`)
        }
        if let Some(prev) = prev
            && prev.progress_cmp(cp).is_none_or(|o| o.is_gt())
        {
            v.push(format!(
                "checkpoints: {} moved back from {prev} to {cp}",
                ev.lease.key
            ));
        }
        // A prepared checkpoint or a pin rewrites the committed one unchanged: only changes
        // count.
        if prev == Some(cp) {
            continue;
        }
        if let Checkpoint::Sequence(s) = cp {
            // Or, under a failure policy, dead-lettered by the writer, the sink accepting it.
            let delivered = e.journal.deliveries.iter().any(|d| {
                d.seq < ev.seq
                    && d.worker == ev.client
                    && d.shard == ev.lease.key
                    && d.position == *s
            }) || e.journal.letters.iter().any(|(seq, l)| {
                *seq < ev.seq
                    && l.worker.as_str() == ev.client
                    && l.shard == ev.lease.key
                    && l.record.position() == *s
            });
            // Or skipped by the writer as finished before (sparse acknowledgements): an
            // earlier row said so, and someone had delivered it or dead-lettered it.
            let finished_before = || {
                let said = e.store.iter().any(|earlier| {
                    earlier.seq < ev.seq
                        && earlier.lease.key == ev.lease.key
                        && earlier.lease.acked.as_ref().is_some_and(|value| {
                            kcl_core::ack::SparseAcks::decode(value, &earlier.lease.checkpoint)
                                .is_ok_and(|acks| acks.contains(s))
                        })
                });
                let done = e
                    .journal
                    .deliveries
                    .iter()
                    .any(|d| d.seq < ev.seq && d.shard == ev.lease.key && d.position == *s)
                    || e.journal.letters.iter().any(|(seq, l)| {
                        *seq < ev.seq && l.shard == ev.lease.key && l.record.position() == *s
                    });
                said && done
            };
            let the_sinks = || {
                e.sink
                    .is_some_and(|sink| sink.position_at(&ev.lease.key, ev.seq) == Some(cp))
            };
            if !delivered && !finished_before() && !the_sinks() {
                v.push(format!(
                    "checkpoints: {} by {} at {s} before delivering it",
                    ev.lease.key, ev.client
                ));
            }
        }
    }
}

/// The owner of each lease right after each store event, by event order.
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

/// The owner of `shard` just before event `seq`.
fn owner_at<'a>(
    owners: &BTreeMap<&ShardId, Vec<(u64, Option<&'a str>)>>,
    shard: &ShardId,
    seq: u64,
) -> Option<&'a str> {
    owners
        .get(shard)?
        .iter()
        .take_while(|(s, _)| *s < seq)
        .last()
        .and_then(|(_, o)| *o)
}

/// fencing: a holder's write (renew, checkpoint, release) applies only while the row names
/// it as owner — even one that reaches the table long after its writer gave up on it (a
/// heartbeat row released by another worker is a fence, checked by `expiry`). A
/// checkpoint succeeds only for the processor instance of the writer's current tenure: never
/// once another worker took the lease, nor for an instance created before the writer last
/// (re)acquired it.
pub(super) fn fencing(e: &Evidence<'_>, v: &mut Vec<String>) {
    let owners = owners(e.store);
    for ev in e
        .store
        .iter()
        .filter(|ev| matches!(ev.operation, "renew" | "checkpoint" | "release"))
        .filter(|ev| !(ev.operation == "release" && is_heartbeat(&ev.lease.key)))
    {
        let owner = owner_at(&owners, &ev.lease.key, ev.seq);
        if owner != Some(ev.client.as_str()) {
            v.push(format!(
                "fencing: {}'s {} of {} applied while the table named {owner:?}",
                ev.client, ev.operation, ev.lease.key
            ));
        }
    }
    // A checkpoint at the position the tenure last wrote is a no-op that writes nothing: it
    // may succeed after the lease was taken (an operator's reset) before the tenure learns
    // of it, and fences nothing. Only attempts that wrote are judged.
    let wrote = |a: &&crate::sim::processor::Attempt| {
        e.store.iter().any(|ev| {
            ev.operation == "checkpoint"
                && ev.client == a.worker
                && ev.lease.key == a.shard
                && (a.start_seq..a.end_seq).contains(&ev.seq)
        })
    };
    for a in e.journal.attempts.iter().filter(|a| a.ok).filter(wrote) {
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
}

/// The key of `worker`'s heartbeat row.
fn heartbeat_key(worker: &str) -> ShardId {
    ShardId::new(format!("kcl-coordination/worker/{worker}"))
}

fn is_heartbeat(key: &ShardId) -> bool {
    key.as_str().starts_with("kcl-coordination/worker/")
}

/// expiry: a lease another worker owns is taken (not handed over) only once its counter has
/// stood still for the failover time — plus the grace the owner wrote in it if it kept it for
/// its restart (`restart_grace`): the taker cannot have observed it for longer. That
/// holds for a leader writing the lease to a third worker too. Under heartbeats, the owner's
/// heartbeat row that was live when it took the lease must have been fenced since (released
/// or deleted by another worker, which is itself allowed only once the row's counter stood
/// still for the failover time).
pub(super) fn expiry(e: &Evidence<'_>, v: &mut Vec<String>) {
    // Per lease: the owner and counter after the last event, when the counter last moved,
    // the event that made the owner the owner, and the grace the row asks for.
    let mut last: BTreeMap<ShardId, Last<'_>> = BTreeMap::new();
    // Per heartbeat row: the events that ended a tenure of it (a release or a delete).
    let mut fenced: BTreeMap<&ShardId, Vec<u64>> = BTreeMap::new();
    for ev in e.store {
        let key = &ev.lease.key;
        let owner = ev.lease.owner.as_ref().map(|o| o.as_str());
        if let Some((before, _, moved, _, grace)) = last.get(key)
            && ev.client != RESET_OWNER
            && (ev.operation == "take" && owner != *before
                || matches!(ev.operation, "delete" | "release") && is_heartbeat(key))
            && before.is_some_and(|b| b != ev.client)
            && ev.started.saturating_duration_since(*moved) < e.failover + grace.unwrap_or_default()
        {
            v.push(format!(
                "expiry: {} {} {key} of {before:?} {:?} after its counter last moved",
                ev.client,
                ev.operation,
                ev.started.saturating_duration_since(*moved)
            ));
        }
        if let Some((Some(before), _, _, since, _)) = last.get(key)
            && ev.client != RESET_OWNER
            && !key.as_str().starts_with("kcl-coordination/")
            && ev.operation == "take"
            && owner != Some(*before)
            && *before != ev.client
        {
            // The owner's heartbeat row as it was when the owner took the lease.
            let heartbeat = heartbeat_key(before);
            let live_then = last_before(e.store, &heartbeat, *since).is_some_and(|hb| {
                hb.operation != "delete"
                    && hb
                        .lease
                        .owner
                        .as_ref()
                        .is_some_and(|o| o.as_str() == *before)
            });
            let ended = fenced
                .get(&heartbeat)
                .is_some_and(|f| f.iter().any(|seq| seq > since));
            if live_then && !ended {
                v.push(format!(
                    "expiry: {} took {key} from {before} while its heartbeat row stood",
                    ev.client
                ));
            }
        }
        if is_heartbeat(key) && matches!(ev.operation, "delete" | "release") {
            fenced.entry(key).or_default().push(ev.seq);
        }
        if ev.operation == "delete" {
            last.remove(key);
            continue;
        }
        let moved = match last.get(key) {
            Some((_, counter, moved, ..)) if *counter == ev.lease.counter => *moved,
            _ => ev.at,
        };
        let since = match last.get(key) {
            Some((before, _, _, since, _)) if *before == owner => *since,
            _ => ev.seq,
        };
        let grace = ev.lease.restart_grace;
        last.insert(key.clone(), (owner, ev.lease.counter, moved, since, grace));
    }
}

/// A lease as `expiry` last saw it: owner, counter, when the counter last moved, the event
/// that made the owner the owner, and the grace the row asks for (`restart_grace`).
type Last<'a> = (
    Option<&'a str>,
    u64,
    tokio::time::Instant,
    u64,
    Option<std::time::Duration>,
);
/// roles: a worker's role row (`Coordination::Leader`) carried by a row its holder renews is
/// taken from its holder, or released by another worker, only once the holder's last write of
/// that carrier (a renewal or checkpoint keeping it the holder's, after the role row last
/// named it) landed at least the failover time before the take was sent: no two workers
/// hold a role with their proof of life unbroken. (That the role row's own counter stood
/// still that long is `expiry`.)
pub(super) fn roles(e: &Evidence<'_>, v: &mut Vec<String>) {
    let is_role = |key: &ShardId| {
        matches!(
            key.as_str(),
            "kcl-coordination/worker-leader" | "kcl-coordination/worker-standby"
        )
    };
    let commits = commit_seqs(e);
    for ev in e.store.iter().filter(|ev| is_role(&ev.lease.key)) {
        let Some(before) = last_before(e.store, &ev.lease.key, ev.seq) else {
            continue;
        };
        let Some(holder) = before.lease.owner.as_ref().map(|o| o.as_str()) else {
            continue;
        };
        let owner = ev.lease.owner.as_ref().map(|o| o.as_str());
        let taken = ev.operation == "take" && owner != Some(holder);
        let released = ev.operation == "release";
        if !(taken || released) || ev.client == holder {
            continue;
        }
        let Some(carrier) = before
            .lease
            .carrier
            .as_ref()
            .filter(|c| **c != ev.lease.key)
        else {
            continue;
        };
        let proved = e
            .store
            .iter()
            .take_while(|c| c.seq < ev.seq)
            .filter(|c| !commits.contains(&c.seq))
            .filter(|c| &c.lease.key == carrier && c.seq > before.seq)
            .filter(|c| matches!(c.operation, "renew" | "checkpoint"))
            .filter(|c| {
                c.client == holder && c.lease.owner.as_ref().is_some_and(|o| o.as_str() == holder)
            })
            .last();
        if let Some(proof) = proved
            && ev.started.saturating_duration_since(proof.at) < e.failover
        {
            v.push(format!(
                "roles: {} {} {} from {holder} {:?} after {holder}'s {} of its carrier {carrier} landed",
                ev.client,
                ev.operation,
                ev.lease.key,
                ev.started.saturating_duration_since(proof.at),
                proof.operation
            ));
        }
    }
}

/// The events that are commits of outputs (journaled as checkpoints, the counter unchanged).
fn commit_seqs(e: &Evidence<'_>) -> std::collections::BTreeSet<u64> {
    e.commits.iter().map(|c| c.seq).collect()
}

/// The last event on `key` before event `seq`.
fn last_before<'a>(store: &'a [StoreEvent], key: &ShardId, seq: u64) -> Option<&'a StoreEvent> {
    store
        .iter()
        .take_while(|ev| ev.seq < seq)
        .filter(|ev| &ev.lease.key == key)
        .last()
}

/// validity: no delivery, and no end of a batch's work, later than 0.9 × the failover time
/// after the *start* of the worker's last write of that lease that reported success —
/// exactly the local rule the worker promises to keep, a host resuming from a suspend
/// included. Under heartbeats, of its last heartbeat renewal instead. (A commit of outputs
/// is no such write: it leaves the counter alone.)
pub(super) fn validity(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut writes: BTreeMap<(&str, ShardId), Vec<&StoreEvent>> = BTreeMap::new();
    // A commit of outputs leaves the counter alone: no taker saw it, and it proves nothing.
    let commits = commit_seqs(e);
    let proofs = e.store.iter().filter(|ev| !commits.contains(&ev.seq));
    for ev in proofs.filter(|ev| ev.reported) {
        if ev
            .lease
            .owner
            .as_ref()
            .is_some_and(|o| o.as_str() == ev.client)
        {
            writes
                .entry((ev.client.as_str(), ev.lease.key.clone()))
                .or_default()
                .push(ev);
        }
    }
    // Deliveries, and the ends of batches' work (after every `.await` of a hook).
    let deliveries = e.journal.deliveries.iter().map(|d| {
        let what = format!("delivered {}", d.position);
        (what, d.seq, d.at, &d.worker, &d.shard)
    });
    let effects = e.journal.effects.iter().map(|f| {
        let what = "finished a batch's work".to_owned();
        (what, f.seq, f.at, &f.worker, &f.shard)
    });
    for (what, seq, at, worker, shard) in deliveries.chain(effects) {
        let last_of = |key: ShardId| {
            writes
                .get(&(worker.as_str(), key))
                .and_then(|w| w.iter().rfind(|ev| ev.seq < seq))
        };
        let lease = last_of(shard.clone());
        let last = match last_of(heartbeat_key(worker)) {
            Some(heartbeat) if lease.is_some() => Some(heartbeat),
            _ => lease,
        };
        match last {
            Some(w) if at < w.started + e.validity => {}
            Some(w) => v.push(format!(
                "validity: {worker} {what} of {shard} {:?} after the start of its last successful write",
                at.saturating_duration_since(w.started)
            )),
            None => v.push(format!(
                "validity: {worker} {what} of {shard} without ever writing its lease"
            )),
        }
    }
}

/// exclusive: records reach one worker at a time. At every delivery and at the end of every
/// batch's work, the lease table names the worker doing it as the lease's owner (while an
/// operator's reset holds a lease, the worker it was taken from: it may deliver until its
/// validity runs out, and nobody else may meanwhile).
pub(super) fn exclusive(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut owners = owners(e.store);
    for history in owners.values_mut() {
        let mut before = None;
        for (_, owner) in history.iter_mut() {
            if *owner == Some(RESET_OWNER) {
                *owner = before;
            }
            before = *owner;
        }
    }
    let deliveries = e
        .journal
        .deliveries
        .iter()
        .map(|d| ("delivered to", d.seq, &d.worker, &d.shard));
    let effects = e
        .journal
        .effects
        .iter()
        .map(|f| ("finished a batch on", f.seq, &f.worker, &f.shard));
    for (what, seq, worker, shard) in deliveries.chain(effects) {
        let owner = owner_at(&owners, shard, seq);
        if owner != Some(worker.as_str()) {
            v.push(format!(
                "exclusive: {worker} {what} {shard} while the table named {owner:?}"
            ));
        }
    }
}

/// lineage: no record of a child is delivered before every parent that had a lease reached
/// `SHARD_END` (a parent that never had one was never owed: it predates the start), nor
/// any record of a parent after a record of its child (an operator's reset cannot move a
/// finished parent back behind its children).
pub(super) fn lineage(e: &Evidence<'_>, v: &mut Vec<String>) {
    let leased = e.leased();
    let mut ended: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for ev in e
        .store
        .iter()
        .filter(|ev| ev.operation == "checkpoint" && ev.lease.checkpoint == Checkpoint::ShardEnd)
    {
        ended.entry(&ev.lease.key).or_insert(ev.seq);
    }
    let mut first: BTreeMap<&ShardId, u64> = BTreeMap::new();
    let mut last: BTreeMap<&ShardId, u64> = BTreeMap::new();
    for d in &e.journal.deliveries {
        first.entry(&d.shard).or_insert(d.seq);
        last.insert(&d.shard, d.seq);
    }
    for shard in e.shards {
        let Some(start) = first.get(&shard.id) else {
            continue;
        };
        for parent in shard.parent_shard_ids.iter().filter(|p| leased.contains(p)) {
            match ended.get(parent) {
                Some(end) if end < start => {}
                _ => v.push(format!(
                    "lineage: {} delivered before its parent {parent} ended",
                    shard.id
                )),
            }
            if last.get(parent).is_some_and(|end| end > start) {
                v.push(format!(
                    "lineage: {parent} delivered again after its child {} started",
                    shard.id
                ));
            }
        }
    }
}

/// singleton: the fleet's singleton task never executed on two workers at one instant: no
/// run started before another worker's run last executed and ended after it started.
pub(super) fn singleton(e: &Evidence<'_>, v: &mut Vec<String>) {
    let runs = &e.journal.singleton_runs;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.worker != b.worker && a.start < b.last && b.start < a.last {
                v.push(format!(
                    "singleton: {} and {} ran it at once ({a:?}, {b:?})",
                    a.worker, b.worker
                ));
            }
        }
    }
}

/// reset: after an operator's reset of a shard's checkpoint (`kcl_core::admin::reset`), no
/// processor of a tenure from before it delivers anything more once a failover time has
/// passed, and the first processor of a tenure begun after it starts right after the new
/// checkpoint.
/// (That no checkpoint from before it overwrites it is `fencing`: the reset changed the
/// owner.)
pub(super) fn reset(e: &Evidence<'_>, v: &mut Vec<String>) {
    let resets = e
        .store
        .iter()
        .filter(|ev| ev.client == RESET_OWNER && ev.operation == "checkpoint");
    for r in resets {
        let key = &r.lease.key;
        let on_shard = e.journal.deliveries.iter().filter(|d| &d.shard == key);
        let created = |instance: u64| e.journal.instances.get(&instance).map(|i| i.created_seq);
        // New: processors of a tenure that began after the reset (a lease taken since). A
        // processor restarted inside the old tenure after the reset still reads from that
        // tenure's view: old, and fenced.
        let retaken = e
            .store
            .iter()
            .find(|ev| {
                ev.seq > r.seq
                    && &ev.lease.key == key
                    && ev.operation == "take"
                    && ev.client != RESET_OWNER
            })
            .map_or(u64::MAX, |ev| ev.seq);
        let (old, new): (Vec<_>, Vec<_>) = on_shard
            .filter(|d| d.seq > r.seq)
            .partition(|d| created(d.instance).is_some_and(|c| c < retaken));
        if let Some(late) = old.iter().find(|d| d.at > r.at + e.failover) {
            v.push(format!(
                "reset: {} delivered {} of {key} {:?} after its reset",
                late.worker,
                late.position,
                late.at - r.at
            ));
        }
        let next_reset = e
            .store
            .iter()
            .find(|ev| ev.seq > r.seq && ev.client == RESET_OWNER && &ev.lease.key == key)
            .map_or(u64::MAX, |ev| ev.seq);
        let (Checkpoint::Sequence(at), Some(first), Some(records)) =
            (&r.lease.checkpoint, new.first(), e.records.get(key))
        else {
            continue;
        };
        // With a sink that keeps positions, after the later of the reset and the position
        // the sink handed the new tenure (`sink-resume`).
        let sink = e
            .sink
            .and_then(|_| super::positions::open_of(e, first.instance))
            .and_then(|o| o.answered.clone().flatten());
        let floor = match &sink {
            Some(Checkpoint::Sequence(s)) if s > at => s,
            Some(Checkpoint::ShardEnd) => continue,
            _ => at,
        };
        let after = records.iter().map(Record::position).find(|p| p > floor);
        // Under `Parallel` records finish out of order: the instance's first run counts.
        let first_sequence = if first.keyed {
            let runs = e
                .journal
                .runs
                .iter()
                .filter(|run| run.instance == first.instance);
            match runs.min_by_key(|run| run.start_seq) {
                Some(run) => &run.position,
                None => continue,
            }
        } else {
            &first.position
        };
        // Under a failure policy a record given up on is never processed: its dead letter
        // counts.
        let given_up = e
            .journal
            .letters
            .iter()
            .filter(|(seq, l)| &l.shard == key && *seq > r.seq && *seq < next_reset)
            .map(|(_, l)| l.record.position())
            .min();
        let first_sequence = match &given_up {
            Some(p) if p < first_sequence => p,
            _ => first_sequence,
        };
        if first.seq < next_reset
            && let Some(after) = after
            && &after != first_sequence
        {
            v.push(format!(
                "reset: {key} reset to {at}, then first delivered {first_sequence} instead of {after}",
            ));
        }
    }
}
