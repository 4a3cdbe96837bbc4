//! Asynchronous acknowledgement as users hold it, beyond the pattern its docs show: batches
//! handed to other tasks and acknowledged there late and out of delivery order,
//! acknowledgements kept across hooks while the processor checkpoints, `checkpoint_at` while
//! acknowledgements are outstanding, and a stuck record with every other key flowing (what
//! stays in memory). Holding the batch itself past its hook does not compile (the
//! `compile_fail` examples of `ProcessRecordsInput`). Paused time, in-memory backends.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, ExtendedSequenceNumber, Parallel,
    ProcessRecordsInput, Record, RecordProcessor, ShardId, ShutdownHandle, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio::time::sleep;

const SHARD: &str = "shardId-000000000000";

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(100))
        .ack_checkpoint_every(1)
        .ack_checkpoint_interval(Duration::from_millis(100))
        .max_records(10)
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

fn run<F: kcl_core::ProcessorFactory>(
    config: WorkerConfig,
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    factory: F,
) -> Running {
    let w = Worker::new("a", config, stream.client("a"), store.client("a"), factory).unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        task: tokio::spawn(w.run()),
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

fn checkpoint(store: &MemoryLeaseStore) -> Option<ExtendedSequenceNumber> {
    let lease = store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == SHARD)?;
    match lease.checkpoint {
        Checkpoint::Sequence(s) => Some(s),
        _ => None,
    }
}

/// Records finished, by position.
type Finished = Arc<Mutex<BTreeSet<ExtendedSequenceNumber>>>;

/// Samples the lease's checkpoint every 10 ms until `done`, collecting every delivered
/// position at or before it that was not finished when it was seen.
async fn watch_checkpoints(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    finished: &Finished,
    done: impl Fn() -> bool,
) -> BTreeSet<ExtendedSequenceNumber> {
    let records: Vec<ExtendedSequenceNumber> = stream
        .records(&ShardId::new(SHARD))
        .iter()
        .map(Record::position)
        .collect();
    let mut passed = BTreeSet::new();
    for _ in 0..6_000 {
        if let Some(at) = checkpoint(store) {
            let finished = finished.lock().unwrap();
            passed.extend(
                records
                    .iter()
                    .filter(|p| **p <= at && !finished.contains(p))
                    .cloned(),
            );
        }
        if done() {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    passed
}

/// Takes each batch to acknowledge later and hands it to a task of its own that finishes it
/// later: odd batches after 50 ms, even ones after 750 ms, so acknowledgements come out of
/// delivery order. (Handing the batch itself to the task does not compile: see
/// `ProcessRecordsInput`.)
#[derive(Clone, Default)]
struct HandsBatchesOn {
    finished: Finished,
    batches: Arc<AtomicUsize>,
}

impl RecordProcessor for HandsBatchesOn {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let n = self.batches.fetch_add(1, Ordering::SeqCst);
        let finished = self.finished.clone();
        let pairs = input.acknowledge_later();
        tokio::spawn(async move {
            let delay = if n.is_multiple_of(2) { 750 } else { 50 };
            sleep(Duration::from_millis(delay)).await;
            for (record, ack) in pairs {
                finished.lock().unwrap().insert(record.position());
                ack.done();
            }
        });
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn acknowledged_later_from_other_tasks_out_of_order_no_checkpoint_passes_a_record() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..400 {
        stream.put(&format!("k{}", i % 7), format!("{i}"));
    }
    let processor = HandsBatchesOn::default();
    let p = processor.clone();
    let w = run(config(), &stream, &store, move |_: &ShardId| p.clone());
    let finished = processor.finished.clone();
    let passed = watch_checkpoints(&stream, &store, &finished, || {
        finished.lock().unwrap().len() == 400
    })
    .await;
    assert!(
        passed.is_empty(),
        "{} of 400 records were checkpointed past before they finished, e.g. {:?}",
        passed.len(),
        passed.first()
    );
    assert_eq!(finished.lock().unwrap().len(), 400, "every record finished");
    sleep(Duration::from_secs(2)).await;
    let last = stream
        .records(&ShardId::new(SHARD))
        .last()
        .unwrap()
        .position();
    assert_eq!(
        checkpoint(&store),
        Some(last),
        "the worker checkpointed them all"
    );
    w.stop().await;
}

/// Keeps each batch's acknowledgements until the next hook, where it first checkpoints
/// (`checkpoint()`, inside the hook) and then finishes the kept batch: the checkpoint must
/// stop before the kept batch.
#[derive(Clone, Default)]
struct KeepsOneBatch {
    kept: Arc<Mutex<Vec<(Record, kcl_core::ack::Ack)>>>,
    results: Arc<Mutex<Vec<Result<(), String>>>>,
    finished: Finished,
}

impl RecordProcessor for KeepsOneBatch {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let previous =
            std::mem::replace(&mut *self.kept.lock().unwrap(), input.acknowledge_later());
        let result = checkpointer.checkpoint().await;
        self.results
            .lock()
            .unwrap()
            .push(result.map_err(|e| e.to_string()));
        for (record, ack) in previous {
            self.finished.lock().unwrap().insert(record.position());
            ack.done();
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_in_a_hook_stops_before_records_still_acknowledged_later() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..40 {
        stream.put("k", format!("{i}"));
    }
    let processor = KeepsOneBatch::default();
    let p = processor.clone();
    let w = run(config(), &stream, &store, move |_: &ShardId| p.clone());
    let finished = processor.finished.clone();
    let passed = watch_checkpoints(&stream, &store, &finished, || {
        finished.lock().unwrap().len() == 30
    })
    .await;
    assert!(
        passed.is_empty(),
        "checkpointed past {} records still acknowledged later, e.g. {:?}",
        passed.len(),
        passed.first()
    );
    sleep(Duration::from_secs(1)).await;
    let records = stream.records(&ShardId::new(SHARD));
    assert_eq!(
        checkpoint(&store),
        Some(records[29].position()),
        "the worker's own checkpoint covers the three finished batches, not the kept one"
    );
    assert!(
        processor.results.lock().unwrap().iter().all(Result::is_ok),
        "checkpoint() stops at the kept batch rather than failing"
    );
    w.stop().await;
}

/// Takes every batch to acknowledge later, and in the next hook asks `checkpoint_at` the
/// last record delivered while the previous batch is still outstanding.
#[derive(Clone, Default)]
struct CheckpointsAtTheEnd {
    held: Arc<Mutex<Vec<kcl_core::ack::Ack>>>,
    refused: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

impl RecordProcessor for CheckpointsAtTheEnd {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let last = input.records().last().map(Record::position);
        let pairs = input.acknowledge_later();
        let older: Vec<_> = std::mem::take(&mut *self.held.lock().unwrap());
        self.held
            .lock()
            .unwrap()
            .extend(pairs.into_iter().map(|(_, ack)| ack));
        if let Some(last) = last {
            match checkpointer.checkpoint_at(last).await {
                Err(CheckpointError::Unfinished { .. }) => {
                    self.refused.fetch_add(1, Ordering::SeqCst)
                }
                Ok(()) => self.accepted.fetch_add(1, Ordering::SeqCst),
                Err(e) => return Err(e.into()),
            };
        }
        for ack in older {
            ack.done();
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn checkpoint_at_past_an_outstanding_acknowledgement_is_refused() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..50 {
        stream.put("k", format!("{i}"));
    }
    let processor = CheckpointsAtTheEnd::default();
    let p = processor.clone();
    let w = run(config(), &stream, &store, move |_: &ShardId| p.clone());
    sleep(Duration::from_secs(5)).await;
    assert_eq!(processor.refused.load(Ordering::SeqCst), 5, "every batch");
    assert_eq!(processor.accepted.load(Ordering::SeqCst), 0);
    let records = stream.records(&ShardId::new(SHARD));
    assert_eq!(
        checkpoint(&store),
        Some(records[39].position()),
        "the worker's own checkpoint stops at the last batch, still outstanding"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stuck_record_bounds_what_is_held_behind_the_watermark() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..3_000 {
        stream.put(&format!("k{}", i % 20), format!("{i}"));
    }
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let factory = Parallel::new(move |record: Record| {
        let handled = h.clone();
        async move {
            if record.data.as_ref() == b"0" {
                std::future::pending::<()>().await; // stuck forever, its key with it
            }
            handled.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        }
    })
    .max_in_flight(8);
    let config = config().max_records(100).max_unacknowledged(100);
    let w = run(config, &stream, &store, factory);
    sleep(Duration::from_secs(60)).await;
    let handled = handled.load(Ordering::SeqCst);
    // At most max_unacknowledged records are held behind the stuck one, plus the batch that
    // crossed the bound.
    assert!(
        handled <= 200,
        "{handled} records handled behind a stuck one, with max_unacknowledged = 100"
    );
    assert!(
        handled >= 50,
        "other keys flowed until the bound: {handled}"
    );
    w.stop().await;
}
