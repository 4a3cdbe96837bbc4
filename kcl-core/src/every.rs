//! A ready-made processor: a record handler, checkpointed every N records or every T.

use std::time::Duration;

use tokio::time::Instant;

use crate::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor};

/// Wraps a record handler `F` and checkpoints after `every` records or `within` time since
/// the first record not yet checkpointed, whichever comes first — on a quiet shard too.
///
/// A processor that checkpoints only inside `process_records` cannot act on time alone if no
/// batch arrives: set [`WorkerConfig::empty_batch_interval`](crate::WorkerConfig::empty_batch_interval)
/// and the worker calls it with an empty batch while the shard is quiet.
/// `shutdown_requested` checkpoints what was delivered, so a graceful shutdown or a handoff
/// repeats nothing.
///
/// ```
/// use std::time::Duration;
/// use kcl_core::{EveryNOrT, ShardId};
///
/// let factory = |_: &ShardId| {
///     EveryNOrT::new(1000, Duration::from_secs(5), |record: &kcl_core::Record| {
///         println!("{}", String::from_utf8_lossy(&record.data));
///     })
/// };
/// # let _ = factory;
/// ```
#[derive(Debug)]
pub struct EveryNOrT<F> {
    handle: F,
    every: usize,
    within: Duration,
    /// Records delivered since the last checkpoint, and when the first of them came.
    pending: usize,
    since: Option<Instant>,
}

impl<F: FnMut(&crate::Record) + Send + 'static> EveryNOrT<F> {
    /// Checkpoints after `every` records or `within` time, calling `handle` on each record.
    pub fn new(every: usize, within: Duration, handle: F) -> Self {
        Self {
            handle,
            every,
            within,
            pending: 0,
            since: None,
        }
    }
}

impl<F: FnMut(&crate::Record) + Send + 'static> RecordProcessor for EveryNOrT<F> {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            (self.handle)(record);
        }
        if !input.records().is_empty() {
            self.pending += input.records().len();
            self.since.get_or_insert_with(Instant::now);
        }
        let due =
            self.pending >= self.every || self.since.is_some_and(|at| at.elapsed() >= self.within);
        if due && self.pending > 0 {
            checkpointer.checkpoint().await?;
            self.pending = 0;
            self.since = None;
        }
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

#[cfg(all(test, feature = "test-util"))]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use crate::memory::{MemoryLeaseStore, MemoryStream};
    use crate::{Checkpoint, LeaseStore, ShardId, Worker, WorkerConfig};

    use super::*;

    /// 10 records, then silence: below N, so only time can make the checkpoint, and it does
    /// within T plus one empty-batch interval.
    async fn quiet_shard(empty_batch_interval: Option<Duration>) -> Option<Duration> {
        let stream = MemoryStream::new(1);
        let records: Vec<_> = (0..10).map(|i| stream.put("k", format!("r{i}"))).collect();
        let last = records.last().unwrap().clone();
        let store = MemoryLeaseStore::new();
        let config = WorkerConfig::default().empty_batch_interval(empty_batch_interval);
        let worker = Worker::builder(stream, store.clone())
            .id("w")
            .config(config)
            .build(|_| EveryNOrT::new(1000, Duration::from_secs(5), |_| {}))
            .unwrap();
        let stop = worker.shutdown_handle();
        let task = tokio::spawn(worker.run());
        let shard = ShardId::new("shardId-000000000000");
        let start = Instant::now();
        let mut took = None;
        while start.elapsed() < Duration::from_secs(30) {
            let lease = store.get(&shard).await.ok().flatten();
            if lease.is_some_and(|l| l.checkpoint == Checkpoint::Sequence(last.position())) {
                took = Some(start.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.shutdown();
        task.await.unwrap().unwrap();
        took
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_shard_is_checkpointed_within_t() {
        let took = quiet_shard(Some(Duration::from_secs(1))).await;
        // T (5 s) after the first record, plus at most one empty-batch interval, plus start-up.
        assert!(
            took.is_some_and(|t| t <= Duration::from_secs(7)),
            "checkpoint after {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_empty_batches_time_alone_cannot_checkpoint() {
        assert_eq!(quiet_shard(None).await, None);
    }
}
