//! Invariants of fleets under a failure policy: nothing is given up before its tries are
//! spent, and a parked key runs none of its later records. (That every record is processed
//! or dead-lettered, once the sink accepted it, is `no-loss`; that a bisect delivers no record
//! beyond its bound, nor one that succeeded, the processors log as `bisect-bound`.)

use std::collections::BTreeMap;

use kcl_core::ExtendedSequenceNumber;
use kcl_core::failure::Reason;

use super::Evidence;
use crate::sim::poison::{ATTEMPTS, Kind, Poison};

/// dead-letter-early: a record is dead-lettered only once it is out of tries: a poison record
/// after `ATTEMPTS` tries, a permanent one as permanent, any other only parked behind a
/// record that parked its key. A flaky record (failing fewer times than it has tries) never is.
pub(super) fn dead_letter_early(e: &Evidence<'_>, poison: &Poison, v: &mut Vec<String>) {
    for (_, letter) in &e.journal.letters {
        let position = letter.record.position();
        let kind = poison.kind(&letter.shard, &position);
        let early = match (&letter.reason, kind) {
            (Reason::Attempts, Kind::Poison) => letter.attempts < ATTEMPTS,
            (Reason::Permanent, Kind::Permanent) => letter.attempts < 1,
            (Reason::Parked { behind }, _) => !parks(e, letter.parked_key.as_deref(), behind),
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
/// parked it (in any shard: the key's later records are in its children).
pub(super) fn parked_key_order(e: &Evidence<'_>, v: &mut Vec<String>) {
    // Per partition key, the earliest record that parked it.
    let mut parked: BTreeMap<&str, ExtendedSequenceNumber> = BTreeMap::new();
    for (_, letter) in &e.journal.letters {
        if letter.parked_key.is_some() && !matches!(letter.reason, Reason::Parked { .. }) {
            let at = parked
                .entry(letter.record.partition_key.as_str())
                .or_insert_with(|| letter.record.position());
            *at = (*at).clone().min(letter.record.position());
        }
    }
    for run in &e.journal.runs {
        if let Some(behind) = parked.get(run.key.as_str())
            && run.position > *behind
        {
            v.push(format!(
                "parked-key-order: {} of parked key {} ran on {} by {} (parked behind {behind})",
                run.position, run.key, run.shard, run.worker
            ));
        }
    }
}
