//! Whether the table's position of a shard is in step with the shard's lease.
//!
//! Every commit writes the shard's position item (the checkpoint it commits) in the same
//! transaction as the lease's checkpoint, so the two are equal whenever only workers with the
//! table checkpoint. A lease **ahead** of the table's position was checkpointed without the
//! windows of the records between: by a worker of the application running without
//! `--exactly-once-table` (a mixed fleet), or by `kcl-admin reset` forwards; those windows
//! are missing from the table for good, and no worker that finds it can undo it, so it is
//! reported where an operator looks: one ERROR line naming the shard, the table and both
//! positions, a counter, a gauge of the shards still ahead, a problem on `/status`, the
//! `/exactly-once` route; and recorded in the position item itself (see
//! [`super::dynamodb`]). A lease **behind** it was moved back (`kcl-admin reset` backwards,
//! a lease row deleted and created again): the records between are delivered again, and are
//! counted in the table already. The processor skips them (it resumes from the later of the
//! two, see [`super::Committed`]): the table stays exact, and the replay is counted and said
//! at WARN, not reported as an error.
//!
//! A shard's end is not compared: `SHARD_END` is committed with the position only when a
//! record came after the last window, and a finished shard is never opened again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use kcl_core::{Checkpoint, ShardId};

/// Counter: shards found out of step with the table, by `kind` (`missing`: lease ahead, the
/// windows between are not in the table; `behind`: lease behind, the records between are
/// delivered again and skipped). Each (shard, lease checkpoint, table position) counts once
/// in a process.
pub const OUT_OF_STEP: &str = "kcl_example_exactly_once_out_of_step_total";
/// Gauge: shards whose lease was last found ahead of the table's position (at a check, or
/// when this worker opened them) and not found in step since: a worker without the flag is
/// checkpointing them, or did, and no worker with it has opened them since.
pub const SHARDS_AHEAD: &str = "kcl_example_exactly_once_shards_ahead";
/// Counter: records delivered again that the table counts already (at or before the shard's
/// position: a lease moved back), skipped rather than counted twice.
pub const ALREADY_COUNTED: &str = "kcl_example_exactly_once_records_already_counted_total";
/// The kind of problem a shard ahead is on `/status`.
pub const PROBLEM: &str = "outputs_out_of_step";

/// How a shard's lease stands against the table's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Equal, or nothing processed on either side, or the shard ended.
    InStep,
    /// The lease is ahead: the records between were checkpointed without their windows.
    Missing,
    /// The lease is behind: the records between are delivered again (and skipped).
    Behind,
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
    /// `missing` or `behind` (`in_step`), as in the counter's label and `/exactly-once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InStep => "in_step",
            Self::Missing => "missing",
            Self::Behind => "behind",
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
            std::cmp::Ordering::Less => Step::Behind,
            std::cmp::Ordering::Equal => Step::InStep,
        },
        (Sequence(_), Some(ShardEnd)) => Step::Behind,
        // No position, or one from before the first record (a baseline of a new lease).
        (Sequence(_), _) => Step::Missing,
        // The lease is back at its initial position.
        (_, Some(Sequence(_) | ShardEnd)) => Step::Behind,
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

    /// What the position item records of it (`last_gap`, `last_replay`), found by `worker`.
    pub fn description(&self, worker: &str) -> String {
        format!(
            "{}: the lease was at {}, the table at {}; found by {worker}",
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            self.lease,
            self.table_position(),
        )
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
            Step::Behind => write!(
                f,
                "shard {shard}: its lease's checkpoint {lease} is behind the position the \
                 table holds for it ({table}): the records between are delivered again (a \
                 kcl-admin reset backwards, or a lease row created again); the table counts \
                 them already, so they are skipped"
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
    /// Shards last found with their lease ahead of the table, not found in step since, with
    /// what was found.
    ahead: BTreeMap<ShardId, Mismatch>,
    /// Reported so far: lease ahead, lease behind.
    missing: u64,
    behind: u64,
    /// Records skipped as counted already.
    already_counted: u64,
}

/// How many mismatches `/exactly-once` lists.
const RECENT: usize = 100;

impl Mismatches {
    /// Reports `mismatch` of `table` unless it was reported already (the counter; an ERROR
    /// line for a lease ahead, INFO for one behind: its processor says at WARN what it
    /// skipped); true if it was new.
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
            Step::Behind => inner.behind += 1,
            Step::InStep => {}
        }
        inner.publish();
        drop(inner);
        let (shard, lease) = (&mismatch.shard, &mismatch.lease);
        let (position, kind) = (mismatch.table_position(), mismatch.step.as_str());
        if mismatch.step == Step::Behind {
            tracing::info!(
                table,
                %shard,
                lease_checkpoint = %lease,
                table_position = %position,
                kind,
                "exactly-once table {table}: {mismatch}"
            );
        } else {
            tracing::error!(
                table,
                %shard,
                lease_checkpoint = %lease,
                table_position = %position,
                kind,
                "exactly-once table {table} out of step: {mismatch}"
            );
        }
        true
    }

    /// Notes whether `shard`'s lease was last found ahead of the table (`Some`: as found).
    pub fn mark(&self, shard: &ShardId, ahead: Option<&Mismatch>) {
        let mut inner = self.lock();
        let changed = match ahead {
            Some(found) => inner
                .ahead
                .insert(shard.clone(), found.clone())
                .is_none_or(|was| was != *found),
            None => inner.ahead.remove(shard).is_some(),
        };
        if changed {
            inner.publish();
        }
    }

    /// The shards last found with their lease ahead of the table, and not in step since.
    pub fn ahead(&self) -> Vec<ShardId> {
        self.lock().ahead.keys().cloned().collect()
    }

    /// The shards last found ahead, as problems for `/status`: (kind, shard, what was found
    /// and what to do).
    pub fn problems(&self) -> Vec<(&'static str, String, String)> {
        let inner = self.lock();
        let found = inner.ahead.values();
        found
            .map(|m| (PROBLEM, m.shard.to_string(), m.to_string()))
            .collect()
    }

    /// Counts `n` records skipped as counted already.
    pub fn already_counted(&self, n: u64) {
        if n > 0 {
            let mut inner = self.lock();
            inner.already_counted += n;
            inner.publish();
        }
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
        ::metrics::counter!(OUT_OF_STEP, "kind" => Step::Behind.as_str()).absolute(self.behind);
        ::metrics::counter!(ALREADY_COUNTED).absolute(self.already_counted);
        ::metrics::gauge!(SHARDS_AHEAD).set(self.ahead.len() as f64);
    }
}

/// Describes the metrics.
fn describe() {
    ::metrics::describe_counter!(
        OUT_OF_STEP,
        "Shards found out of step with the exactly-once table, by kind: missing (the lease is \
         ahead: records checkpointed without their windows), behind (the lease was moved back: \
         the records up to the table's position are skipped)"
    );
    ::metrics::describe_gauge!(
        SHARDS_AHEAD,
        "Shards whose lease was last found ahead of the exactly-once table's position, and \
         not in step since: a worker without --exactly-once-table checkpointed them"
    );
    ::metrics::describe_counter!(
        ALREADY_COUNTED,
        "Records delivered again that the exactly-once table counts already (a lease moved \
         back), skipped"
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
    fn a_lease_ahead_misses_windows_and_one_behind_replays_them() {
        use Checkpoint::{Latest, ShardEnd, TrimHorizon};
        let cases = [
            (at(5), Some(at(5)), Step::InStep),
            (at(7), Some(at(5)), Step::Missing),
            (at(5), Some(at(7)), Step::Behind),
            (at(5), None, Step::Missing),
            (at(5), Some(TrimHorizon), Step::Missing),
            (TrimHorizon, None, Step::InStep),
            (Latest, Some(TrimHorizon), Step::InStep),
            (TrimHorizon, Some(at(5)), Step::Behind),
            (at(5), Some(ShardEnd), Step::Behind),
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
