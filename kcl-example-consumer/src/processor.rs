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
//! service, more than [`CLOSE_AFTER`] before it could be read) gets a line of its own.
//! Emission is at least once: a window emitted just before a crash, and not yet
//! checkpointed, is emitted again by the next owner. A graceful shutdown or handoff emits the
//! open window early, marked `"complete": false`, and checkpoints everything, so nothing is
//! counted twice.
//!
//! A call of `process_records` that fails changes nothing: under a failure policy other than
//! `block` its records come back to this same processor (see [`crate::window`]), so what it
//! counted is taken out again and the window it closed put back open.
//!
//! With a [`WindowTable`] ([`WindowCounter::with_table`], the binary's
//! `--exactly-once-table`), each closed window's counts are also committed in the same
//! transaction as the checkpoint at its last record: the table holds every window's count
//! exactly once, whatever crashes, freezes, handoffs and failed calls happen (see
//! [`crate::table`]). On opening a shard it compares the lease's checkpoint with the table's
//! position of the shard, reports records checkpointed without their windows
//! ([`crate::table::step`]), and resumes from the later of the two: records at or before
//! the table's position (a lease moved back) are counted already, and skipped (said once at
//! WARN). After a failed commit it reads the position back, since a commit
//! whose answer was lost may have applied.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, InitializationInput, ProcessRecordsInput, Record,
    RecordProcessor, ShardId,
};

use crate::resume::Replay;
use crate::table::{Closed, CommitFailed, Committed, Through, WindowTable};
pub use crate::window::{CLOSE_AFTER, KeyCount, WindowSummary, Windows};

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

/// The [`RecordProcessor`]: [`Windows`] plus a [`WindowSink`] plus checkpoints, and with a
/// [`WindowTable`] each window's counts committed with its checkpoint, exactly once.
#[derive(Debug)]
pub struct WindowCounter<S> {
    windows: Windows,
    sink: S,
    clock: Clock,
    table: Option<Arc<dyn WindowTable>>,
    /// What the lease and the table hold, as opened and then committed.
    committed: Committed,
    /// Records delivered again after the lease was moved back behind the table's position.
    replay: Option<Replay>,
    /// A commit failed and its outcome could not be read back: read it before the next call.
    unsettled: bool,
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
            committed: Committed::new(kcl_core::Checkpoint::TrimHorizon),
            replay: None,
            unsettled: false,
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
    /// checkpoint when there is a table. The outer error: nothing was written.
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
            .commit(checkpointer, closed, &mut self.committed, through)
            .await)
    }

    /// The records of `input` not counted in the table already, the others counted as such.
    fn fresh<'r>(&mut self, records: &'r [Record]) -> Vec<&'r Record> {
        // A batch is in order: what the table counts is a prefix of it.
        let skipped = records.partition_point(|r| self.committed.covers(&r.position()));
        let kept: Vec<&Record> = records[skipped..].iter().collect();
        if skipped > 0
            && let Some(table) = &self.table
        {
            table.mismatches().already_counted(skipped as u64);
        }
        if let Some(replay) = &mut self.replay {
            replay.skipped(&records[..skipped]);
        }
        if !kept.is_empty()
            && let Some(replay) = self.replay.take()
        {
            replay.done("the records after it are counted from here");
        }
        kept
    }

    /// Counts `records` (an empty batch: the shard is quiet) and commits the windows they
    /// close; how many. On an error nothing changed: see [`Self::undo`].
    async fn count(
        &mut self,
        records: &[&Record],
        quiet: bool,
        checkpointer: &mut Checkpointer,
    ) -> Result<usize, BoxError> {
        let before = self.committed.clone();
        self.windows.begin();
        let mut closed = Vec::new();
        for record in records {
            closed.extend(self.windows.add(record));
        }
        if quiet {
            closed.extend(self.windows.close_due(self.clock.now()));
        }
        let emitted = closed.len();
        if let Some(position) = closed.last().map(|(_, last)| last.clone()) {
            let through = Through::Record(position);
            let outcome = match self.emit_and_commit(checkpointer, closed, through).await {
                Ok(committed) => checkpoint(committed).map_err(|e| (e, true)),
                Err(error) => Err((error, false)),
            };
            if let Err((error, tried)) = outcome {
                self.undo(before, records, tried.then_some(checkpointer.shard_id()))
                    .await;
                return Err(error);
            }
        }
        self.windows.settle();
        Ok(emitted)
    }

    /// A call failed: back to `before`, as if it had not happened. When a commit was tried
    /// (`shard`), the table's position says what applied all the same: the parts before the
    /// one that failed, or a commit whose answer was lost. Read back now, or before the next
    /// call if the read fails too.
    async fn undo(&mut self, before: Committed, counted: &[&Record], shard: Option<&ShardId>) {
        self.windows.rollback(counted.iter().copied());
        self.committed = before;
        if let Some(shard) = shard
            && self.table.is_some()
            && let Err(error) = self.settle(shard).await
        {
            tracing::warn!(
                %shard,
                error = format!("{error:#}"),
                "a commit failed and the table's position cannot be read: read again first \
                 at the next batch"
            );
            self.unsettled = true;
        }
    }

    /// Reads the table's position of `shard`: further on than what this processor knows,
    /// a commit it saw fail applied after all, and what it counted up to there is in the
    /// table (the records after it are delivered again: the failed ones).
    async fn settle(&mut self, shard: &ShardId) -> Result<(), BoxError> {
        let Some(table) = &self.table else {
            return Ok(());
        };
        // The table's store, not the record: no record is given up for it (`Outage`).
        let position = (table.position(shard).await).map_err(kcl_core::failure::Outage::new)?;
        self.unsettled = false;
        if let Some(position) = position
            && crate::table::further(&position, &self.committed.counted)
        {
            let dropped = self.windows.forget();
            tracing::info!(
                %shard,
                %position,
                was = %self.committed.counted,
                dropped,
                "a commit that failed applied after all: the table counts up to its position"
            );
            self.committed = Committed::new(position);
        }
        Ok(())
    }

    /// Says what a replay skipped, if one is under way as the processor stops.
    fn stopping(&mut self) {
        if let Some(replay) = self.replay.take() {
            replay.done("the processor stops before the records after it");
        }
    }
}

impl<S: WindowSink> RecordProcessor for WindowCounter<S> {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.committed = Committed::new(input.checkpoint.clone());
        if let Some(table) = &self.table
            && let Some(position) = table.open(&input.shard_id, &input.checkpoint).await?
        {
            // The lease was moved back: resume after what the table counts.
            self.replay = Some(Replay::new(
                &input.shard_id,
                table.name(),
                &input.checkpoint,
                &position,
            ));
            self.committed.counted = position;
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let started = Instant::now();
        if self.unsettled {
            self.settle(checkpointer.shard_id()).await?;
        }
        let delay = input.records().first().map(|r| {
            (self.clock.now() - r.approximate_arrival)
                .num_milliseconds()
                .max(0)
        });
        let records = self.fresh(input.records());
        let bytes: usize = records.iter().map(|r| r.data.len()).sum();
        let quiet = input.records().is_empty();
        let emitted = self.count(&records, quiet, checkpointer).await?;
        if records.is_empty() && emitted == 0 {
            return Ok(());
        }
        tracing::info!(
            shard = %checkpointer.shard_id(),
            records = records.len(),
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
        self.stopping();
        if let Some(records) = self.windows.discard() {
            tracing::info!(
                records,
                "lease lost: dropping the open window; its new owner recounts it"
            );
        }
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.stopping();
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
        self.stopping();
        let closed = self.windows.close(false).into_iter().collect();
        checkpoint(
            self.emit_and_commit(checkpointer, closed, Through::Delivered)
                .await?,
        )
    }
}

/// A lost lease is not a processor failure: the worker notices and stops the shard. A table
/// at fault (gone, another application's) is no record's fault either: an outage, for which
/// the failure policy gives no record up (as for the store's own errors, which say so).
fn checkpoint(result: Result<(), CommitFailed>) -> Result<(), BoxError> {
    match result {
        Ok(()) => Ok(()),
        Err(CommitFailed::Checkpoint(CheckpointError::LeaseLost { shard })) => {
            tracing::warn!(%shard, "checkpoint refused: lease lost");
            Ok(())
        }
        Err(e @ CommitFailed::Table { .. }) => Err(kcl_core::failure::Outage::new(e).into()),
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
