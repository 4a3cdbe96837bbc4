//! Per-key parallelism and asynchronous acknowledgement on the in-memory backends, under
//! paused time: order per key, the watermark, failures, backpressure, graceful stops and
//! shard ends.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::ack::Ack;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, ExtendedSequenceNumber, Parallel, ProcessRecordsInput,
    Record, RecordProcessor, ShardId, ShutdownHandle, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

/// What handlers did: (key, position, started, ended) per run, and the most at once.
#[derive(Debug, Default)]
struct Runs {
    runs: Vec<(String, ExtendedSequenceNumber, Instant, Option<Instant>)>,
    running: usize,
    most: usize,
}

type Shared = Arc<Mutex<Runs>>;

/// Puts records `from..to` on `stream`'s shard, record `i` with data `i` and key
/// `key-{i % keys}`.
fn fill(stream: &MemoryStream, from: usize, to: usize, keys: usize) {
    for i in from..to {
        stream.put(&format!("key-{}", i % keys), format!("{i}"));
    }
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_secs(1))
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

/// A handler that takes `latency(record)`, fails where `fail` says, and records its runs.
fn handler(
    runs: &Shared,
    latency: impl Fn(&Record) -> Duration + Send + Sync + 'static,
    fail: impl Fn(&Record) -> bool + Send + Sync + 'static,
) -> impl Fn(Record) -> std::pin::Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    let (latency, fail) = (Arc::new(latency), Arc::new(fail));
    move |record: Record| {
        let (runs, latency, fail) = (runs.clone(), latency.clone(), fail.clone());
        Box::pin(async move {
            let index = {
                let mut r = runs.lock().unwrap();
                r.running += 1;
                r.most = r.most.max(r.running);
                r.runs.push((
                    record.partition_key.clone(),
                    record.position(),
                    Instant::now(),
                    None,
                ));
                r.runs.len() - 1
            };
            sleep(latency(&record)).await;
            let mut r = runs.lock().unwrap();
            r.running -= 1;
            if fail(&record) {
                return Err("injected".into());
            }
            r.runs[index].3 = Some(Instant::now());
            Ok(())
        })
    }
}

const SHARD: &str = "shardId-000000000000";

/// The checkpoint of the stream's first shard.
fn checkpoint(store: &MemoryLeaseStore) -> Checkpoint {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    lease.expect("the shard's lease").checkpoint
}

/// Per key: each run starts after the previous one of its key ended, at a later position
/// unless a failure made the shard start again.
fn assert_key_order(runs: &Runs) {
    let mut last: BTreeMap<&str, (&ExtendedSequenceNumber, Option<Instant>)> = BTreeMap::new();
    for (key, position, start, end) in &runs.runs {
        if let Some((previous, ended)) = last.get(key.as_str()) {
            let ended = ended
                .unwrap_or_else(|| panic!("{key}: {position} ran after a run that never ended"));
            assert!(ended <= *start, "{key}: {position} overlapped {previous}");
        }
        last.insert(key, (position, *end));
    }
}

#[tokio::test(start_paused = true)]
async fn records_of_a_key_run_one_at_a_time_in_order_and_keys_overlap() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let runs = Shared::default();
    fill(&stream, 0, 300, 30);
    let latency = |r: &Record| Duration::from_millis(5 + (r.data[0] as u64 % 7) * 3);
    let factory = Parallel::new(handler(&runs, latency, |_| false)).max_in_flight(8);
    let w = run(config(), &stream, &store, factory);
    let done = wait_until(Duration::from_secs(60), || {
        runs.lock()
            .unwrap()
            .runs
            .iter()
            .filter(|r| r.3.is_some())
            .count()
            == 300
    });
    assert!(done.await.is_some(), "every record handled");
    each_once_in_key_order(&runs.lock().unwrap());
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    let last = stream
        .records(&ShardId::new(SHARD))
        .last()
        .unwrap()
        .position();
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(last),
        "a graceful stop checkpoints all"
    );
}

#[tokio::test(start_paused = true)]
async fn no_checkpoint_passes_an_unfinished_record() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let runs = Shared::default();
    let first = stream.put("slow", "0").position();
    fill(&stream, 1, 100, 100);
    let slow = |r: &Record| {
        if r.partition_key == "slow" {
            Duration::from_secs(20)
        } else {
            Duration::from_millis(10)
        }
    };
    let factory = Parallel::new(handler(&runs, slow, |_| false)).max_in_flight(4);
    let w = run(config().ack_checkpoint_every(10), &stream, &store, factory);
    sleep(Duration::from_secs(10)).await;
    let done = runs
        .lock()
        .unwrap()
        .runs
        .iter()
        .filter(|r| r.3.is_some())
        .count();
    assert_eq!(done, 99, "the other records finished");
    assert!(
        !matches!(checkpoint(&store), Checkpoint::Sequence(_)),
        "the checkpoint stays before the unfinished first record: {}",
        checkpoint(&store)
    );
    sleep(Duration::from_secs(12)).await;
    let Checkpoint::Sequence(at) = checkpoint(&store) else {
        panic!("checkpointed")
    };
    assert!(at > first, "past the first record once it finished");
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_record_restarts_the_shard_from_the_watermark_and_holds_its_key() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let runs = Shared::default();
    fill(&stream, 0, 200, 10);
    let failures = Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    // Record 50 fails twice, then succeeds.
    let fail = move |r: &Record| r.data.as_ref() == b"50" && f.fetch_add(1, Ordering::SeqCst) < 2;
    let factory =
        Parallel::new(handler(&runs, |_| Duration::from_millis(20), fail)).max_in_flight(5);
    let w = run(config().ack_checkpoint_every(5), &stream, &store, factory);
    let all = wait_until(Duration::from_secs(120), || {
        let r = runs.lock().unwrap();
        r.runs
            .iter()
            .filter(|r| r.3.is_some())
            .map(|r| &r.1)
            .collect::<HashSet<_>>()
            .len()
            == 200
    });
    assert!(all.await.is_some(), "every record finished at last");
    assert_eq!(failures.load(Ordering::SeqCst), 3);
    record_50_held_its_key(&runs.lock().unwrap(), &stream);
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

/// Acknowledges nothing until told to; counts deliveries.
#[derive(Clone, Default)]
struct Holder {
    held: Arc<Mutex<Vec<Ack>>>,
    delivered: Arc<AtomicUsize>,
}

impl RecordProcessor for Holder {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.delivered
            .fetch_add(input.records().len(), Ordering::SeqCst);
        let pairs = input.acknowledge_later();
        self.held
            .lock()
            .unwrap()
            .extend(pairs.into_iter().map(|(_, ack)| ack));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn reading_pauses_while_max_unacknowledged_records_wait() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..500 {
        stream.put("k", format!("{i}"));
    }
    let holder = Holder::default();
    let h = holder.clone();
    let config = config().max_records(10).max_unacknowledged(50);
    let w = run(config, &stream, &store, move |_: &ShardId| h.clone());
    sleep(Duration::from_secs(10)).await;
    let delivered = holder.delivered.load(Ordering::SeqCst);
    assert!(
        (50..=60).contains(&delivered),
        "{delivered} delivered while 50 wait"
    );
    assert!(
        !matches!(checkpoint(&store), Checkpoint::Sequence(_)),
        "nothing finished"
    );
    // Acknowledge as they come: everything flows.
    for _ in 0..100 {
        for ack in holder.held.lock().unwrap().drain(..) {
            ack.done();
        }
        sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(holder.delivered.load(Ordering::SeqCst), 500);
    let last = stream
        .records(&ShardId::new(SHARD))
        .last()
        .unwrap()
        .position();
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(last),
        "checkpointed on time"
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_waits_for_records_in_flight_then_checkpoints_them() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let runs = Shared::default();
    fill(&stream, 0, 40, 40);
    let factory =
        Parallel::new(handler(&runs, |_| Duration::from_secs(3), |_| false)).max_in_flight(40);
    let w = run(config(), &stream, &store, factory);
    assert!(
        wait_until(Duration::from_secs(5), || runs.lock().unwrap().runs.len()
            == 40)
        .await
        .is_some()
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    let r = runs.lock().unwrap();
    assert!(
        r.runs.iter().all(|x| x.3.is_some()),
        "awaited, not cancelled"
    );
    let last = stream
        .records(&ShardId::new(SHARD))
        .last()
        .unwrap()
        .position();
    assert_eq!(checkpoint(&store), Checkpoint::Sequence(last));
}

#[tokio::test(start_paused = true)]
async fn shard_end_is_written_only_once_every_record_finished() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let runs = Shared::default();
    let parent = ShardId::new(SHARD);
    stream.put("slow", "0");
    fill(&stream, 1, 20, 20);
    stream.split(&parent).unwrap();
    let slow = |r: &Record| {
        if r.partition_key == "slow" {
            Duration::from_secs(15)
        } else {
            Duration::from_millis(10)
        }
    };
    let factory = Parallel::new(handler(&runs, slow, |_| false)).max_in_flight(4);
    let w = run(config(), &stream, &store, factory);
    sleep(Duration::from_secs(8)).await;
    let parent_lease = |s: &MemoryLeaseStore| {
        s.leases()
            .into_iter()
            .find(|l| l.key == parent)
            .unwrap()
            .checkpoint
    };
    assert_ne!(
        parent_lease(&store),
        Checkpoint::ShardEnd,
        "the slow record still runs"
    );
    sleep(Duration::from_secs(10)).await;
    assert_eq!(parent_lease(&store), Checkpoint::ShardEnd);
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

/// Every record ran once, at most 8 at once, in order per key.
fn each_once_in_key_order(r: &Runs) {
    assert_key_order(r);
    assert_eq!(r.most, 8, "up to max_in_flight at once, never more");
    let per_key: HashSet<_> = r.runs.iter().map(|r| (&r.0, &r.1)).collect();
    assert_eq!(per_key.len(), 300, "each record once");
}

/// Record 50 (key-0), which failed twice: no later record of key-0 finished before it did.
fn record_50_held_its_key(r: &Runs, stream: &MemoryStream) {
    let fifty = &stream.records(&ShardId::new(SHARD))[50].position();
    let fifty_done = r
        .runs
        .iter()
        .filter(|x| &x.1 == fifty)
        .find_map(|x| x.3)
        .unwrap();
    for (key, position, _, end) in &r.runs {
        if key == "key-0"
            && position > fifty
            && let Some(end) = end
        {
            assert!(
                *end > fifty_done,
                "{position} of key-0 finished before record 50"
            );
        }
    }
}
