//! The example's processor: counts records and bytes per partition key in tumbling windows
//! of record arrival time, emits one JSON line per window and checkpoints after it.
//!
//! Windows are per shard and aligned to the epoch (a 60 s window runs from :00 to :00). A
//! window closes when a record of a later window arrives, or on time: when the worker calls
//! with an empty batch (the shard is read to its tip and quiet; the binary sets
//! `empty_batch_interval`) [`CLOSE_AFTER`] past the window's end, so the last window of a
//! stream that goes quiet shows too. The processor then emits it and checkpoints at its last
//! record, so after a failover the next owner recounts only the window that was still open.
//! A record that arrives later than that for a closed window (its arrival time set by the
//! service, more than [`CLOSE_AFTER`] before it could be read) gets a line of its own. Emission is at least once: a window emitted just before a
//! crash, and not yet checkpointed, is emitted again by the next owner. A graceful shutdown
//! or handoff emits the open window early, marked `"complete": false`, and checkpoints
//! everything, so nothing is counted twice.
//!
//! With a [`WindowTable`] ([`WindowCounter::with_table`], the binary's
//! `--exactly-once-table`), each closed window's counts are also committed in the same
//! transaction as the checkpoint at its last record: the table holds every window's count
//! exactly once, whatever crashes, freezes and handoffs happen (see [`crate::table`]). On
//! opening a shard it compares the lease's checkpoint with the table's position of the shard
//! and reports records checkpointed without their windows ([`crate::table::step`]).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, ExtendedSequenceNumber,
    InitializationInput, ProcessRecordsInput, Record, RecordProcessor, ShardId,
};

use crate::table::{Closed, CommitFailed, Through, WindowTable};
pub use crate::window::{KeyCount, WindowSummary};

/// How long past its end a window waits, on a quiet shard, for records that arrived before
/// its end and are not readable yet, before it closes on time.
pub const CLOSE_AFTER: Duration = Duration::from_secs(2);

/// Where window lines go.
pub trait WindowSink: Send + Sync + 'static {
    /// Emits one window.
    fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError>;
}

/// Writes each window as one JSON line on stdout.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdoutSink;

impl WindowSink for StdoutSink {
    fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError> {
        let line = serde_json::to_string(summary)?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        Ok(())
    }
}

impl<T: WindowSink> WindowSink for Arc<T> {
    fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError> {
        (**self).emit(summary)
    }
}

/// The counting state of one shard, without any I/O.
#[derive(Debug)]
pub struct Windows {
    shard: String,
    length: TimeDelta,
    top_keys: usize,
    open: Option<OpenWindow>,
}

#[derive(Debug)]
struct OpenWindow {
    start: DateTime<Utc>,
    records: u64,
    bytes: u64,
    keys: HashMap<String, (u64, u64)>,
    last: ExtendedSequenceNumber,
}

impl Windows {
    /// Windows of `length` (at least 1 ms) for `shard`, listing up to `top_keys` keys each.
    pub fn new(shard: &ShardId, length: Duration, top_keys: usize) -> Self {
        let length = TimeDelta::from_std(length)
            .unwrap_or(TimeDelta::MAX)
            .max(TimeDelta::milliseconds(1));
        Self {
            shard: shard.to_string(),
            length,
            top_keys,
            open: None,
        }
    }

    /// The start of the window `at` falls in.
    pub fn window_of(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let len = self.length.num_milliseconds().max(1);
        let ms = at.timestamp_millis();
        DateTime::from_timestamp_millis(ms - ms.rem_euclid(len)).unwrap_or(at)
    }

    /// Counts `record`. If it belongs to a later window than the open one, the open window
    /// is closed first and returned with its last record's position.
    pub fn add(&mut self, record: &Record) -> Option<(WindowSummary, ExtendedSequenceNumber)> {
        let start = self.window_of(record.approximate_arrival);
        // Arrival times can step back slightly within a shard: such records count in the
        // open window rather than reopening an emitted one.
        let closed = match &self.open {
            Some(open) if start > open.start => self.close(true),
            _ => None,
        };
        let open = self.open.get_or_insert_with(|| OpenWindow {
            start,
            records: 0,
            bytes: 0,
            keys: HashMap::new(),
            last: record.position(),
        });
        let bytes = record.data.len() as u64;
        open.records += 1;
        open.bytes += bytes;
        let key = open.keys.entry(record.partition_key.clone()).or_default();
        key.0 += 1;
        key.1 += bytes;
        open.last = record.position();
        closed
    }

    /// Closes the open window if `now` is [`CLOSE_AFTER`] past its end (call it only when the
    /// shard is read to its tip).
    pub fn close_due(
        &mut self,
        now: DateTime<Utc>,
    ) -> Option<(WindowSummary, ExtendedSequenceNumber)> {
        let open = self.open.as_ref()?;
        let due = open.start + self.length + TimeDelta::from_std(CLOSE_AFTER).unwrap_or_default();
        if now < due {
            return None;
        }
        self.close(true)
    }

    /// Closes the open window, if any.
    pub fn close(&mut self, complete: bool) -> Option<(WindowSummary, ExtendedSequenceNumber)> {
        let open = self.open.take()?;
        let mut keys: Vec<KeyCount> = open
            .keys
            .into_iter()
            .map(|(key, (records, bytes))| KeyCount {
                key,
                records,
                bytes,
            })
            .collect();
        let distinct_keys = keys.len();
        keys.sort_by(|a, b| b.records.cmp(&a.records).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(self.top_keys);
        let summary = WindowSummary {
            shard: self.shard.clone(),
            window_start: open.start,
            window_end: open.start + self.length,
            complete,
            records: open.records,
            bytes: open.bytes,
            distinct_keys,
            top_keys: keys,
        };
        Some((summary, open.last))
    }

    /// Forgets the open window (the lease was lost: the next owner recounts it).
    pub fn discard(&mut self) -> Option<u64> {
        self.open.take().map(|w| w.records)
    }
}

/// The [`RecordProcessor`]: [`Windows`] plus a [`WindowSink`] plus checkpoints, and with a
/// [`WindowTable`] each window's counts committed with its checkpoint, exactly once.
#[derive(Debug)]
pub struct WindowCounter<S> {
    windows: Windows,
    sink: S,
    clock: Clock,
    table: Option<Arc<dyn WindowTable>>,
    /// The lease's checkpoint, as opened and then committed.
    stored: Checkpoint,
}

/// The wall clock, read as its value at the processor's start plus the monotonic time since
/// (so a wall-clock step does not close windows early, and tests on paused time run it).
#[derive(Debug)]
struct Clock {
    wall: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl Clock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = TimeDelta::from_std(self.start.elapsed()).unwrap_or_default();
        self.wall + elapsed
    }
}

impl<S: WindowSink> WindowCounter<S> {
    /// A processor for `shard`.
    pub fn new(shard: &ShardId, window: Duration, top_keys: usize, sink: S) -> Self {
        Self {
            windows: Windows::new(shard, window, top_keys),
            sink,
            clock: Clock {
                wall: Utc::now(),
                start: tokio::time::Instant::now(),
            },
            table: None,
            stored: Checkpoint::TrimHorizon,
        }
    }

    /// Commits each closed window to `table` with the checkpoint at its last record (see
    /// [`crate::table`]), rather than checkpointing alone.
    #[must_use]
    pub fn with_table(mut self, table: Arc<dyn WindowTable>) -> Self {
        self.table = Some(table);
        self
    }

    /// Emits `closed` windows, then checkpoints `through`, committing the windows with the
    /// checkpoint when there is a table.
    async fn emit_and_commit(
        &mut self,
        checkpointer: &mut Checkpointer,
        closed: Vec<Closed>,
        through: Through,
    ) -> Result<Result<(), CommitFailed>, BoxError> {
        for (summary, _) in &closed {
            self.sink.emit(summary)?;
        }
        let Some(table) = self.table.clone() else {
            let plain = match through {
                Through::Record(position) => checkpointer.checkpoint_at(position).await,
                Through::Delivered | Through::ShardEnd => checkpointer.checkpoint().await,
            };
            return Ok(plain.map_err(CommitFailed::from));
        };
        Ok(table
            .commit(checkpointer, closed, &mut self.stored, through)
            .await)
    }
}

impl<S: WindowSink> RecordProcessor for WindowCounter<S> {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.stored = input.checkpoint.clone();
        if let Some(table) = &self.table {
            table.open(&input.shard_id, &input.checkpoint).await?;
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let started = Instant::now();
        let delay = input.records().first().map(|r| {
            (self.clock.now() - r.approximate_arrival)
                .num_milliseconds()
                .max(0)
        });
        let mut bytes = 0usize;
        let mut closed = Vec::new();
        for record in input.records() {
            bytes += record.data.len();
            closed.extend(self.windows.add(record));
        }
        // An empty batch: the shard is quiet and read to its tip.
        if input.records().is_empty() {
            closed.extend(self.windows.close_due(self.clock.now()));
        }
        let emitted = closed.len();
        if let Some(position) = closed.last().map(|(_, last)| last.clone()) {
            checkpoint(
                self.emit_and_commit(checkpointer, closed, Through::Record(position))
                    .await?,
            )?;
        }
        if input.records().is_empty() && emitted == 0 {
            return Ok(());
        }
        tracing::info!(
            shard = %checkpointer.shard_id(),
            records = input.records().len(),
            bytes,
            windows_emitted = emitted,
            processing_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            delay_ms = delay,
            millis_behind_latest = input.millis_behind_latest(),
            "batch"
        );
        Ok(())
    }

    async fn lease_lost(&mut self) {
        if let Some(records) = self.windows.discard() {
            tracing::info!(
                records,
                "lease lost: dropping the open window; its new owner recounts it"
            );
        }
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        let closed = self.windows.close(true).into_iter().collect();
        // SHARD_END: lets the child shards start.
        self.emit_and_commit(checkpointer, closed, Through::ShardEnd)
            .await??;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let closed = self.windows.close(false).into_iter().collect();
        checkpoint(
            self.emit_and_commit(checkpointer, closed, Through::Delivered)
                .await?,
        )
    }
}

/// A lost lease is not a processor failure: the worker notices and stops the shard.
fn checkpoint(result: Result<(), CommitFailed>) -> Result<(), BoxError> {
    match result {
        Ok(()) => Ok(()),
        Err(CommitFailed::Checkpoint(CheckpointError::LeaseLost { shard })) => {
            tracing::warn!(%shard, "checkpoint refused: lease lost");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
    use kcl_core::{Checkpoint, SequenceNumber, Worker, WorkerConfig};

    use super::*;

    fn record(seq: u64, key: &str, data: &str, at_ms: i64) -> Record {
        let sequence = SequenceNumber::parse(seq.to_string()).unwrap_or_else(|| panic!("digits"));
        let at = DateTime::from_timestamp_millis(at_ms).unwrap_or_else(|| panic!("time"));
        Record::new(sequence, key, data.to_owned()).with_approximate_arrival(at)
    }

    #[test]
    fn counts_per_key_and_closes_on_a_later_window() {
        let mut w = Windows::new(&ShardId::new("shardId-1"), Duration::from_secs(10), 2);
        assert!(w.add(&record(1, "a", "xx", 1_000)).is_none());
        assert!(w.add(&record(2, "b", "yyy", 2_000)).is_none());
        assert!(w.add(&record(3, "a", "z", 9_999)).is_none());
        assert!(w.add(&record(4, "c", "c", 9_000)).is_none());
        let (s, last) = w
            .add(&record(5, "a", "later", 10_000))
            .unwrap_or_else(|| panic!("window should close"));
        assert_eq!(last.sequence.as_str(), "4");
        assert_eq!(s.window_start.timestamp_millis(), 0);
        assert_eq!(s.window_end.timestamp_millis(), 10_000);
        assert!(s.complete);
        assert_eq!((s.records, s.bytes, s.distinct_keys), (4, 7, 3));
        assert_eq!(
            s.top_keys,
            vec![
                KeyCount {
                    key: "a".into(),
                    records: 2,
                    bytes: 3
                },
                KeyCount {
                    key: "b".into(),
                    records: 1,
                    bytes: 3
                },
            ]
        );
        // A straggler from an earlier window counts in the open one.
        assert!(w.add(&record(6, "a", "s", 5_000)).is_none());
        let (s, last) = w.close(false).unwrap_or_else(|| panic!("open window"));
        assert!(!s.complete);
        assert_eq!(s.window_start.timestamp_millis(), 10_000);
        assert_eq!((s.records, last.sequence.as_str()), (2, "6"));
        assert!(w.close(true).is_none());
        let line = serde_json::to_string(&s).unwrap_or_else(|e| panic!("{e}"));
        assert!(line.starts_with("{\"shard\":\"shardId-1\""), "{line}");
    }

    #[test]
    fn skipped_windows_do_not_emit_empty_lines() {
        let mut w = Windows::new(&ShardId::new("s"), Duration::from_secs(1), 5);
        assert!(w.add(&record(1, "a", "x", 500)).is_none());
        let (s, _) = w
            .add(&record(2, "a", "x", 60_000))
            .unwrap_or_else(|| panic!("closes"));
        assert_eq!(s.records, 1);
        assert_eq!(w.discard(), Some(1));
        assert!(w.close(true).is_none());
    }

    /// Collects the window lines.
    #[derive(Debug, Default)]
    pub(crate) struct Collect(pub(crate) Mutex<Vec<WindowSummary>>);

    impl WindowSink for Collect {
        fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(summary.clone());
            Ok(())
        }
    }

    /// A stream that goes quiet: its last window is emitted on time (an empty batch past
    /// its end), not at the next record or shutdown, and checkpointed at its last record.
    #[tokio::test(start_paused = true)]
    async fn the_last_window_of_a_quiet_stream_closes_on_time() {
        let stream = MemoryStream::new(1);
        let store = MemoryLeaseStore::new();
        let sink = Arc::new(Collect::default());
        let config = WorkerConfig::default()
            .idle_time_between_reads(Duration::from_millis(100))
            .empty_batch_interval(Some(Duration::from_millis(500)));
        let factory = {
            let sink = sink.clone();
            move |shard: &ShardId| {
                WindowCounter::new(shard, Duration::from_secs(10), 10, sink.clone())
            }
        };
        let worker = Worker::new("w", config, stream.clone(), store.clone(), factory)
            .unwrap_or_else(|e| panic!("{e}"));
        let shutdown = worker.shutdown_handle();
        let running = tokio::spawn(worker.run());
        for i in 0..5 {
            stream.put(&format!("key-{i}"), format!("record-{i}"));
        }
        // The window ends within 10 s; closing waits CLOSE_AFTER past its end.
        tokio::time::sleep(Duration::from_secs(10) + CLOSE_AFTER + Duration::from_secs(1)).await;
        let windows = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(
            windows.len(),
            1,
            "the quiet stream's window is out: {windows:?}"
        );
        assert!(windows[0].complete);
        assert_eq!(windows[0].records, 5);
        let last = stream
            .records(&ShardId::from("shardId-000000000000"))
            .last()
            .map(Record::position);
        let shard = ShardId::from("shardId-000000000000");
        let lease = store.leases().into_iter().find(|l| l.key == shard);
        let lease = lease.unwrap_or_else(|| panic!("no lease"));
        assert_eq!(
            lease.checkpoint,
            Checkpoint::Sequence(last.unwrap_or_else(|| panic!("no record")))
        );
        shutdown.shutdown();
        assert!(matches!(running.await, Ok(Ok(()))));
        let after = sink.0.lock().map(|v| v.len()).unwrap_or_default();
        assert_eq!(after, 1, "nothing left open at shutdown");
    }

    /// Through a real worker: windows close as time passes, every record is counted once,
    /// and shutdown emits the open window and checkpoints every shard to its last record.
    #[tokio::test(start_paused = true)]
    async fn windows_and_checkpoints_through_a_worker() {
        let stream = MemoryStream::new(2);
        let store = MemoryLeaseStore::new();
        let sink = Arc::new(Collect::default());
        let config = WorkerConfig::default()
            .failover_time(Duration::from_secs(3))
            .idle_time_between_reads(Duration::from_millis(100));
        let factory = {
            let sink = sink.clone();
            move |shard: &ShardId| {
                WindowCounter::new(shard, Duration::from_secs(1), 10, sink.clone())
            }
        };
        let worker = Worker::new("w", config, stream.clone(), store.clone(), factory)
            .unwrap_or_else(|e| panic!("{e}"));
        let shutdown = worker.shutdown_handle();
        let running = tokio::spawn(worker.run());
        let mut produced = 0u64;
        for i in 0..40 {
            stream.put(&format!("{}-key", i % 7), format!("record-{i}"));
            produced += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before_shutdown = sink.0.lock().map(|v| v.len()).unwrap_or_default();
        assert!(
            before_shutdown >= 4,
            "windows closed while running: {before_shutdown}"
        );
        shutdown.shutdown();
        match running.await {
            Ok(Ok(())) => {}
            other => panic!("worker ended with {other:?}"),
        }
        let windows = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
        let counted: u64 = windows.iter().map(|w| w.records).sum();
        assert_eq!(counted, produced, "each record counted exactly once");
        assert!(
            windows.iter().any(|w| !w.complete),
            "shutdown emits the open window"
        );
        for lease in store.leases() {
            let last = stream.records(&lease.key).last().map(Record::position);
            match (&lease.checkpoint, last) {
                (Checkpoint::Sequence(c), Some(last)) => assert_eq!(c, &last, "{}", lease.key),
                (Checkpoint::TrimHorizon, None) => {} // no record landed on this shard
                (c, last) => panic!("{}: checkpoint {c} for last record {last:?}", lease.key),
            }
            assert_eq!(lease.owner, None, "released at shutdown");
        }
    }
}
