//! Invariants of fleets under a failure policy: nothing is given up before its tries are
//! spent, and a parked key runs none of its later records. (That every record is processed
//! or dead-lettered, once the sink accepted it, is `no-loss`; that a bisect delivers no record
//! beyond its bound, nor one that succeeded, the processors log as `bisect-bound`.)

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kcl_core::failure::Reason;
use kcl_core::{ExtendedSequenceNumber, ShardId};

use super::Evidence;
use crate::sim::poison::{ATTEMPTS, Kind, OUTAGE_AFTER, Poison};

/// dead-letter-early: a record is dead-lettered only once it is out of tries: a poison record
/// (or any record that failed while the seed's outage was on) after `ATTEMPTS` tries, a
/// permanent one as permanent, any other only parked behind an earlier record that parked its
/// key (never behind itself or a later one). A flaky record (failing fewer times than it has
/// tries) never is, outside an outage.
pub(super) fn dead_letter_early(e: &Evidence<'_>, poison: &Poison, v: &mut Vec<String>) {
    for (_, letter) in &e.journal.letters {
        let position = letter.record.position();
        let kind = poison.kind(&letter.shard, &position);
        let in_outage = || {
            let id = format!("{}/{position}", letter.shard);
            e.journal.outage_failed.contains(&id)
        };
        let early = match (&letter.reason, kind) {
            (Reason::Attempts, Kind::Poison) => letter.attempts < ATTEMPTS,
            (Reason::Attempts, _) if in_outage() => letter.attempts < ATTEMPTS,
            (Reason::Permanent, Kind::Permanent) => letter.attempts < 1,
            (Reason::Parked { behind }, _) => {
                position <= *behind || !parks(e, letter.parked_key.as_deref(), behind)
            }
            _ => true,
        };
        if early {
            v.push(format!(
                "dead-letter-early: {position} of {} ({kind:?}) dead-lettered after {} tries ({})",
                letter.shard, letter.attempts, letter.reason
            ));
        }
    }
}

/// Whether a letter gave up the record at `behind` parking `key`.
fn parks(e: &Evidence<'_>, key: Option<&str>, behind: &ExtendedSequenceNumber) -> bool {
    e.journal.letters.iter().any(|(_, l)| {
        !matches!(l.reason, Reason::Parked { .. })
            && l.parked_key.as_deref() == key
            && key.is_some()
            && l.record.position() == *behind
    })
}

/// parked-key-order: under parked keys, no record of a key runs after the record that
/// parked it was given up (in any shard: the key's later records are in its children), once
/// the parking is durable: written into a lease row with a checkpoint that passes its record.
/// (Before that a crash or a restart delivers the record again; if it then succeeds, its key
/// runs on and its letter is a duplicate of a processed record.)
pub(super) fn parked_key_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    // Per ordering key (as the rows store it), the earliest record that parked it durably.
    let mut parked: BTreeMap<u64, ExtendedSequenceNumber> = BTreeMap::new();
    for event in e.store {
        for entry in &event.lease.parked_keys {
            if entry.contains("/redrive/") {
                continue;
            }
            let Some((key, behind)) = parse_entry(entry) else {
                v.push(format!(
                    "parked-key-order: a malformed entry {entry} in {}",
                    event.lease.key
                ));
                continue;
            };
            let at = parked.entry(key).or_insert_with(|| behind.clone());
            *at = (*at).clone().min(behind);
        }
    }
    // And when that record was given up (its letter first accepted).
    let given_up = |key: u64, behind: &ExtendedSequenceNumber| {
        let hex = format!("{key:016x}");
        e.journal
            .letters
            .iter()
            .filter(|(_, l)| !matches!(l.reason, Reason::Parked { .. }))
            .filter(|(_, l)| l.parked_key.as_deref() == Some(hex.as_str()))
            .filter(|(_, l)| l.record.position() == *behind)
            .map(|(seq, _)| *seq)
            .min()
    };
    // A key redriven: its runs from the request on are `redrive-order`'s to judge.
    let redriven = |key: &str, at: u64| {
        e.journal
            .redrives
            .iter()
            .any(|(seq, _, k)| k == key && *seq < at)
    };
    for run in &e.journal.runs {
        if redriven(&run.key, run.start_seq) {
            continue;
        }
        let mut h = DefaultHasher::new();
        run.key.hash(&mut h);
        let key = h.finish();
        let Some(behind) = parked.get(&key).filter(|behind| run.position > **behind) else {
            continue;
        };
        if given_up(key, behind).is_some_and(|since| run.start_seq > since) {
            v.push(format!(
                "parked-key-order: {} of parked key {} ran on {} by {} (parked behind {behind})",
                run.position, run.key, run.shard, run.worker
            ));
        }
    }
}

/// A parked-key entry, `{key:016x}/{sequence}/{sub-sequence}` (docs/lease-table.md).
fn parse_entry(entry: &str) -> Option<(u64, ExtendedSequenceNumber)> {
    let mut parts = entry.split('/');
    let key = u64::from_str_radix(parts.next()?, 16).ok()?;
    let sequence = kcl_core::SequenceNumber::parse(parts.next()?)?;
    let sub_sequence = parts.next()?.parse().ok()?;
    let position = ExtendedSequenceNumber {
        sequence,
        sub_sequence,
    };
    parts.next().is_none().then_some((key, position))
}

/// outage-bound: an outage (every record failing) is not a run of poison records: a shard
/// gives up at most `OUTAGE_AFTER` failing records in a row, then
/// blocks until one succeeds. The run is counted per shard and holder (a new tenure counts
/// anew), so over the outage a shard gives up at most `OUTAGE_AFTER` records for it per
/// tenure: the one holding it when it began, and each take during it. Every record is
/// processed after it (`no-loss`).
pub(super) fn outage_bound(e: &Evidence<'_>, poison: &Poison, v: &mut Vec<String>) {
    let Some((began, ended)) = e.journal.outage else {
        return;
    };
    let ended = ended.unwrap_or(u64::MAX);
    // Records given up for the outage: those that failed only for it (a parked key's records
    // given up behind it are not failures, and do not count).
    let mut given_up: BTreeMap<&ShardId, u32> = BTreeMap::new();
    for (_, letter) in &e.journal.letters {
        let position = letter.record.position();
        let kind = poison.kind(&letter.shard, &position);
        let fine = matches!(kind, Kind::Fine | Kind::Flaky(_));
        let id = format!("{}/{position}", letter.shard);
        let victim =
            fine && letter.reason == Reason::Attempts && e.journal.outage_failed.contains(&id);
        if victim {
            *given_up.entry(&letter.shard).or_default() += 1;
        }
    }
    for (shard, count) in given_up {
        let takes = e.store.iter().filter(|ev| {
            ev.operation == "take" && ev.lease.key == *shard && (began..=ended).contains(&ev.seq)
        });
        let tenures = u32::try_from(takes.count() + 1).unwrap_or(u32::MAX);
        if count > OUTAGE_AFTER.saturating_mul(tenures) {
            v.push(format!(
                "outage-bound: {shard} gave up {count} records for the outage, more than \
                 {OUTAGE_AFTER} for each of its {tenures} tenures"
            ));
        }
    }
}

/// redrive-order: a parked key redriven through its holder runs its letters before any later
/// record of it: from the request until its letters were replayed (the last removed from the
/// sink), no record of the key after its first letter runs that is not one of its letters.
pub(super) fn redrive_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    for (asked, hex, key) in &e.journal.redrives {
        let letters: BTreeMap<(&ShardId, ExtendedSequenceNumber), ()> = e
            .journal
            .letters
            .iter()
            .filter(|(_, l)| l.parked_key.as_deref() == Some(hex.as_str()))
            .map(|(_, l)| ((&l.shard, l.record.position()), ()))
            .collect();
        let Some(first) = letters.keys().map(|(_, p)| p.clone()).min() else {
            continue;
        };
        let removed = e.journal.removed.iter();
        let replayed = removed.filter(|(_, l)| l.parked_key.as_deref() == Some(hex.as_str()));
        let done = replayed.map(|(seq, _)| *seq).max().unwrap_or(u64::MAX);
        left_behind(e, (*asked, hex), v);
        for run in &e.journal.runs {
            let ok = run.end.is_some_and(|(_, ok)| ok);
            let during = run.start_seq > *asked && run.start_seq < done;
            let letter = letters.contains_key(&(&run.shard, run.position.clone()));
            if ok && during && run.key == *key && run.position > first && !letter {
                v.push(format!(
                    "redrive-order: {} of redriven key {key} ran on {} by {} before its letters \
                     were replayed",
                    run.position, run.shard, run.worker
                ));
            }
        }
    }
}

/// Once a redrive unparked its key (the holder removed every entry of the key from a row),
/// no letter of the key accepted before that is left in the sink: the replay took them all.
fn left_behind(e: &Evidence<'_>, (asked, hex): (u64, &str), v: &mut Vec<String>) {
    let prefix = format!("{hex}/");
    let unparked = e.store.iter().find(|ev| {
        ev.seq > asked
            && ev.operation == "unpark"
            && !ev.lease.parked_keys.iter().any(|k| k.starts_with(&prefix))
    });
    let Some(unparked) = unparked else {
        return;
    };
    let removed: std::collections::BTreeSet<(&ShardId, ExtendedSequenceNumber)> =
        (e.journal.removed.iter())
            .map(|(_, l)| (&l.shard, l.record.position()))
            .collect();
    for (seq, l) in &e.journal.letters {
        let of_key = l.parked_key.as_deref() == Some(hex);
        if of_key && *seq < unparked.seq && !removed.contains(&(&l.shard, l.record.position())) {
            v.push(format!(
                "redrive-order: letter {} of {} (key {hex}) left in the sink by the redrive that \
                 unparked its key in {}",
                l.record.position(),
                l.shard,
                unparked.lease.key
            ));
        }
    }
}
