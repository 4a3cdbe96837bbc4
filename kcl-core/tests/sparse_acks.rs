//! Sparse acknowledgements on the in-memory backends, under paused time: a worker crashes
//! under `Parallel` with one key stuck, and the records its successor delivers again are
//! those unfinished at the crash, not every record past the checkpoint.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::ack::SparseAcks;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, ExtendedSequenceNumber, Lease, Parallel, Record, ShutdownHandle, Worker,
    WorkerConfig,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::sleep;

const SHARD: &str = "shardId-000000000000";

/// Who handled which record (by its data, the record's index): started, and finished.
#[derive(Debug, Default)]
struct Log {
    started: BTreeMap<&'static str, Vec<usize>>,
    finished: BTreeMap<&'static str, BTreeSet<usize>>,
}

type Shared = Arc<Mutex<Log>>;

impl Log {
    fn started_by(&self, worker: &str) -> Vec<usize> {
        self.started.get(worker).cloned().unwrap_or_default()
    }

    fn finished_by(&self, worker: &str) -> BTreeSet<usize> {
        self.finished.get(worker).cloned().unwrap_or_default()
    }

    fn finished_by_anyone(&self) -> BTreeSet<usize> {
        self.finished.values().flatten().copied().collect()
    }
}

/// A stuck record: its handler waits until released (for ever, if never); or, when it
/// `fails`, two seconds, and then fails the first time.
#[derive(Debug, Clone)]
struct Stuck {
    record: usize,
    release: Arc<Notify>,
    fails: Option<Arc<AtomicBool>>,
}

fn stuck(record: usize) -> Stuck {
    Stuck {
        record,
        release: Arc::new(Notify::new()),
        fails: None,
    }
}

fn failing_once(record: usize) -> Stuck {
    Stuck {
        fails: Some(Arc::new(AtomicBool::new(true))),
        ..stuck(record)
    }
}

/// Records `0..n`, record `i` with data `i` and key `key-{i % keys}`; their positions.
fn fill(stream: &MemoryStream, n: usize, keys: usize) -> Positions {
    let mut at = Positions(Vec::new());
    at.more(stream, n, keys);
    at
}

/// Each record's position, by index.
struct Positions(Vec<ExtendedSequenceNumber>);

impl Positions {
    /// Records up to `n`, as `fill` puts them.
    fn more(&mut self, stream: &MemoryStream, n: usize, keys: usize) {
        for i in self.0.len()..n {
            let put = stream.put(&format!("key-{}", i % keys), format!("{i}"));
            self.0
                .push(ExtendedSequenceNumber::new(put.sequence_number));
        }
    }

    /// The index of the record a checkpoint stands at (`None` before the first record).
    fn checkpointed(&self, lease: &Lease) -> Option<usize> {
        match &lease.checkpoint {
            Checkpoint::Sequence(at) => self.0.iter().position(|p| p == at),
            _ => None,
        }
    }

    /// The records the row says finished past its checkpoint, by index.
    fn acked(&self, lease: &Lease) -> BTreeSet<usize> {
        let Some(value) = &lease.acked else {
            return BTreeSet::new();
        };
        let acks = SparseAcks::decode(value, &lease.checkpoint).unwrap();
        (0..self.0.len())
            .filter(|&i| acks.contains(&self.0[i]))
            .collect()
    }
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_secs(1))
        .ack_checkpoint_every(10)
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

/// Worker `id` under `Parallel`, its handler logging into `log` and stuck on `stuck`.
fn run(
    id: &'static str,
    config: WorkerConfig,
    (stream, store): (&MemoryStream, &MemoryLeaseStore),
    log: &Shared,
    stuck: Option<Stuck>,
) -> Running {
    let log = log.clone();
    let handler = move |record: Record| {
        let (log, stuck) = (log.clone(), stuck.clone());
        async move {
            let index: usize = std::str::from_utf8(&record.data).unwrap().parse().unwrap();
            log.lock()
                .unwrap()
                .started
                .entry(id)
                .or_default()
                .push(index);
            match stuck.filter(|s| s.record == index) {
                Some(Stuck {
                    fails: Some(fails), ..
                }) => {
                    sleep(Duration::from_secs(2)).await;
                    if fails.swap(false, Ordering::SeqCst) {
                        return Err::<(), BoxError>("injected".into());
                    }
                }
                Some(stuck) => stuck.release.notified().await,
                None => {}
            }
            sleep(Duration::from_millis(1 + index as u64 % 5)).await;
            log.lock()
                .unwrap()
                .finished
                .entry(id)
                .or_default()
                .insert(index);
            Ok::<(), BoxError>(())
        }
    };
    let factory = Parallel::new(handler).max_in_flight(8);
    let w = Worker::new(id, config, stream.client(id), store.client(id), factory).unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        task: tokio::spawn(w.run()),
    }
}

fn row(store: &MemoryLeaseStore) -> Lease {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    lease.expect("the shard's lease")
}

/// Waits until the row carries every record `worker` finished past its checkpoint.
async fn written(store: &MemoryLeaseStore, log: &Shared, worker: &str, at: &Positions) -> Lease {
    let settled = wait_until(Duration::from_secs(10), || {
        let lease = row(store);
        let after = at.checkpointed(&lease).map_or(0, |c| c + 1);
        let finished = log.lock().unwrap().finished_by(worker);
        let past: BTreeSet<usize> = finished.into_iter().filter(|&i| i >= after).collect();
        past.is_subset(&at.acked(&lease))
    });
    assert!(
        settled.await.is_some(),
        "the row never carried what finished"
    );
    row(store)
}

/// Crashes `running` (no hook, no release: the lease expires).
fn crash(running: Running) {
    running.task.abort();
    drop(running.shutdown);
}

async fn stop(running: Running) {
    running.shutdown.shutdown();
    running.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failover_under_parallel_redelivers_only_what_was_unfinished() {
    const N: usize = 200;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    let at = fill(&stream, N, 10);
    // key-3 sticks at record 3: its 20 records wait, the 9 other keys' finish.
    let a = run("a", config(), (&stream, &store), &log, Some(stuck(3)));
    let done = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("a").len() == N - N / 10
    });
    assert!(done.await.is_some());
    let lease = written(&store, &log, "a", &at).await;
    assert_eq!(
        at.checkpointed(&lease),
        Some(2),
        "the stuck record holds the checkpoint"
    );
    crash(a);
    let finished = log.lock().unwrap().finished_by("a");
    let unfinished: BTreeSet<usize> = (0..N).filter(|i| !finished.contains(i)).collect();
    let runs = SparseAcks::decode(lease.acked.as_ref().unwrap(), &lease.checkpoint)
        .unwrap()
        .runs()
        .len();

    let b = run("b", config(), (&stream, &store), &log, None);
    let all = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by_anyone().len() == N
    });
    assert!(all.await.is_some(), "records lost");
    sleep(Duration::from_secs(2)).await;
    let again = log.lock().unwrap().started_by("b");
    let past_checkpoint = N - 3;
    println!(
        "sparse acks, one failover: {} records delivered again, {} unfinished at the crash, \
         {past_checkpoint} past the checkpoint (what a failover delivered again before); the \
         row held {runs} runs in {} characters",
        again.len(),
        unfinished.len(),
        lease.acked.as_ref().unwrap().len(),
    );
    assert!(again.len() <= unfinished.len());
    assert_eq!(
        again.iter().copied().collect::<BTreeSet<_>>(),
        unfinished,
        "exactly the unfinished ones, each once"
    );
    assert_eq!(again.len(), unfinished.len(), "each once");
    stop(b).await;
    let end = row(&store);
    assert_eq!(at.checkpointed(&end), Some(N - 1));
    assert_eq!(end.acked, None, "passed by the checkpoint: removed");
}

#[tokio::test(start_paused = true)]
async fn two_failovers_in_a_row_carry_the_set_on() {
    const N: usize = 200;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    let mut at = fill(&stream, N, 10);
    let a = run("a", config(), (&stream, &store), &log, Some(stuck(3)));
    let done = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("a").len() == N - N / 10
    });
    assert!(done.await.is_some());
    written(&store, &log, "a", &at).await;
    crash(a);
    // The successor sticks on the same record, finishes only records written since, writes
    // them with what the row said, and crashes too.
    at.more(&stream, N + 20, 10);
    let b = run("b", config(), (&stream, &store), &log, Some(stuck(3)));
    let started = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("b").len() == 18
    });
    assert!(started.await.is_some());
    let lease = written(&store, &log, "b", &at).await;
    assert_eq!(at.acked(&lease).len(), N + 20 - 22 - 3, "a's and b's");
    let by_b = log.lock().unwrap().started_by("b");
    assert_eq!(by_b.len(), 19, "key-3's first record and the new ones");
    crash(b);

    let c = run("c", config(), (&stream, &store), &log, None);
    let all = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by_anyone().len() == N + 20
    });
    assert!(all.await.is_some(), "records lost");
    sleep(Duration::from_secs(2)).await;
    let again = log.lock().unwrap().started_by("c");
    println!(
        "sparse acks, two failovers: {} records delivered again by the third holder, {} \
         unfinished",
        again.len(),
        22
    );
    let key_3: BTreeSet<usize> = (0..N + 20).filter(|i| i % 10 == 3).collect();
    assert_eq!(again.iter().copied().collect::<BTreeSet<_>>(), key_3);
    assert_eq!(again.len(), key_3.len());
    stop(c).await;
}

#[tokio::test(start_paused = true)]
async fn a_full_set_keeps_the_records_nearest_the_checkpoint() {
    const N: usize = 3000;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    // Two keys, key-0 stuck at the very first record: every other record finished, 1,500
    // single-record runs, more than a value holds; the checkpoint stays TRIM_HORIZON.
    let at = fill(&stream, N, 2);
    let config = config().max_unacknowledged(10_000);
    let a = run("a", config.clone(), (&stream, &store), &log, Some(stuck(0)));
    let done = wait_until(Duration::from_secs(120), || {
        log.lock().unwrap().finished_by("a").len() == N / 2
    });
    assert!(done.await.is_some());
    sleep(Duration::from_secs(3)).await;
    let lease = row(&store);
    assert_eq!(lease.checkpoint, Checkpoint::TrimHorizon);
    let value = lease.acked.clone().expect("a value");
    assert!(value.len() <= SparseAcks::MAX_ENCODED, "{}", value.len());
    let kept = at.acked(&lease);
    let finished = log.lock().unwrap().finished_by("a");
    assert!(kept.is_subset(&finished));
    assert!(kept.len() < finished.len(), "the bound was reached");
    let highest = *kept.last().unwrap();
    assert!(
        finished
            .iter()
            .filter(|&&i| i <= highest)
            .all(|i| kept.contains(i)),
        "those nearest the checkpoint are kept"
    );
    crash(a);
    let unfinished = N - finished.len();

    let b = run("b", config, (&stream, &store), &log, None);
    let all = wait_until(Duration::from_secs(120), || {
        log.lock().unwrap().finished_by_anyone().len() == N
    });
    assert!(all.await.is_some(), "records lost");
    sleep(Duration::from_secs(2)).await;
    let again = log.lock().unwrap().started_by("b");
    let left_out = finished.len() - kept.len();
    println!(
        "sparse acks, a full set: the row kept {} finished records of {} in {} characters; \
         {} delivered again = {unfinished} unfinished + {left_out} left out by the bound",
        kept.len(),
        finished.len(),
        value.len(),
        again.len(),
    );
    assert_eq!(again.len(), unfinished + left_out);
    assert!(again.iter().all(|i| !kept.contains(i)));
    stop(b).await;
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_value_is_ignored_and_every_record_past_the_checkpoint_comes_again() {
    const N: usize = 100;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    let at = fill(&stream, N, 10);
    let a = run("a", config(), (&stream, &store), &log, Some(stuck(3)));
    let done = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("a").len() == N - N / 10
    });
    assert!(done.await.is_some());
    written(&store, &log, "a", &at).await;
    crash(a);
    let mut lease = row(&store);
    lease.acked = Some("not base64!".to_owned());
    store.insert(lease);

    let b = run("b", config(), (&stream, &store), &log, None);
    let all = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("b").len() == N - 3
    });
    assert!(
        all.await.is_some(),
        "everything past the checkpoint, delivered again"
    );
    let again = log.lock().unwrap().started_by("b");
    assert_eq!(again.len(), N - 3);
    stop(b).await;
}

#[tokio::test(start_paused = true)]
async fn the_set_clears_as_the_watermark_passes() {
    const N: usize = 100;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    let at = fill(&stream, N, 10);
    let stuck = stuck(3);
    let a = run("a", config(), (&stream, &store), &log, Some(stuck.clone()));
    let done = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("a").len() == N - N / 10
    });
    assert!(done.await.is_some());
    let lease = written(&store, &log, "a", &at).await;
    assert_eq!(at.acked(&lease).len(), N - N / 10 - 3);
    stuck.release.notify_one();
    let passed = wait_until(Duration::from_secs(30), || {
        let lease = row(&store);
        at.checkpointed(&lease) == Some(N - 1) && lease.acked.is_none()
    });
    assert!(
        passed.await.is_some(),
        "the checkpoint passed them all and the set went"
    );
    stop(a).await;
}

#[tokio::test(start_paused = true)]
async fn a_restart_after_a_failed_record_skips_what_finished() {
    const N: usize = 200;
    let (stream, store, log) = (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        Shared::default(),
    );
    fill(&stream, N, 10);
    // Record 3 fails after two seconds, once: the shard restarts from the watermark (before
    // it), by then every other key's records finished.
    let a = run(
        "a",
        config(),
        (&stream, &store),
        &log,
        Some(failing_once(3)),
    );
    let all = wait_until(Duration::from_secs(60), || {
        log.lock().unwrap().finished_by("a").len() == N
    });
    assert!(all.await.is_some(), "records lost");
    let started = log.lock().unwrap().started_by("a");
    let twice: Vec<usize> = (0..N)
        .filter(|i| started.iter().filter(|s| *s == i).count() > 1)
        .collect();
    println!(
        "sparse acks, a restart after a failure: {} runs of a handler for {N} records; run \
         twice: {twice:?}",
        started.len()
    );
    assert_eq!(twice, vec![3], "only the failed record ran again");
    assert_eq!(started.len(), N + 1);
    stop(a).await;
}
