//! The outage rule against the paths around it (found by reading the code): lone poison
//! records a batch processor names, successes taken to acknowledge later, parked keys during an
//! outage, and `skip` with parked keys through a factory the worker cannot check at build.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::failure::{BatchFailed, DeadLetters, FailurePolicy, Reason};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, Parallel, ProblemKind, ProcessRecordsInput, Record,
    RecordProcessor, ShardId, Worker, WorkerConfig,
};

const SHARD: &str = "shardId-000000000000";

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
}

fn passed(store: &MemoryLeaseStore, record: &Record) -> bool {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    matches!(lease.map(|l| l.checkpoint), Some(Checkpoint::Sequence(at)) if at >= record.position())
}

fn data(record: &Record) -> String {
    String::from_utf8_lossy(&record.data).into_owned()
}

/// A batch processor that names the failing record (`BatchFailed::at`) and checkpoints
/// batches that succeed.
struct Naming;

impl RecordProcessor for Naming {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        match input.records().iter().position(|r| data(r) == "poison") {
            None => Ok(checkpointer.checkpoint().await?),
            Some(i) => Err(BatchFailed::at(&input.records()[i], "bad payload").into()),
        }
    }
}

/// Lone poison records among good ones (one in four), each named by the processor: by
/// docs/when-a-record-fails.md "a lone poison record among good ones never adds up", so all
/// of them are dead-lettered and the shard goes on.
#[tokio::test(start_paused = true)]
async fn named_lone_poison_records_never_add_up_to_an_outage() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    // The last record is a good one: the processor checkpoints only batches that succeed.
    let records: Vec<Record> = (0..41)
        .map(|i| {
            let d = if i % 4 == 3 {
                "poison".to_owned()
            } else {
                i.to_string()
            };
            stream.put(&format!("key-{i}"), d)
        })
        .collect();
    let policy = FailurePolicy::dead_letter(1)
        .backoff(Duration::from_millis(100), Duration::from_millis(200))
        .outage_after(Some(3));
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config().max_records(100).failure(policy))
        .dead_letters(DeadLetters::new(sink.clone()).stream("orders"))
        .build(|_: &ShardId| Naming)
        .unwrap();
    let status = worker.status();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let done = wait_until(Duration::from_secs(120), || {
        passed(&store, records.last().unwrap())
    })
    .await;
    let failing = status
        .borrow()
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::Failing && p.key == SHARD);
    let letters = sink.letters().len();
    shutdown.shutdown();
    let _ = task.await;
    assert!(
        done.is_some(),
        "the shard never passed its last record: {letters} letter(s) of 10 poison records, \
         failing = {failing} (a false outage: the good records between the named poison \
         records never reset the run)"
    );
    assert_eq!(letters, 10);
}

/// Parked keys during an outage: the keys its first failures park stay parked (at most
/// `outage_after` of them), their later records dead-lettered behind them as parking promises;
/// the shard is reported failing once the run is reached, and every other key's records wait,
/// then run once it ends.
#[tokio::test(start_paused = true)]
async fn an_outage_under_parked_keys_parks_no_more_keys_than_its_run() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records: Vec<Record> = (0..80)
        .map(|i| stream.put(&format!("key-{}", i % 20), i.to_string()))
        .collect();
    let down = Arc::new(AtomicBool::new(true));
    let handled = Arc::new(Mutex::new(Vec::new()));
    let (is_down, seen) = (down.clone(), handled.clone());
    let handler = move |record: Record| {
        let (is_down, seen) = (is_down.clone(), seen.clone());
        async move {
            if is_down.load(Ordering::SeqCst) {
                return Err::<(), BoxError>("connection refused".into());
            }
            seen.lock().unwrap().push(record.partition_key.clone());
            Ok(())
        }
    };
    let policy = FailurePolicy::dead_letter(1)
        .backoff(Duration::from_millis(100), Duration::from_millis(200))
        .outage_after(Some(5));
    let factory = Parallel::new(handler)
        .max_in_flight(4)
        .on_failure(policy)
        .park_keys(true);
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config())
        .dead_letters(DeadLetters::new(sink.clone()).stream("orders"))
        .build_with(factory)
        .unwrap();
    let status = worker.status();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let failing = status
        .borrow()
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::Failing && p.key == SHARD);
    assert!(failing, "the outage is reported");
    let letters = sink.letters();
    let parked_keys: std::collections::BTreeSet<String> = letters
        .iter()
        .map(|l| l.record.partition_key.clone())
        .collect();
    assert!(
        parked_keys.len() <= 5,
        "{} keys parked, more than outage_after = 5",
        parked_keys.len()
    );
    let failed = letters
        .iter()
        .filter(|l| l.reason == Reason::Attempts)
        .count();
    assert!(failed <= 5, "{failed} records given up for failing");
    down.store(false, Ordering::SeqCst);
    let done = wait_until(Duration::from_secs(60), || {
        passed(&store, records.last().unwrap())
    })
    .await;
    shutdown.shutdown();
    let _ = task.await;
    assert!(done.is_some(), "every record passed after the outage");
    // Every record of a key that was never parked ran after the outage.
    let ran = handled.lock().unwrap().clone();
    for i in 0..20 {
        let key = format!("key-{i}");
        if !parked_keys.contains(&key) {
            assert_eq!(
                ran.iter().filter(|k| **k == key).count(),
                4,
                "{key} ran whole"
            );
        }
    }
    let letters = sink.letters();
    assert!(
        letters
            .iter()
            .all(|l| parked_keys.contains(&l.record.partition_key)),
        "only parked keys' records were dead-lettered"
    );
}

/// A batch processor that takes good batches to acknowledge later (and acknowledges at once),
/// and fails a batch with a poison record in its hook, naming it.
struct AckLater;

impl RecordProcessor for AckLater {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if let Some(i) = input.records().iter().position(|r| data(r) == "poison") {
            return Err(BatchFailed::at(&input.records()[i], "bad payload").into());
        }
        for (_, ack) in input.acknowledge_later() {
            ack.done();
        }
        Ok(())
    }
}

/// One poison record in eight, batches of one record: the good ones between succeed (taken to
/// acknowledge later), yet the run is never reset.
#[tokio::test(start_paused = true)]
async fn ack_later_successes_reset_the_outage_run() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records: Vec<Record> = (0..40)
        .map(|i| {
            let d = if i % 8 == 7 {
                "poison".to_owned()
            } else {
                i.to_string()
            };
            stream.put(&format!("key-{i}"), d)
        })
        .collect();
    let policy = FailurePolicy::dead_letter(1)
        .backoff(Duration::from_millis(100), Duration::from_millis(200))
        .outage_after(Some(3));
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config().max_records(1).failure(policy))
        .dead_letters(DeadLetters::new(sink.clone()).stream("orders"))
        .build(|_: &ShardId| AckLater)
        .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let done = wait_until(Duration::from_secs(120), || {
        passed(&store, records.last().unwrap())
    })
    .await;
    let letters = sink.letters().len();
    shutdown.shutdown();
    let _ = task.await;
    assert!(
        done.is_some(),
        "the shard never passed its last record: {letters} letter(s) of 5 poison records"
    );
}

/// `skip` with `park_keys` through a closure factory (as a multi-stream worker uses it,
/// `StreamFactories::stream(id, move |shard| parallel.create(shard))`), which the worker cannot
/// check when it is built: the processor refuses to start, the shard is reported failing, and
/// no record is skipped unseen.
#[tokio::test(start_paused = true)]
async fn skip_with_parked_keys_is_refused_through_a_closure_factory_too() {
    use kcl_core::ProcessorFactory as _;
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    for i in 0..20 {
        let d = if i == 4 {
            "poison".to_owned()
        } else {
            i.to_string()
        };
        stream.put(&format!("key-{}", i % 4), d);
    }
    let handled = Arc::new(Mutex::new(0usize));
    let seen = handled.clone();
    let handler = move |record: Record| {
        let seen = seen.clone();
        async move {
            if data(&record) == "poison" {
                return Err::<(), BoxError>("bad".into());
            }
            *seen.lock().unwrap() += 1;
            Ok(())
        }
    };
    let parallel = Parallel::new(handler)
        .on_failure(FailurePolicy::skip(1))
        .park_keys(true);
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config())
        .dead_letters(DeadLetters::new(sink.clone()))
        .build(move |shard: &ShardId| parallel.create(shard))
        .unwrap();
    let status = worker.status();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let failing = || {
        status.borrow().problems.iter().any(|p| {
            p.kind == ProblemKind::Failing && p.key == SHARD && p.detail.contains("park_keys")
        })
    };
    let seen = wait_until(Duration::from_secs(120), failing).await;
    shutdown.shutdown();
    let _ = task.await;
    assert!(
        seen.is_some(),
        "the refusal is reported: {:?}",
        status.borrow().problems
    );
    assert_eq!(
        *handled.lock().unwrap(),
        0,
        "nothing ran, so nothing was skipped"
    );
    assert!(
        store
            .leases()
            .iter()
            .all(|l| l.checkpoint == Checkpoint::TrimHorizon)
    );
}
