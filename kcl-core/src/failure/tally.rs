//! What the failure policy did on one shard, for `Status`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
}

/// The counts behind [`RecordFailures`], shared by the shard task and its processor's tasks.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    retries: AtomicU64,
    dead_lettered: AtomicU64,
    skipped: AtomicU64,
    parked_keys: AtomicU64,
    sink_refusing: AtomicBool,
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

    pub(crate) fn sink_refusing(&self, refusing: bool) {
        self.sink_refusing.store(refusing, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RecordFailures {
        RecordFailures {
            retries: self.retries.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            parked_keys: self.parked_keys.load(Ordering::Relaxed),
            sink_refusing: self.sink_refusing.load(Ordering::Relaxed),
        }
    }
}
