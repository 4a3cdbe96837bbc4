//! Helpers shared by the worker tests: a recording processor, a worker launcher, and waits.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, SequenceNumber, ShardId,
    ShutdownHandle, Status, Worker, WorkerConfig,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

/// Every delivery: (worker, shard, sequence number).
pub type Seen = Arc<Mutex<Vec<(String, ShardId, SequenceNumber)>>>;

#[derive(Clone, Default)]
pub struct Behaviour {
    /// Checkpoint after every batch (otherwise only in `shutdown_requested`).
    pub every_batch: bool,
    /// Panic on the first batch of this shard, once.
    pub panic_once_on: Option<ShardId>,
    pub panicked: Arc<AtomicBool>,
    /// Return an error from the first batch of this shard, once.
    pub fail_once_on: Option<ShardId>,
    pub failed: Arc<AtomicBool>,
    /// Never return from `shutdown_requested`.
    pub hang_on_shutdown: bool,
}

pub struct Recorder {
    pub worker: String,
    pub shard: ShardId,
    pub seen: Seen,
    pub behaviour: Behaviour,
}

impl RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if self.behaviour.panic_once_on.as_ref() == Some(&self.shard)
            && !self.behaviour.panicked.swap(true, Ordering::SeqCst)
        {
            panic!("processor bug");
        }
        {
            let mut seen = self.seen.lock().unwrap();
            for r in input.records() {
                seen.push((
                    self.worker.clone(),
                    self.shard.clone(),
                    r.sequence_number.clone(),
                ));
            }
        }
        if self.behaviour.fail_once_on.as_ref() == Some(&self.shard)
            && !self.behaviour.failed.swap(true, Ordering::SeqCst)
        {
            return Err("downstream unavailable".into());
        }
        if self.behaviour.every_batch {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        if self.behaviour.hang_on_shutdown {
            std::future::pending::<()>().await;
        }
        cp.checkpoint().await?;
        Ok(())
    }
}

pub fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
}

pub struct Running {
    pub task: JoinHandle<Result<(), kcl_core::Error>>,
    pub shutdown: ShutdownHandle,
    pub status: watch::Receiver<Status>,
}

pub fn start(
    id: &str,
    config: WorkerConfig,
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    seen: &Seen,
    behaviour: &Behaviour,
) -> Running {
    let (worker, seen, behaviour) = (id.to_owned(), seen.clone(), behaviour.clone());
    let w = Worker::new(
        id,
        config,
        stream.client(id),
        store.client(id),
        move |shard: &ShardId| Recorder {
            worker: worker.clone(),
            shard: shard.clone(),
            seen: seen.clone(),
            behaviour: behaviour.clone(),
        },
    )
    .unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        status: w.status(),
        task: tokio::spawn(w.run()),
    }
}

/// A stream of `shards` shards, an empty lease table, and a record of deliveries.
pub fn world(shards: u32) -> (MemoryStream, MemoryLeaseStore, Seen) {
    (
        MemoryStream::new(shards),
        MemoryLeaseStore::new(),
        Seen::default(),
    )
}

/// Writes `n` records spread over 37 partition keys; returns their sequence numbers.
pub fn fill(stream: &MemoryStream, n: usize) -> Vec<SequenceNumber> {
    (0..n)
        .map(|i| {
            stream
                .put(&format!("key-{}", i % 37), format!("record-{i}"))
                .sequence_number
        })
        .collect()
}

pub fn held(r: &Running) -> usize {
    r.status.borrow().held.len()
}

pub async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() <= limit {
        if done() {
            return Some(start.elapsed());
        }
        sleep(Duration::from_millis(10)).await;
    }
    None
}

pub fn delivered_by(seen: &Seen) -> BTreeMap<(ShardId, SequenceNumber), Vec<String>> {
    let mut out: BTreeMap<_, Vec<String>> = BTreeMap::new();
    for (w, s, q) in seen.lock().unwrap().iter() {
        out.entry((s.clone(), q.clone()))
            .or_default()
            .push(w.clone());
    }
    out
}

/// How many of `written` were never delivered.
pub fn undelivered(seen: &Seen, written: &[SequenceNumber]) -> usize {
    let delivered: std::collections::BTreeSet<SequenceNumber> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, q)| q.clone())
        .collect();
    written.iter().filter(|q| !delivered.contains(q)).count()
}

/// Waits (up to 10 s) until every record of `written` was delivered; how many never were.
pub async fn undelivered_after_waiting(seen: &Seen, written: &[SequenceNumber]) -> usize {
    wait_until(Duration::from_secs(10), || undelivered(seen, written) == 0).await;
    undelivered(seen, written)
}

/// How many deliveries were of records in `old`.
pub fn delivered_of(seen: &Seen, old: &[SequenceNumber]) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(_, _, q)| old.contains(q))
        .count()
}

/// Records `0..n`, record `i` with data `i` and key `key-{i % 6}`; their positions (the
/// outputs tests' stream: `numbered` reads a record's `i` back).
pub fn fill_numbered(stream: &MemoryStream, n: usize) -> Vec<kcl_core::ExtendedSequenceNumber> {
    (0..n)
        .map(|i| {
            stream
                .put(&format!("key-{}", i % 6), format!("{i}"))
                .position()
        })
        .collect()
}

/// The `i` a record of [`fill_numbered`] carries.
pub fn numbered(record: &kcl_core::Record) -> usize {
    let text = std::str::from_utf8(&record.data).expect("a record of fill_numbered");
    text.parse().expect("a record of fill_numbered")
}

/// The outputs tests' worker timing: 6 s failover, 0.5 s taker interval and acknowledgement
/// checkpoints.
pub fn outputs_config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
}
