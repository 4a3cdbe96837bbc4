//! Whether the table's position of a shard is in step with the shard's lease.
//!
//! Every commit writes the shard's position item (the checkpoint it commits) in the same
//! transaction as the lease's checkpoint, so the two are equal whenever only workers with the
//! table checkpoint. A lease **ahead** of the table's position was checkpointed without the
//! windows of the records between: by a worker of the application running without
//! `--exactly-once-table` (a mixed fleet), or by `kcl-admin reset` forwards; those windows
//! are missing from the table for good. A lease **behind** it was moved back (`kcl-admin
//! reset` backwards, a lease row deleted and created again): the records between are
//! counted again. Neither can be undone by the worker that finds it, so it is reported where
//! an operator looks: one ERROR line naming the shard, the table and both positions, a
//! counter, the `/exactly-once` route; and recorded in the position item itself (see
//! [`super::dynamodb`]).
//!
//! A shard's end is not compared: `SHARD_END` is committed with the position only when a
//! record came after the last window, and a finished shard is never opened again.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use kcl_core::{Checkpoint, ShardId};

/// Counter: shards found out of step with the table, by `kind` (`missing`: lease ahead, the
/// windows between are not in the table; `recounted`: lease behind, they will count twice).
/// Each (shard, lease checkpoint, table position) counts once in a process.
pub const OUT_OF_STEP: &str = "kcl_example_exactly_once_out_of_step_total";
/// Gauge: shards whose lease was last found ahead of the table's position (at a check, or
/// when this worker opened them) and not found in step since: a worker without the flag is
/// checkpointing them, or did, and no worker with it has opened them since.
pub const SHARDS_AHEAD: &str = "kcl_example_exactly_once_shards_ahead";

/// How a shard's lease stands against the table's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Equal, or nothing processed on either side, or the shard ended.
    InStep,
    /// The lease is ahead: the records between were checkpointed without their windows.
    Missing,
    /// The lease is behind: the records between are counted again.
    Recounted,
}

impl Found {
    /// `open` or `check`, as in `/exactly-once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Check => "check",
        }
    }
}

impl Step {
    /// `missing` or `recounted` (`in_step`), as in the counter's label and `/exactly-once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InStep => "in_step",
            Self::Missing => "missing",
            Self::Recounted => "recounted",
        }
    }
}

/// How `lease`, a lease's checkpoint, stands against `table`, the table's position of the
/// same shard (`None`: the table has no position item for it).
pub fn compare(lease: &Checkpoint, table: Option<&Checkpoint>) -> Step {
    use Checkpoint::{Sequence, ShardEnd};
    match (lease, table) {
        (ShardEnd, _) => Step::InStep,
        (Sequence(l), Some(Sequence(t))) => match l.cmp(t) {
            std::cmp::Ordering::Greater => Step::Missing,
            std::cmp::Ordering::Less => Step::Recounted,
            std::cmp::Ordering::Equal => Step::InStep,
        },
        (Sequence(_), Some(ShardEnd)) => Step::Recounted,
        // No position, or one from before the first record (a baseline of a new lease).
        (Sequence(_), _) => Step::Missing,
        // The lease is back at its initial position.
        (_, Some(Sequence(_) | ShardEnd)) => Step::Recounted,
        _ => Step::InStep,
    }
}

/// Where a mismatch was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// When this worker opened the shard.
    Open,
    /// At a check of the whole lease table (at start, then every [`CHECK_EVERY`]).
    Check,
}

/// How often a worker compares leases with the table's positions.
pub const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// How many leases (held by other workers) one periodic check reads, the next ones after the
/// last check's: a read each, so a worker reads at most this many positions a minute.
pub const CHECK_SAMPLE: usize = 25;

/// A shard found out of step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The shard (its lease key).
    pub shard: ShardId,
    /// Its lease's checkpoint.
    pub lease: Checkpoint,
    /// The table's position, if it has one.
    pub table: Option<Checkpoint>,
    /// Ahead or behind.
    pub step: Step,
    /// Where it was found.
    pub found: Found,
    /// When.
    pub at: DateTime<Utc>,
}

impl Mismatch {
    /// The table's position as written in messages.
    pub fn table_position(&self) -> String {
        self.table
            .as_ref()
            .map_or_else(|| "none".to_owned(), ToString::to_string)
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shard, lease, table) = (&self.shard, &self.lease, self.table_position());
        match self.step {
            Step::Missing => write!(
                f,
                "shard {shard}: its lease's checkpoint {lease} is ahead of the position the \
                 table holds for it ({table}): the records between were checkpointed without \
                 their windows, by a worker of this application without \
                 --exactly-once-table (or a kcl-admin reset forwards); their counts are \
                 missing from the table. Run every worker with the flag"
            ),
            Step::Recounted => write!(
                f,
                "shard {shard}: its lease's checkpoint {lease} is behind the position the \
                 table holds for it ({table}): the records between are processed again (a \
                 kcl-admin reset backwards, or a lease row created again) and their windows \
                 will count them twice"
            ),
            Step::InStep => write!(f, "shard {shard}: in step at {lease}"),
        }
    }
}

/// The mismatches this process found: reported once each, the recent ones kept for
/// `/exactly-once`.
#[derive(Debug, Default)]
pub struct Mismatches {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The last one reported per shard: the same again is not reported again.
    last: HashMap<ShardId, (Checkpoint, Option<Checkpoint>)>,
    recent: VecDeque<Mismatch>,
    /// Shards last found with their lease ahead of the table, not found in step since.
    ahead: BTreeSet<ShardId>,
    /// Reported so far: lease ahead, lease behind.
    missing: u64,
    recounted: u64,
}

/// How many mismatches `/exactly-once` lists.
const RECENT: usize = 100;

impl Mismatches {
    /// Reports `mismatch` of `table` (ERROR line, counter) unless it was reported already;
    /// true if it was new.
    pub fn report(&self, table: &str, mismatch: &Mismatch) -> bool {
        let mut inner = self.lock();
        let key = (mismatch.lease.clone(), mismatch.table.clone());
        if inner.last.get(&mismatch.shard) == Some(&key) {
            return false;
        }
        inner.last.insert(mismatch.shard.clone(), key);
        if inner.recent.len() == RECENT {
            inner.recent.pop_front();
        }
        inner.recent.push_back(mismatch.clone());
        match mismatch.step {
            Step::Missing => inner.missing += 1,
            Step::Recounted => inner.recounted += 1,
            Step::InStep => {}
        }
        inner.publish();
        drop(inner);
        tracing::error!(
            table,
            shard = %mismatch.shard,
            lease_checkpoint = %mismatch.lease,
            table_position = %mismatch.table_position(),
            kind = mismatch.step.as_str(),
            "exactly-once table {table} out of step: {mismatch}"
        );
        true
    }

    /// Notes whether `shard`'s lease was last found ahead of the table.
    pub fn mark(&self, shard: &ShardId, ahead: bool) {
        let mut inner = self.lock();
        let changed = if ahead {
            inner.ahead.insert(shard.clone())
        } else {
            inner.ahead.remove(shard)
        };
        if changed {
            inner.publish();
        }
    }

    /// The shards last found with their lease ahead of the table, and not in step since.
    pub fn ahead(&self) -> Vec<ShardId> {
        self.lock().ahead.iter().cloned().collect()
    }

    /// The recent mismatches, oldest first.
    pub fn recent(&self) -> Vec<Mismatch> {
        self.lock().recent.iter().cloned().collect()
    }

    /// Publishes the metrics again: they may have been found before the recorder was
    /// installed (at start), and the exporter drops series not touched for a while.
    pub fn refresh(&self) {
        describe();
        self.lock().publish();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Inner {
    /// The metrics, as absolute values.
    #[allow(clippy::cast_precision_loss)]
    fn publish(&self) {
        ::metrics::counter!(OUT_OF_STEP, "kind" => Step::Missing.as_str()).absolute(self.missing);
        ::metrics::counter!(OUT_OF_STEP, "kind" => Step::Recounted.as_str())
            .absolute(self.recounted);
        ::metrics::gauge!(SHARDS_AHEAD).set(self.ahead.len() as f64);
    }
}

/// Describes the metrics.
fn describe() {
    ::metrics::describe_counter!(
        OUT_OF_STEP,
        "Shards found out of step with the exactly-once table, by kind: missing (the lease is \
         ahead: records checkpointed without their windows), recounted (the lease is behind)"
    );
    ::metrics::describe_gauge!(
        SHARDS_AHEAD,
        "Shards whose lease was last found ahead of the exactly-once table's position, and \
         not in step since: a worker without --exactly-once-table checkpointed them"
    );
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use kcl_core::{ExtendedSequenceNumber, SequenceNumber};

    use super::*;

    fn at(n: u64) -> Checkpoint {
        let sequence = SequenceNumber::parse(n.to_string()).unwrap_or_else(|| panic!("digits"));
        Checkpoint::Sequence(ExtendedSequenceNumber::new(sequence))
    }

    #[test]
    fn a_lease_ahead_misses_windows_and_one_behind_recounts_them() {
        use Checkpoint::{Latest, ShardEnd, TrimHorizon};
        let cases = [
            (at(5), Some(at(5)), Step::InStep),
            (at(7), Some(at(5)), Step::Missing),
            (at(5), Some(at(7)), Step::Recounted),
            (at(5), None, Step::Missing),
            (at(5), Some(TrimHorizon), Step::Missing),
            (TrimHorizon, None, Step::InStep),
            (Latest, Some(TrimHorizon), Step::InStep),
            (TrimHorizon, Some(at(5)), Step::Recounted),
            (at(5), Some(ShardEnd), Step::Recounted),
            (ShardEnd, Some(at(5)), Step::InStep),
            (ShardEnd, None, Step::InStep),
        ];
        for (lease, table, step) in cases {
            assert_eq!(compare(&lease, table.as_ref()), step, "{lease} {table:?}");
        }
    }

    #[test]
    fn a_mismatch_is_reported_once() {
        let found = Mismatches::default();
        let m = Mismatch {
            shard: ShardId::new("shardId-1"),
            lease: at(9),
            table: Some(at(3)),
            step: Step::Missing,
            found: Found::Check,
            at: Utc::now(),
        };
        assert!(found.report("t", &m));
        assert!(!found.report("t", &m));
        let further = Mismatch {
            lease: at(12),
            ..m.clone()
        };
        assert!(found.report("t", &further));
        assert_eq!(found.recent(), vec![m, further]);
    }
}
