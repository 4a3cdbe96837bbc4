//! One window's counts: what the processor emits and what the exactly-once table stores.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One window's counts for one shard: the line the processor emits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowSummary {
    /// The shard counted.
    pub shard: String,
    /// First instant of the window (inclusive).
    pub window_start: DateTime<Utc>,
    /// End of the window (exclusive).
    pub window_end: DateTime<Utc>,
    /// False when emitted early (shutdown or handoff): the rest of the window follows in a
    /// line from the next owner.
    pub complete: bool,
    /// Records counted.
    pub records: u64,
    /// Payload bytes counted.
    pub bytes: u64,
    /// Distinct partition keys seen.
    pub distinct_keys: usize,
    /// The busiest partition keys, most records first.
    pub top_keys: Vec<KeyCount>,
}

/// Counts for one partition key in one window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyCount {
    /// The partition key.
    pub key: String,
    /// Records with this key.
    pub records: u64,
    /// Their payload bytes.
    pub bytes: u64,
}
