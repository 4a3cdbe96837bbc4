//! Reading the JSONL journals the test worker writes (see `kcl-test-worker`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kcl_core::SequenceNumber;
use serde::Deserialize;

/// One journal line.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Event {
    /// `started`, `serving`, `init`, `record`, `checkpoint`, `checkpoint_failed`,
    /// `shard_end`, `shutdown_checkpoint`, `lease_lost` or `stopped`.
    pub event: String,
    /// The worker that wrote it.
    pub worker: String,
    /// Line number within the worker's journal.
    pub n: u64,
    /// Wall-clock time, epoch milliseconds.
    pub ms: i64,
    /// The shard, for shard events.
    pub shard: Option<String>,
    /// Record or checkpoint sequence number.
    pub seq: Option<String>,
    /// Sub-sequence number of a record (its index inside a KPL aggregate, else 0).
    pub sub: Option<u64>,
    /// Partition key of a record.
    pub pk: Option<String>,
    /// Payload of a record (UTF-8); of a `batch` line, its first record's.
    pub data: Option<String>,
    /// Records in a `batch` line (`--journal-batches`).
    pub count: Option<u64>,
    /// The checkpoint a processor started from (`init`).
    pub checkpoint: Option<String>,
    /// Whether a failed checkpoint was refused because the lease was lost.
    pub lease_lost: Option<bool>,
    /// The fencing token of a `singleton_start` or `singleton_stop` line.
    pub token: Option<u64>,
    /// The HTTP server's address (`serving`, under `--http`).
    pub http: Option<String>,
    /// KEDA's external scaler's address (`serving`, under `--http`).
    pub scaler: Option<String>,
}

impl Event {
    /// The sequence number, parsed.
    pub fn sequence(&self) -> Option<SequenceNumber> {
        self.seq.as_deref().and_then(SequenceNumber::parse)
    }
}

/// Every event of a journal; a missing file is an empty journal, and a torn last line (a
/// killed writer) is ignored.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// The payloads of every `record` event.
pub fn delivered(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == "record")
        .filter_map(|e| e.data.clone())
        .collect()
}

/// The set of payloads of every `record` event of several journals.
pub fn delivered_set<'a>(journals: impl IntoIterator<Item = &'a [Event]>) -> BTreeSet<String> {
    journals.into_iter().flat_map(delivered).collect()
}

/// The shards with a record delivered, and how many records each.
pub fn records_by_shard(events: &[Event]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for e in events.iter().filter(|e| e.event == "record") {
        if let Some(shard) = &e.shard {
            *by.entry(shard.clone()).or_default() += 1;
        }
    }
    by
}
