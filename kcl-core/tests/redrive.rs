//! A parked key redriven through its holder, on the in-memory backends under paused time: the
//! holder replays the key's letters before any later record of the key, while records of the
//! key keep arriving, under per-lease renewals and under heartbeats; a letter that fails again,
//! or a worker that cannot read its sink, leaves the key parked.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::failure::{DeadLetters, FailurePolicy, Permanent};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, ExtendedSequenceNumber, Liveness, Parallel, Record, ShardId, Worker,
    WorkerConfig,
};

const SHARD: &str = "shardId-000000000000";

fn config(liveness: Liveness) -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
        .liveness(liveness)
}

fn data(record: &Record) -> String {
    String::from_utf8_lossy(&record.data).into_owned()
}

fn passed(store: &MemoryLeaseStore, position: &ExtendedSequenceNumber) -> bool {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    matches!(lease.map(|l| l.checkpoint), Some(Checkpoint::Sequence(at)) if at >= *position)
}

/// Successful runs: (partition key, position), in the order they succeeded.
type Runs = Arc<Mutex<Vec<(String, ExtendedSequenceNumber)>>>;

struct Fleet {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    sink: MemorySink,
    runs: Runs,
    /// The poison record fails (with `Permanent`) while this is false.
    fixed: Arc<AtomicBool>,
}

impl Fleet {
    fn new() -> Self {
        Self {
            stream: MemoryStream::new(1),
            store: MemoryLeaseStore::new(),
            sink: MemorySink::new(),
            runs: Runs::default(),
            fixed: Arc::default(),
        }
    }

    /// A worker whose `Parallel` handler fails the record `poison` until fixed, parking its
    /// key; with a reader of its sink or not.
    fn start(
        &self,
        liveness: Liveness,
        reader: bool,
    ) -> (tokio::task::JoinHandle<()>, kcl_core::ShutdownHandle) {
        let (runs, fixed) = (self.runs.clone(), self.fixed.clone());
        let handler = move |record: Record| {
            let (runs, fixed) = (runs.clone(), fixed.clone());
            async move {
                // Slow enough that records of the key arrive while its letters replay.
                tokio::time::sleep(Duration::from_millis(100)).await;
                if data(&record) == "poison" && !fixed.load(Ordering::SeqCst) {
                    return Err::<(), BoxError>(Permanent::new("bad").into());
                }
                runs.lock()
                    .unwrap()
                    .push((record.partition_key.clone(), record.position()));
                Ok(())
            }
        };
        let factory = Parallel::new(handler)
            .max_in_flight(4)
            .on_failure(
                FailurePolicy::dead_letter(2)
                    .backoff(Duration::from_millis(100), Duration::from_secs(1)),
            )
            .park_keys(true);
        let mut letters = DeadLetters::new(self.sink.clone()).application("app");
        if reader {
            letters = letters.reader(self.sink.clone());
        }
        let worker = Worker::builder(self.stream.client("a"), self.store.client("a"))
            .id("a")
            .config(config(liveness))
            .dead_letters(letters)
            .build_with(factory)
            .unwrap();
        let shutdown = worker.shutdown_handle();
        let task = tokio::spawn(async move { worker.run().await.unwrap() });
        (task, shutdown)
    }

    /// Puts records 0..n on keys `key-{i % 6}`, `poison` at 3 (key-3).
    fn fill(&self, n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let data = if i == 3 {
                    "poison".to_owned()
                } else {
                    i.to_string()
                };
                self.stream.put(&format!("key-{}", i % 6), data)
            })
            .collect()
    }

    /// What `kcl-admin dead-letters redrive` does for the parked key: plans from the rows and
    /// the kept letters, and asks the holder.
    async fn redrive(&self, parked_key: &str) -> kcl_core::admin::RedrivePlan {
        let mut counts: BTreeMap<ShardId, usize> = BTreeMap::new();
        for letter in self.sink.kept() {
            if letter.parked_key.as_deref() == Some(parked_key) {
                *counts.entry(letter.shard.clone()).or_default() += 1;
            }
        }
        let plan = kcl_core::admin::plan_redrive(&self.store.leases(), parked_key, &counts);
        assert!(plan.orphans.is_empty(), "{plan:?}");
        let asked = kcl_core::admin::request_redrive(&self.store, &plan)
            .await
            .unwrap();
        assert_eq!(asked.len(), 1, "{plan:?}");
        plan
    }

    async fn until_done(&self, plan: &kcl_core::admin::RedrivePlan) {
        for _ in 0..600 {
            if kcl_core::admin::redrive_done(&self.store, plan)
                .await
                .unwrap()
                .0
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the redrive was never done: {:?}", self.store.leases());
    }

    /// key-3's successful runs, in the order they succeeded.
    fn key_runs(&self, key: &str) -> Vec<ExtendedSequenceNumber> {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

async fn redrive_under_live_traffic(liveness: Liveness) {
    let fleet = Fleet::new();
    let records = fleet.fill(30);
    let (task, shutdown) = fleet.start(liveness, true);
    let last = records.last().unwrap().position();
    assert!(
        wait_until(Duration::from_secs(60), || passed(&fleet.store, &last))
            .await
            .is_some()
    );
    let parked_key = fleet.sink.kept()[0].parked_key.clone().unwrap();
    assert_eq!(
        fleet.sink.kept().len(),
        5,
        "the poison record and the 4 behind it"
    );
    fleet.fixed.store(true, Ordering::SeqCst);
    // Live traffic on the key before, during and after the redrive.
    let mut live = vec![fleet.stream.put("key-3", "live-0")];
    let plan = fleet.redrive(&parked_key).await;
    for i in 1..20 {
        live.push(fleet.stream.put("key-3", format!("live-{i}")));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    fleet.until_done(&plan).await;
    let newest = fleet.stream.put("key-3", "after");
    assert!(
        wait_until(Duration::from_secs(60), || passed(
            &fleet.store,
            &newest.position()
        ))
        .await
        .is_some()
    );
    shutdown.shutdown();
    task.await.unwrap();
    // Every record of key-3 ran once, in sequence order: the letters before any live record.
    let ran = fleet.key_runs("key-3");
    let mut expected: Vec<ExtendedSequenceNumber> = records
        .iter()
        .filter(|r| r.partition_key == "key-3")
        .chain(live.iter())
        .chain([&newest])
        .map(Record::position)
        .collect();
    expected.sort();
    assert_eq!(ran, expected, "key-3's records, in order, each once");
    assert!(
        fleet.sink.kept().is_empty(),
        "the letters left the sink: {:?}",
        fleet.sink.kept()
    );
    let row = fleet
        .store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == SHARD)
        .unwrap();
    assert!(row.parked_keys.is_empty(), "{:?}", row.parked_keys);
}

#[tokio::test(start_paused = true)]
async fn a_redrive_replays_the_letters_before_the_keys_live_records() {
    redrive_under_live_traffic(Liveness::PerLease).await;
}

#[tokio::test(start_paused = true)]
async fn a_redrive_replays_the_letters_before_the_keys_live_records_under_heartbeats() {
    redrive_under_live_traffic(Liveness::Heartbeat).await;
}

/// The holder stops (the key parked, its letters kept, the request dropped); `reader` says
/// whether the worker can read its sink at all.
async fn a_redrive_that_stops(reader: bool) {
    let fleet = Fleet::new();
    let records = fleet.fill(30);
    let (task, shutdown) = fleet.start(Liveness::PerLease, reader);
    let last = records.last().unwrap().position();
    assert!(
        wait_until(Duration::from_secs(60), || passed(&fleet.store, &last))
            .await
            .is_some()
    );
    let parked_key = fleet.sink.kept()[0].parked_key.clone().unwrap();
    // Not fixed: the poison record fails again (or the worker cannot read its letters).
    let plan = fleet.redrive(&parked_key).await;
    let row = || {
        fleet
            .store
            .leases()
            .into_iter()
            .find(|l| l.key.as_str() == SHARD)
            .unwrap()
    };
    let dropped = wait_until(Duration::from_secs(60), || {
        !row().parked_keys.iter().any(|e| e.contains("/redrive/"))
    })
    .await;
    assert!(
        dropped.is_some(),
        "the request was dropped: {:?}",
        row().parked_keys
    );
    assert!(
        !kcl_core::admin::redrive_done(&fleet.store, &plan)
            .await
            .unwrap()
            .0
    );
    assert_eq!(row().parked_keys.len(), 1, "the key stays parked");
    assert_eq!(fleet.sink.kept().len(), 5, "every letter stays");
    let later = fleet.stream.put("key-3", "later");
    assert!(
        wait_until(Duration::from_secs(60), || passed(
            &fleet.store,
            &later.position()
        ))
        .await
        .is_some()
    );
    assert!(
        fleet
            .key_runs("key-3")
            .iter()
            .all(|p| *p < records[3].position()),
        "nothing of the key ran"
    );
    shutdown.shutdown();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_letter_that_fails_again_leaves_the_key_parked() {
    a_redrive_that_stops(true).await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_read_its_sink_leaves_the_key_parked() {
    a_redrive_that_stops(false).await;
}
