//! What the failure policy did on one shard, for `Status`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// While a shard is in an outage, one record is given up this often: a record that can never
/// succeed, met first when the outage ends, would otherwise keep the shard blocked for good
/// (nothing before it can succeed to end the outage).
pub const OUTAGE_PROBE: Duration = Duration::from_secs(60);

/// What the failure policy did on one shard while this worker held it
/// ([`ShardStatus::failures`](crate::ShardStatus)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordFailures {
    /// Tries of failing records beyond their first.
    pub retries: u64,
    /// Records written to the dead-letter sink.
    pub dead_lettered: u64,
    /// Records skipped.
    pub skipped: u64,
    /// Ordering keys parked now (`Parallel::park_keys`).
    pub parked_keys: u64,
    /// Whether the sink refuses now: a dead letter waits for it, and the checkpoint with it.
    pub sink_refusing: bool,
    /// Puts of one letter the sink refused in a row (0 once one is accepted): from
    /// [`SINK_FAILING_AFTER`] on, the shard is reported `failing`.
    pub sink_refusals: u32,
    /// Whether the shard is taken to be in an outage: it gave up
    /// [`outage_after`](super::FailurePolicy::outage_after) records in a row with none
    /// succeeding, and blocks until one does.
    pub outage: bool,
}

/// Refused puts of one letter in a row after which the shard is reported `failing` (and a
/// readiness probe fails): five, as for attempts that keep failing; with the policy's default
/// backoff, about half a minute of refusals.
pub const SINK_FAILING_AFTER: u32 = 5;

/// The counts behind [`RecordFailures`], shared by the shard task and its processor's tasks.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    retries: AtomicU64,
    dead_lettered: AtomicU64,
    skipped: AtomicU64,
    parked_keys: AtomicU64,
    sink_refusing: AtomicBool,
    sink_refusals: AtomicU32,
    /// Records given up in a row (or being given up), none succeeding since.
    given_up_in_row: AtomicU32,
    outage: AtomicBool,
    /// When the outage began, or a record was last given up in it.
    probed: Mutex<Option<Instant>>,
    /// Records whose outputs could not commit in a row, none committing since
    /// (`Parallel::with_outputs`): kept apart from `given_up_in_row`, which a handler's
    /// success ends before its outputs are tried.
    refused_in_row: AtomicU32,
}

impl Tally {
    pub(crate) fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn parked_keys(&self, n: u64) {
        self.parked_keys.store(n, Ordering::Relaxed);
    }

    /// The sink refused one letter's `n`-th put in a row.
    pub(crate) fn sink_refused(&self, n: u32) {
        self.sink_refusing.store(true, Ordering::Relaxed);
        self.sink_refusals.fetch_max(n, Ordering::Relaxed);
    }

    /// The sink accepted a letter (another still refused counts again at its next refusal).
    pub(crate) fn sink_accepted(&self) {
        self.sink_refusing.store(false, Ordering::Relaxed);
        self.sink_refusals.store(0, Ordering::Relaxed);
    }

    /// Counts a record about to be given up, unless `limit` are already given up in a row:
    /// `false` then (the shard is in an outage; see
    /// [`FailurePolicy::outage_after`](super::FailurePolicy::outage_after)), and the first
    /// `false` of an outage also says `true` in the second place.
    pub(crate) fn reserve_give_up(&self, limit: u32) -> (bool, bool) {
        let counted = self
            .given_up_in_row
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if counted {
            return (true, false);
        }
        let began = !self.outage.swap(true, Ordering::AcqRel);
        let mut probed = self.probed.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match *probed {
            Some(at) if !began && now.duration_since(at) >= OUTAGE_PROBE => {
                *probed = Some(now);
                (true, false)
            }
            Some(_) if !began => (false, false),
            _ => {
                *probed = Some(now);
                (false, began)
            }
        }
    }

    /// A record succeeded: the run of records given up ends, and any outage with it
    /// (`true` if there was one).
    pub(crate) fn succeeded(&self) -> bool {
        if self.given_up_in_row.load(Ordering::Acquire) != 0 {
            self.given_up_in_row.store(0, Ordering::Release);
        }
        self.outage.load(Ordering::Acquire) && self.outage.swap(false, Ordering::AcqRel)
    }

    /// A record's outputs could not commit: how many in a row now.
    pub(crate) fn output_refused(&self) -> u32 {
        self.refused_in_row
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1)
    }

    /// A record's outputs committed: the run of refusals ends.
    pub(crate) fn output_committed(&self) {
        if self.refused_in_row.load(Ordering::Acquire) != 0 {
            self.refused_in_row.store(0, Ordering::Release);
        }
    }

    pub(crate) fn snapshot(&self) -> RecordFailures {
        RecordFailures {
            retries: self.retries.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            parked_keys: self.parked_keys.load(Ordering::Relaxed),
            sink_refusing: self.sink_refusing.load(Ordering::Relaxed),
            sink_refusals: self.sink_refusals.load(Ordering::Relaxed),
            outage: self.outage.load(Ordering::Relaxed),
        }
    }
}
