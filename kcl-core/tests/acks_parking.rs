//! Sparse acknowledgements meet parked keys, on the in-memory backends under paused time.
//!
//! A key parks behind a record that a stuck key keeps the checkpoint from passing, so its
//! entry waits out of the lease row, and the records given up behind it finish without the
//! row saying why. Were they listed as finished past the checkpoint, a successor would skip
//! the parking record and its letters, not park the key, and run the key's later records out
//! of order. This file crashes the worker while the entry waits and checks that the successor
//! parks the key again instead.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::ack::SparseAcks;
use kcl_core::failure::{DeadLetters, FailurePolicy, Permanent, Reason};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, ExtendedSequenceNumber, Lease, Parallel, Record, ShutdownHandle, Worker,
    WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio::time::sleep;

const SHARD: &str = "shardId-000000000000";
/// Records put before the crash, on keys `key-{i % KEYS}`.
const N: usize = 60;
/// Records put after it.
const MORE: usize = 12;
const KEYS: usize = 6;
/// key-0's first record: stuck on the first holder, it holds the checkpoint.
const STUCK: usize = 0;
/// key-1's second record: fails for good and parks key-1.
const POISON: usize = 7;
const PARKED_KEY: &str = "key-1";

fn key(index: usize) -> String {
    format!("key-{}", index % KEYS)
}

/// Runs of the handler, by (worker, record index): started, and succeeded.
#[derive(Debug, Default)]
struct Log {
    started: Vec<(&'static str, usize)>,
    succeeded: Vec<(&'static str, usize)>,
}

type Shared = Arc<Mutex<Log>>;

impl Log {
    fn started_by(&self, worker: &str) -> BTreeSet<usize> {
        let by = self.started.iter().filter(|(w, _)| *w == worker);
        by.map(|(_, i)| *i).collect()
    }

    fn succeeded_by(&self, worker: &str) -> BTreeSet<usize> {
        let by = self.succeeded.iter().filter(|(w, _)| *w == worker);
        by.map(|(_, i)| *i).collect()
    }
}

struct Fleet {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    sink: MemorySink,
    log: Shared,
    records: Vec<Record>,
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
        .ack_checkpoint_every(5)
}

impl Fleet {
    fn new() -> Self {
        let mut fleet = Self {
            stream: MemoryStream::new(1),
            store: MemoryLeaseStore::new(),
            sink: MemorySink::new(),
            log: Shared::default(),
            records: Vec::new(),
        };
        fleet.put(N);
        fleet
    }

    /// Records up to `n`, record `i` with data `i` on `key(i)`.
    fn put(&mut self, n: usize) {
        for i in self.records.len()..n {
            self.records.push(self.stream.put(&key(i), i.to_string()));
        }
    }

    /// Worker `id` under `Parallel` with parked keys, dead-lettering into the memory sink:
    /// `POISON` fails for good; `STUCK` never finishes if `stuck`.
    fn start(&self, id: &'static str, stuck: bool) -> Running {
        let log = self.log.clone();
        let handler = move |record: Record| {
            let log = log.clone();
            async move {
                let index: usize = std::str::from_utf8(&record.data).unwrap().parse().unwrap();
                log.lock().unwrap().started.push((id, index));
                if index == POISON {
                    return Err::<(), BoxError>(Permanent::new("cannot apply").into());
                }
                if stuck && index == STUCK {
                    std::future::pending::<()>().await;
                }
                sleep(Duration::from_millis(1 + index as u64 % 5)).await;
                log.lock().unwrap().succeeded.push((id, index));
                Ok(())
            }
        };
        let policy = FailurePolicy::dead_letter(2)
            .backoff(Duration::from_millis(100), Duration::from_secs(1));
        let factory = Parallel::new(handler)
            .max_in_flight(8)
            .on_failure(policy)
            .park_keys(true);
        let worker = Worker::builder(self.stream.client(id), self.store.client(id))
            .id(id)
            .config(config())
            .dead_letters(DeadLetters::new(self.sink.clone()))
            .build_with(factory)
            .unwrap();
        Running {
            shutdown: worker.shutdown_handle(),
            task: tokio::spawn(worker.run()),
        }
    }

    fn row(&self) -> Lease {
        let leases = self.store.leases();
        let lease = leases.into_iter().find(|l| l.key.as_str() == SHARD);
        lease.expect("the row")
    }

    /// The records `worker` dead-lettered: (index, reason).
    fn letters_by(&self, worker: &str) -> Vec<(usize, Reason)> {
        let letters = self.sink.letters().into_iter();
        let by = letters.filter(|l| l.worker.as_str() == worker);
        by.map(|l| (self.index(&l.record), l.reason)).collect()
    }

    fn index(&self, record: &Record) -> usize {
        let at = self
            .records
            .iter()
            .position(|r| r.position() == record.position());
        at.expect("a record of the stream")
    }

    /// The records the row lists as finished past its checkpoint.
    fn acked(&self, lease: &Lease) -> BTreeSet<usize> {
        let Some(value) = &lease.acked else {
            return BTreeSet::new();
        };
        let acks = SparseAcks::decode(value, &lease.checkpoint).unwrap();
        let finished = |i: &usize| acks.contains(&self.records[*i].position());
        (0..self.records.len()).filter(finished).collect()
    }

    fn passed_all(&self) -> bool {
        let last = self.records.last().unwrap().position();
        matches!(self.row().checkpoint, Checkpoint::Sequence(at) if at >= last)
    }
}

/// key-1's records after the poison one, below `n`.
fn behind_poison(n: usize) -> BTreeSet<usize> {
    (POISON + 1..n).filter(|i| key(*i) == PARKED_KEY).collect()
}

/// The letters of key-1's records after the poison one, below `n`: parked behind it.
fn parked_behind(n: usize, behind: &ExtendedSequenceNumber) -> Vec<(usize, Reason)> {
    let parked = |i| {
        (
            i,
            Reason::Parked {
                behind: behind.clone(),
            },
        )
    };
    behind_poison(n).into_iter().map(parked).collect()
}

/// The first holder, until every record but key-0's finished: key-1 parked behind `POISON`,
/// its later records dead-lettered, every other key's records run.
async fn until_parked_and_flowing(fleet: &Fleet) {
    let expected: BTreeSet<usize> = (0..N)
        .filter(|i| key(*i) != key(STUCK) && *i != POISON && !behind_poison(N).contains(i))
        .collect();
    let done = wait_until(Duration::from_secs(60), || {
        let letters = fleet.letters_by("a").len();
        letters == 1 + behind_poison(N).len()
            && fleet.log.lock().unwrap().succeeded_by("a") == expected
    });
    assert!(done.await.is_some(), "{:?}", fleet.log.lock().unwrap());
    // Several ack checkpoint intervals: every finished record had its chance to be written.
    sleep(Duration::from_secs(3)).await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_while_a_parking_waits_for_its_checkpoint_leaves_nothing_of_its_key_to_run() {
    let mut fleet = Fleet::new();
    let a = fleet.start("a", true);
    until_parked_and_flowing(&fleet).await;
    let behind = fleet.records[POISON].position();
    let parked = parked_behind(N, &behind);
    let mut letters = fleet.letters_by("a");
    letters.sort_by_key(|(i, _)| *i);
    assert_eq!(letters[0], (POISON, Reason::Permanent));
    assert_eq!(letters[1..], parked[..], "key-1 parked on the first holder");
    let at_crash = fleet.row();
    assert_eq!(
        at_crash.checkpoint,
        Checkpoint::TrimHorizon,
        "the stuck record holds the checkpoint"
    );
    assert!(
        at_crash.parked_keys.is_empty(),
        "the entry waits for a checkpoint that passes its record: {:?}",
        at_crash.parked_keys
    );
    // Killed while the entry waits: no hook, no drain; the lease expires.
    a.task.abort();
    drop(a.shutdown);
    // key-1's records keep arriving.
    fleet.put(N + MORE);
    let b = fleet.start("b", false);
    let all = wait_until(Duration::from_secs(60), || fleet.passed_all());
    assert!(
        all.await.is_some(),
        "the successor never passed every record"
    );
    sleep(Duration::from_secs(2)).await;
    b.shutdown.shutdown();
    b.task.await.unwrap().unwrap();

    let log = fleet.log.lock().unwrap();
    let acked = fleet.acked(&at_crash);
    let ran_live: BTreeSet<usize> = log
        .succeeded_by("b")
        .intersection(&behind_poison(N + MORE))
        .copied()
        .collect();
    assert!(
        ran_live.is_empty(),
        "the successor ran key-1's records {ran_live:?} after its poison record {POISON}, \
         before any redrive (the row at the crash listed {acked:?} as finished past {:?})",
        at_crash.checkpoint
    );
    let mut letters = fleet.letters_by("b");
    letters.sort_by_key(|(i, _)| *i);
    let parked = parked_behind(N + MORE, &behind);
    assert_eq!(
        letters.first(),
        Some(&(POISON, Reason::Permanent)),
        "the poison record was delivered again and failed again"
    );
    assert_eq!(letters[1..], parked[..], "key-1 parked again behind it");
    assert!(
        log.succeeded_by("a").is_disjoint(&behind_poison(N)),
        "nor did the first holder run them"
    );
    // What the successor did not deliver again, the row said had finished.
    let reached: BTreeSet<usize> = log
        .started_by("b")
        .into_iter()
        .chain(letters.iter().map(|(i, _)| *i))
        .collect();
    let skipped: BTreeSet<usize> = (0..N).filter(|i| !reached.contains(i)).collect();
    assert!(
        skipped.is_subset(&acked),
        "skipped {skipped:?}, the row listed {acked:?}"
    );
    assert_eq!(
        at_crash.acked, None,
        "while the entry waits, the row lists nothing as finished past the checkpoint"
    );
}
