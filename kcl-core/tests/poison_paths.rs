//! The failure policy on the paths around the handler's future: a handler or a `key_by` that
//! panics before any future runs, a parked key matched by position after a crash, an outage
//! that fails every record, a sink that cannot work, and settings that would lose records.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::failure::{DeadLetter, DeadLetterSink, DeadLetters, FailurePolicy, Reason};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BackendError, BoxError, Checkpoint, ErrorKind, Lease, Parallel, ProblemKind, ProcessorFactory,
    Record, ShardId, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;

const SHARD: &str = "shardId-000000000000";

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
}

type Task = JoinHandle<Result<(), kcl_core::Error>>;

fn start<F: ProcessorFactory>(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    sink: impl DeadLetterSink,
    factory: F,
) -> (Worker<MemoryStream, MemoryLeaseStore, F>, DeadLetters) {
    let letters = DeadLetters::new(sink).stream("orders");
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config())
        .dead_letters(letters.clone())
        .build_with(factory)
        .unwrap();
    (worker, letters)
}

fn run<F: ProcessorFactory>(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    sink: &MemorySink,
    factory: F,
) -> (
    Task,
    kcl_core::ShutdownHandle,
    tokio::sync::watch::Receiver<kcl_core::Status>,
) {
    let (worker, _) = start(stream, store, sink.clone(), factory);
    let handle = worker.shutdown_handle();
    let status = worker.status();
    (tokio::spawn(worker.run()), handle, status)
}

fn passed(store: &MemoryLeaseStore, record: &Record) -> bool {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    matches!(lease.map(|l| l.checkpoint), Some(Checkpoint::Sequence(at)) if at >= record.position())
}

async fn until_passed(store: &MemoryLeaseStore, record: &Record) {
    let done = wait_until(Duration::from_secs(60), || passed(store, record)).await;
    assert!(
        done.is_some(),
        "the checkpoint never passed {}",
        record.position()
    );
}

/// Records 0..n, data `i` (or `poison` at `at`), key `key-{i % keys}`.
fn fill(stream: &MemoryStream, n: usize, keys: usize, at: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let data = if i == at {
                "poison".to_owned()
            } else {
                i.to_string()
            };
            stream.put(&format!("key-{}", i % keys), data)
        })
        .collect()
}

fn data(record: &Record) -> String {
    String::from_utf8_lossy(&record.data).into_owned()
}

type Handled = Arc<Mutex<Vec<String>>>;

#[tokio::test(start_paused = true)]
async fn a_handler_that_panics_before_its_future_fails_only_that_record() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records = fill(&stream, 60, 6, 20);
    let handled = Handled::default();
    let seen = handled.clone();
    // The parse runs before the `async` block: its panic is not inside the future.
    let handler = move |record: Record| {
        let text = data(&record);
        assert!(text != "poison", "cannot parse {text}");
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(text);
            Ok::<(), BoxError>(())
        }
    };
    let policy =
        FailurePolicy::dead_letter(2).backoff(Duration::from_millis(100), Duration::from_secs(1));
    let factory = Parallel::new(handler).max_in_flight(4).on_failure(policy);
    let (task, shutdown, _) = run(&stream, &store, &sink, factory);
    until_passed(&store, records.last().unwrap()).await;
    let letters = sink.letters();
    assert_eq!(letters.len(), 1, "the poison record alone is dead-lettered");
    assert_eq!(letters[0].record, records[20]);
    assert_eq!(letters[0].attempts, 2);
    assert!(
        letters[0].last_error.contains("cannot parse"),
        "{}",
        letters[0].last_error
    );
    assert_eq!(
        handled.lock().unwrap().len(),
        59,
        "every other record was handled"
    );
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_key_by_that_panics_fails_only_that_record_as_permanent() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records = fill(&stream, 60, 6, 33);
    let handled = Handled::default();
    let seen = handled.clone();
    let handler = move |record: Record| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(data(&record));
            Ok::<(), BoxError>(())
        }
    };
    let factory = Parallel::new(handler)
        .on_failure(FailurePolicy::dead_letter(3))
        .park_keys(true)
        .key_by(|record: &Record| {
            let text = data(record);
            assert!(text != "poison", "malformed record");
            record.partition_key.clone()
        });
    let (task, shutdown, _) = run(&stream, &store, &sink, factory);
    until_passed(&store, records.last().unwrap()).await;
    let letters = sink.letters();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].record, records[33]);
    assert_eq!(
        letters[0].reason,
        Reason::Permanent,
        "no retry can change a key"
    );
    assert!(
        letters[0].last_error.contains("key_by panicked"),
        "{}",
        letters[0].last_error
    );
    assert_eq!(
        letters[0].parked_key, None,
        "a record without a key parks nothing"
    );
    assert_eq!(handled.lock().unwrap().len(), 59);
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[test]
fn skipping_with_parked_keys_is_refused_at_build_naming_both() {
    let factory = Parallel::new(|_: Record| async { Ok::<(), BoxError>(()) })
        .on_failure(FailurePolicy::skip(3))
        .park_keys(true);
    let built = Worker::builder(MemoryStream::new(1), MemoryLeaseStore::new()).build_with(factory);
    let Err(error) = built else {
        panic!("skip with parked keys was accepted");
    };
    let error = error.to_string();
    assert!(error.contains("Parallel::park_keys"), "{error}");
    assert!(error.contains("FailurePolicy::skip"), "{error}");
}

/// The lease row's entry for partition key `key` parked behind `behind` (docs/lease-table.md).
fn entry(key: &str, behind: &Record) -> String {
    let mut h = DefaultHasher::new();
    key.to_owned().hash(&mut h);
    format!(
        "{:016x}/{}/{}",
        h.finish(),
        behind.sequence_number,
        behind.sub_sequence_number
    )
}

#[tokio::test(start_paused = true)]
async fn after_a_crash_a_parked_key_parks_only_records_after_its_record() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    // key-3 holds records 3 (good), 9 (poison) and 15.
    let records = fill(&stream, 18, 6, 9);
    // A row as a crash left it: the key parked behind record 9, the checkpoint at record 1.
    let mut lease = Lease::new(
        ShardId::new(SHARD),
        Checkpoint::Sequence(records[1].position()),
    );
    lease.parked_keys = vec![entry("key-3", &records[9])];
    store.insert(lease);
    let handled = Handled::default();
    let seen = handled.clone();
    let handler = move |record: Record| {
        let seen = seen.clone();
        async move {
            let text = data(&record);
            seen.lock().unwrap().push(text.clone());
            if text == "poison" {
                return Err::<(), BoxError>(kcl_core::failure::Permanent::new("bad").into());
            }
            Ok(())
        }
    };
    let factory = Parallel::new(handler)
        .on_failure(FailurePolicy::dead_letter(3))
        .park_keys(true);
    let (task, shutdown, _) = run(&stream, &store, &sink, factory);
    until_passed(&store, records.last().unwrap()).await;
    let handled = handled.lock().unwrap().clone();
    assert!(
        handled.contains(&"3".to_owned()),
        "record 3 came before the parking one: {handled:?}"
    );
    let letters: Vec<(String, Reason)> = sink
        .letters()
        .iter()
        .map(|l| (data(&l.record), l.reason.clone()))
        .collect();
    let behind = records[9].position();
    assert_eq!(
        letters,
        [
            ("poison".to_owned(), Reason::Permanent),
            ("15".to_owned(), Reason::Parked { behind }),
        ],
        "the poison record runs (it is not parked behind itself), the later one is parked"
    );
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_outage_dead_letters_no_more_than_its_run_then_blocks_until_it_ends() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records = fill(&stream, 40, 8, usize::MAX);
    let down = Arc::new(AtomicBool::new(true));
    let handled = Handled::default();
    let (is_down, seen) = (down.clone(), handled.clone());
    let handler = move |record: Record| {
        let (is_down, seen) = (is_down.clone(), seen.clone());
        async move {
            if is_down.load(Ordering::SeqCst) {
                return Err::<(), BoxError>("connection refused".into());
            }
            seen.lock().unwrap().push(data(&record));
            Ok(())
        }
    };
    let policy = FailurePolicy::dead_letter(2)
        .backoff(Duration::from_millis(100), Duration::from_millis(200))
        .outage_after(Some(5));
    let factory = Parallel::new(handler).max_in_flight(4).on_failure(policy);
    let (task, shutdown, status) = run(&stream, &store, &sink, factory);
    let failing = || {
        status
            .borrow()
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::Failing && p.key == SHARD)
    };
    let seen = wait_until(Duration::from_secs(30), failing).await;
    assert!(
        seen.is_some(),
        "reported failing: {:?} {:?} letters {}",
        status.borrow().problems,
        status.borrow().shards,
        sink.letters().len()
    );
    // The outage lasts a minute: nothing more is given up.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        sink.letters().len(),
        5,
        "no more than outage_after records given up"
    );
    assert!(status.borrow().shards.iter().any(|s| s.failures.outage));
    down.store(false, Ordering::SeqCst);
    until_passed(&store, records.last().unwrap()).await;
    assert_eq!(
        sink.letters().len(),
        5,
        "nothing dead-lettered after the outage"
    );
    assert_eq!(
        handled.lock().unwrap().len(),
        35,
        "every other record was processed"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !failing())
            .await
            .is_some(),
        "no longer failing"
    );
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

/// A sink whose check fails (or warns).
#[derive(Clone)]
struct Checked(Result<Vec<String>, ErrorKind>);

impl DeadLetterSink for Checked {
    async fn put(&self, _: &DeadLetter) -> Result<(), BackendError> {
        Ok(())
    }

    async fn check(&self) -> Result<Vec<String>, BackendError> {
        self.0
            .clone()
            .map_err(|kind| BackendError::new(kind, "check", "the queue does not exist"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_cannot_work_stops_the_worker_at_start() {
    let (stream, store) = (MemoryStream::new(1), MemoryLeaseStore::new());
    stream.put("k", "1");
    let factory = Parallel::new(|_: Record| async { Ok::<(), BoxError>(()) })
        .on_failure(FailurePolicy::dead_letter(3));
    let (worker, _) = start(&stream, &store, Checked(Err(ErrorKind::NotFound)), factory);
    let error = tokio::time::timeout(Duration::from_secs(30), worker.run())
        .await
        .expect("refused at once")
        .expect_err("refused");
    assert!(
        matches!(error, kcl_core::Error::DeadLetters(_)),
        "{error:?}"
    );
    let chain = kcl_core::error_chain(&error);
    assert!(chain.contains("the queue does not exist"), "{chain}");
    assert!(
        store.leases().is_empty() || store.leases().iter().all(|l| l.owner.is_none()),
        "no lease taken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_warns_still_runs() {
    let (stream, store) = (MemoryStream::new(1), MemoryLeaseStore::new());
    let record = stream.put("k", "1");
    let factory = Parallel::new(|_: Record| async { Ok::<(), BoxError>(()) })
        .on_failure(FailurePolicy::dead_letter(3));
    let warning = "retention 4 days is shorter than 7 days".to_owned();
    let (worker, _) = start(&stream, &store, Checked(Ok(vec![warning])), factory);
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    until_passed(&store, &record).await;
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn under_multi_stream_a_letter_names_the_records_stream() {
    use kcl_core::InitialPosition;
    use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId, Streams};
    let (orders, clicks) = (
        StreamId::new("123456789012", "orders", 1_700_000_000),
        StreamId::new("123456789012", "clicks", 1_700_000_000),
    );
    let (orders_stream, clicks_stream) = (MemoryStream::new(1), MemoryStream::new(1));
    let poison = clicks_stream.put("k", "poison");
    let after = clicks_stream.put("k", "after");
    orders_stream.put("k", "fine");
    let streams = Streams::default();
    streams.add(orders.clone(), InitialPosition::TrimHorizon);
    streams.add(clicks.clone(), InitialPosition::TrimHorizon);
    let by_id = [
        (orders.clone(), orders_stream),
        (clicks.clone(), clicks_stream),
    ];
    let source = MultiStreamSource::new(streams, move |s: &StreamId| {
        by_id
            .iter()
            .find(|(id, _)| id == s)
            .map(|(_, m)| m.clone())
            .expect("a stream")
    });
    let parallel = || {
        let handler = |record: Record| async move {
            if data(&record) == "poison" {
                return Err::<(), BoxError>("boom".into());
            }
            Ok(())
        };
        Parallel::new(handler).on_failure(FailurePolicy::dead_letter(1))
    };
    let (for_orders, for_clicks) = (parallel(), parallel());
    let factories = StreamFactories::new()
        .stream(orders, move |shard: &ShardId| for_orders.create(shard))
        .stream(clicks.clone(), move |shard: &ShardId| {
            for_clicks.create(shard)
        });
    let sink = MemorySink::new();
    let store = MemoryLeaseStore::new();
    // The worker's own setting names another stream: the letter must not take it.
    let worker = Worker::builder(source, store.clone())
        .config(config())
        .dead_letters(DeadLetters::new(sink.clone()).stream("orders"))
        .build_with(factories)
        .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let key = clicks.lease_key(&ShardId::new(SHARD));
    let done = wait_until(Duration::from_secs(60), || {
        store.leases().iter().any(|l| {
            l.key == key
                && matches!(&l.checkpoint, Checkpoint::Sequence(at) if *at >= after.position())
        })
    });
    assert!(done.await.is_some(), "the clicks shard was processed");
    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record, poison);
    assert_eq!(
        letters[0].stream.as_deref(),
        Some("clicks"),
        "a redrive goes back to clicks"
    );
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_keeps_refusing_reports_the_shard_failing_until_it_accepts() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records = fill(&stream, 20, 4, 7);
    sink.refuse(true);
    let handler = |record: Record| async move {
        if data(&record) == "poison" {
            return Err::<(), BoxError>("boom".into());
        }
        Ok(())
    };
    let policy =
        FailurePolicy::dead_letter(1).backoff(Duration::from_millis(200), Duration::from_secs(2));
    let factory = Parallel::new(handler).on_failure(policy);
    let (task, shutdown, status) = run(&stream, &store, &sink, factory);
    let failing = || {
        status.borrow().problems.iter().any(|p| {
            p.kind == ProblemKind::Failing
                && p.key == SHARD
                && p.detail.contains("dead-letter sink")
        })
    };
    let seen = wait_until(Duration::from_secs(60), failing).await;
    assert!(seen.is_some(), "reported failing while the sink refuses");
    assert!(sink.refused() >= 5, "{}", sink.refused());
    sink.refuse(false);
    until_passed(&store, records.last().unwrap()).await;
    assert!(
        wait_until(Duration::from_secs(10), || !failing())
            .await
            .is_some(),
        "failing no more"
    );
    assert_eq!(sink.letters().len(), 1);
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn under_heartbeats_an_unparked_key_runs_again_on_the_holder() {
    let (stream, store, sink) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    );
    let records = fill(&stream, 12, 6, 3);
    let handled = Handled::default();
    let seen = handled.clone();
    let handler = move |record: Record| {
        let seen = seen.clone();
        async move {
            let text = data(&record);
            if text == "poison" {
                return Err::<(), BoxError>(kcl_core::failure::Permanent::new("bad").into());
            }
            seen.lock().unwrap().push(text);
            Ok(())
        }
    };
    let factory = Parallel::new(handler)
        .on_failure(FailurePolicy::dead_letter(3))
        .park_keys(true);
    let (worker, _) = {
        let letters = DeadLetters::new(sink.clone());
        let worker = Worker::builder(stream.client("a"), store.client("a"))
            .id("a")
            .config(config().liveness(kcl_core::Liveness::Heartbeat))
            .dead_letters(letters.clone())
            .build_with(factory)
            .unwrap();
        (worker, letters)
    };
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    until_passed(&store, records.last().unwrap()).await;
    let parked = sink.letters()[0].parked_key.clone().unwrap();
    let changed = kcl_core::admin::unpark(&store, &parked).await.unwrap();
    assert_eq!(changed.len(), 1);
    // The holder reads its row back within a renewal interval (half the failover time under
    // heartbeats): a record of the key put after that runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let again = stream.put("key-3", "again-3");
    until_passed(&store, &again).await;
    let handled = handled.lock().unwrap().clone();
    assert!(
        handled.contains(&"again-3".to_owned()),
        "the unparked key ran: {handled:?}"
    );
    assert_eq!(sink.letters().len(), 2, "nothing more was parked");
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}
