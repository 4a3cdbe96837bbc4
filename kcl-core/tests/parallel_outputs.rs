//! `Parallel::with_outputs` on the in-memory backends, under paused time: records finish out
//! of order, but each record's writes commit exactly once, with a checkpoint that covers them,
//! and no checkpoint passes a record whose writes did not commit — behind a stuck key, across
//! a takeover, against a frozen worker that thaws, under a dead-letter policy, and through a
//! graceful stop.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::failure::{DeadLetters, FailurePolicy};
use kcl_core::memory::{Faults, MemoryLeaseStore, MemorySink, MemoryStream, MemoryWrite, Refusal};
use kcl_core::parallel::WithOutputs;
use kcl_core::{
    BoxError, Checkpoint, ExtendedSequenceNumber, LeaseStore, OutputHandler, Parallel,
    ProcessorFactory, Record, ShutdownHandle, Worker, WorkerConfig, WorkerId,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;

const SHARD: &str = "shardId-000000000000";
const FAILOVER: Duration = Duration::from_secs(6);
const RECORDS: usize = 30;
/// Record 4's key (`key-4`) is the one held up: 4, 10, 16, 22 and 28 wait on it.
const KEYS: usize = 6;

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(FAILOVER)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
}

/// Records `0..RECORDS`, record `i` with data `i` and key `key-{i % KEYS}`; their positions.
fn fill(stream: &MemoryStream) -> Vec<ExtendedSequenceNumber> {
    fill_n(stream, RECORDS)
}

fn fill_n(stream: &MemoryStream, n: usize) -> Vec<ExtendedSequenceNumber> {
    (0..n)
        .map(|i| {
            stream
                .put(&format!("key-{}", i % KEYS), format!("{i}"))
                .position()
        })
        .collect()
}

fn data(record: &Record) -> usize {
    std::str::from_utf8(&record.data).unwrap().parse().unwrap()
}

fn out(i: usize) -> String {
    format!("out-{i}")
}

/// What a handler does: which records wait for `open`, which fail, and who computed what.
#[derive(Clone)]
struct Handling {
    open: watch::Receiver<bool>,
    stuck: fn(usize) -> bool,
    fails: fn(usize) -> bool,
    slow: fn(usize) -> Duration,
    /// Whether record `i` has an output (one without is finished at once).
    writes: fn(usize) -> bool,
    /// Whether record `i`'s first run fails (the default policy restarts the shard).
    fails_once: fn(usize) -> bool,
    failed: Arc<Mutex<BTreeSet<usize>>>,
    computed: Arc<Mutex<Vec<(&'static str, usize)>>>,
}

impl Handling {
    fn new(open: &watch::Sender<bool>) -> Self {
        Self {
            open: open.subscribe(),
            stuck: |_| false,
            fails: |_| false,
            slow: |_| Duration::from_millis(20),
            writes: |_| true,
            fails_once: |_| false,
            failed: Arc::default(),
            computed: Arc::default(),
        }
    }

    /// Records computed by `worker`.
    fn by(&self, worker: &str) -> BTreeSet<usize> {
        let computed = self.computed.lock().unwrap();
        computed
            .iter()
            .filter(|(w, _)| *w == worker)
            .map(|(_, i)| *i)
            .collect()
    }

    /// The handler of worker `worker`: record `i` adds 1 to item `out-{i}`, so a second
    /// commit of it shows as a count of 2.
    fn handler(
        &self,
        worker: &'static str,
    ) -> impl Fn(Record) -> Computing + Send + Sync + 'static + use<> {
        let this = self.clone();
        move |record: Record| {
            let this = this.clone();
            Box::pin(async move {
                let i = data(&record);
                if (this.stuck)(i) {
                    let mut open = this.open.clone();
                    open.wait_for(|open| *open).await.unwrap();
                }
                sleep((this.slow)(i)).await;
                if (this.fails)(i)
                    || ((this.fails_once)(i) && this.failed.lock().unwrap().insert(i))
                {
                    return Err("injected".into());
                }
                this.computed.lock().unwrap().push((worker, i));
                if !(this.writes)(i) {
                    return Ok(Vec::new());
                }
                Ok(vec![MemoryWrite::add(out(i), 1)])
            })
        }
    }
}

/// A handler's run: the record's writes.
type Computing = std::pin::Pin<Box<dyn Future<Output = Result<Vec<MemoryWrite>, BoxError>> + Send>>;

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

/// Worker `id` as its own process of `faults`, with a dead-letter sink.
fn run<F: ProcessorFactory>(
    id: &str,
    (stream, store, faults): (&MemoryStream, &MemoryLeaseStore, &Faults),
    factory: F,
) -> Running {
    let w = Worker::builder(stream.client(id), store.client(id))
        .id(id)
        .config(config())
        .dead_letters(DeadLetters::new(MemorySink::new()))
        .build_with(factory)
        .unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        task: tokio::spawn(faults.run_as(id, w.run())),
    }
}

fn world() -> (MemoryStream, MemoryLeaseStore, Faults) {
    let faults = Faults::seeded(51);
    (
        MemoryStream::with_faults(1, faults.clone()),
        MemoryLeaseStore::with_faults(faults.clone()),
        faults,
    )
}

/// The factory of worker `id`: its outputs commit through its own store handle.
fn factory(
    id: &'static str,
    store: &MemoryLeaseStore,
    handling: &Handling,
) -> Parallel<WithOutputs<MemoryLeaseStore, impl OutputHandler<MemoryWrite> + use<>>> {
    Parallel::with_outputs(Arc::new(store.client(id)), handling.handler(id))
        .max_in_flight(8)
        .commit_every(5)
        .commit_interval(Duration::from_millis(500))
}

fn checkpoint(store: &MemoryLeaseStore) -> Checkpoint {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    lease.expect("the shard's lease").checkpoint
}

/// The records whose output is committed.
fn committed(store: &MemoryLeaseStore) -> BTreeSet<usize> {
    store
        .outputs()
        .keys()
        .map(|k| k.trim_start_matches("out-").parse().unwrap())
        .collect()
}

/// Checks the store's own history: each output committed at most once (its count, and one
/// commit holding it), every committed output at or before its commit's checkpoint, the
/// row's checkpoint never moving back, and every checkpoint it ever held covering only
/// records whose outputs had committed by then (all but `without`, which have none).
fn assert_in_step(
    store: &MemoryLeaseStore,
    positions: &[ExtendedSequenceNumber],
    without: &[usize],
) {
    let index: BTreeMap<&ExtendedSequenceNumber, usize> =
        positions.iter().enumerate().map(|(i, p)| (p, i)).collect();
    let mut when: BTreeMap<usize, u64> = BTreeMap::new();
    for commit in store.applied_commits() {
        let Checkpoint::Sequence(through) = &commit.checkpoint else {
            panic!("a commit checkpointed {}", commit.checkpoint);
        };
        for write in &commit.writes {
            let i: usize = write.key.trim_start_matches("out-").parse().unwrap();
            assert!(
                positions[i] <= *through,
                "record {i}'s output committed with checkpoint {through}, before its record"
            );
            let first = when.insert(i, commit.seq);
            assert!(first.is_none(), "record {i}'s output committed twice");
        }
    }
    for (i, item) in store.outputs() {
        assert_eq!(item.count, 1, "{i} applied {} times", item.count);
    }
    let last = when.values().max().copied().unwrap_or_default();
    let mut furthest: Option<ExtendedSequenceNumber> = None;
    for event in store.journal() {
        if event.lease.key.as_str() != SHARD {
            continue;
        }
        if let Checkpoint::Sequence(at) = &event.lease.checkpoint {
            assert!(
                furthest.as_ref().is_none_or(|f| f <= at),
                "the checkpoint moved back to {at} ({} by {})",
                event.operation,
                event.client
            );
            furthest = Some(at.clone());
        }
        if event.lease.checkpoint == Checkpoint::ShardEnd {
            assert!(
                last < event.seq,
                "SHARD_END before the last output committed"
            );
        }
        let Checkpoint::Sequence(at) = &event.lease.checkpoint else {
            continue;
        };
        for (position, i) in index.range::<&ExtendedSequenceNumber, _>(..=at) {
            if without.contains(i) {
                continue;
            }
            let committed = when.get(i).is_some_and(|seq| *seq <= event.seq);
            assert!(
                committed,
                "the checkpoint reached {at} ({} by {}) before record {i}'s output ({position}) \
                 committed",
                event.operation, event.client
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn out_of_order_outputs_commit_once_as_the_watermark_passes_them_behind_a_stuck_key() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(false);
    let mut handling = Handling::new(&open);
    handling.stuck = |i| i == 4;
    let w = run(
        "a",
        (&stream, &store, &faults),
        factory("a", &store, &handling),
    );
    // Everything but key-4 (4 and the four records behind it) is computed.
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS - 5
    });
    assert!(computed.await.is_some(), "the other keys were computed");
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        committed(&store),
        (0..4).collect(),
        "only the records before the stuck one committed: the rest wait for it"
    );
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(positions[3].clone())
    );
    open.send_replace(true);
    let all = wait_until(Duration::from_secs(30), || {
        committed(&store).len() == RECORDS
    });
    assert!(
        all.await.is_some(),
        "every output committed once the key moved"
    );
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(positions[RECORDS - 1].clone())
    );
    assert_in_step(&store, &positions, &[]);
    // Fewer commits than records: they are batched.
    let commits = store.applied_commits().len();
    assert!(commits < RECORDS, "{commits} commits for {RECORDS} records");
}

#[tokio::test(start_paused = true)]
async fn a_worker_killed_with_outputs_computed_leaves_them_to_the_next_holder_once() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(false);
    let mut handling = Handling::new(&open);
    handling.stuck = |i| i == 4;
    let a = run(
        "a",
        (&stream, &store, &faults),
        factory("a", &store, &handling),
    );
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS - 5
    });
    assert!(computed.await.is_some());
    sleep(Duration::from_secs(2)).await;
    assert_eq!(committed(&store), (0..4).collect());
    // Killed: never runs again.
    faults.pause("a");
    open.send_replace(true);
    let b = run(
        "b",
        (&stream, &store, &faults),
        factory("b", &store, &handling),
    );
    let all = wait_until(Duration::from_secs(60), || {
        committed(&store).len() == RECORDS
    });
    assert!(all.await.is_some(), "the next holder committed the rest");
    assert_eq!(
        handling.by("b"),
        (4..RECORDS).collect(),
        "the next holder computed again what was computed and not committed, and only that"
    );
    b.shutdown.shutdown();
    b.task.await.unwrap().unwrap();
    a.task.abort();
    assert_in_step(&store, &positions, &[]);
    let clients: BTreeSet<String> = store
        .applied_commits()
        .into_iter()
        .map(|c| c.client)
        .collect();
    assert_eq!(clients, ["a", "b"].map(String::from).into());
}

#[tokio::test(start_paused = true)]
async fn a_frozen_worker_that_thaws_commits_nothing_once_the_lease_moved() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(true);
    let handling = Handling::new(&open);
    // Computed at once; due to commit only 10 s later.
    let late = factory("a", &store, &handling)
        .commit_every(1_000)
        .commit_interval(Duration::from_secs(10));
    let a = run("a", (&stream, &store, &faults), late);
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS
    });
    assert!(computed.await.is_some());
    faults.pause("a");
    let b = run(
        "b",
        (&stream, &store, &faults),
        factory("b", &store, &handling),
    );
    let all = wait_until(Duration::from_secs(60), || {
        committed(&store).len() == RECORDS
    });
    assert!(all.await.is_some(), "the next holder committed everything");
    // a thaws past its commit's due time, its lease long gone.
    sleep(Duration::from_secs(10)).await;
    faults.resume("a");
    sleep(Duration::from_secs(15)).await;
    assert!(
        store.applied_commits().iter().all(|c| c.client == "b"),
        "the frozen worker committed nothing"
    );
    b.shutdown.shutdown();
    b.task.await.unwrap().unwrap();
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    assert_in_step(&store, &positions, &[]);
}

#[tokio::test(start_paused = true)]
async fn a_commit_after_the_lease_moved_is_refused_and_its_tenure_commits_nothing_more() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(false);
    let mut handling = Handling::new(&open);
    handling.stuck = |i| i == 4;
    let eager = factory("a", &store, &handling).commit_every(1);
    let a = run("a", (&stream, &store, &faults), eager);
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS - 5 && committed(&store).len() == 4
    });
    assert!(computed.await.is_some());
    // Another worker takes the lease, as after a failover a has not noticed yet (frozen,
    // partitioned, a renewer behind); a's stuck record then completes, and its commit is due
    // at once.
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    let zombie = lease.clone().unwrap().fence.unwrap();
    let thief = WorkerId::new("b");
    let before = store.applied_commits().len();
    store
        .client("b")
        .take(&lease.unwrap(), &thief)
        .await
        .unwrap();
    open.send_replace(true);
    let refused = wait_until(Duration::from_secs(1), || {
        store.refused_commits().iter().any(|c| c.client == "a")
    });
    assert!(refused.await.is_some(), "a's commit reached the store");
    let refused = store.refused_commits();
    assert!(
        refused
            .iter()
            .all(|c| c.reason == Refusal::LeaseRow && c.fence == zombie),
        "refused by the lease row: {refused:?}"
    );
    // Nothing more from that tenure; a takes the lease again once b's expires, and commits
    // the rest under its new fence.
    let all = wait_until(Duration::from_secs(60), || {
        committed(&store).len() == RECORDS
    });
    assert!(all.await.is_some());
    let zombies = |store: &MemoryLeaseStore| {
        let commits = store.applied_commits().into_iter();
        commits.filter(|c| c.fence == zombie).count()
    };
    assert_eq!(
        zombies(&store),
        before,
        "the zombie tenure committed after the take"
    );
    assert_eq!(
        refused.len(),
        1,
        "one refusal, then the tenure stopped: {refused:?}"
    );
    a.shutdown.shutdown();
    a.task.await.unwrap().unwrap();
    assert_in_step(&store, &positions, &[]);
}

#[tokio::test(start_paused = true)]
async fn a_dead_lettered_record_commits_no_output_and_the_others_commit_once() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(true);
    let mut handling = Handling::new(&open);
    handling.fails = |i| i == 7;
    let policy =
        FailurePolicy::dead_letter(2).backoff(Duration::from_millis(200), Duration::from_secs(1));
    let sink = MemorySink::new();
    let w = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config())
        .dead_letters(DeadLetters::new(sink.clone()))
        .build_with(factory("a", &store, &handling).on_failure(policy))
        .unwrap();
    let shutdown = w.shutdown_handle();
    let task = tokio::spawn(faults.run_as("a", w.run()));
    let others = wait_until(Duration::from_secs(30), || {
        committed(&store).len() == RECORDS - 1
    });
    assert!(
        others.await.is_some(),
        "every other record's output committed"
    );
    let letters: Vec<usize> = sink.letters().iter().map(|l| data(&l.record)).collect();
    assert_eq!(letters, vec![7]);
    shutdown.shutdown();
    task.await.unwrap().unwrap();
    assert!(
        !committed(&store).contains(&7),
        "the failed record wrote nothing"
    );
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(positions[RECORDS - 1].clone()),
        "the checkpoint passed the dead-lettered record"
    );
    assert_in_step(&store, &positions, &[7]);
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_commits_everything_computed_and_what_was_in_flight() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let (open, _) = watch::channel(true);
    let mut handling = Handling::new(&open);
    handling.slow = |i| Duration::from_millis(if i == 20 { 4_000 } else { 20 });
    let factory = factory("a", &store, &handling)
        .commit_every(1_000)
        .commit_interval(Duration::from_secs(60));
    let w = run("a", (&stream, &store, &faults), factory);
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS - 1
    });
    assert!(computed.await.is_some());
    assert!(committed(&store).is_empty(), "nothing was due yet");
    assert_eq!(checkpoint(&store), Checkpoint::TrimHorizon);
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    assert_eq!(
        committed(&store).len(),
        RECORDS,
        "record 20 finished in the drain"
    );
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(positions[RECORDS - 1].clone())
    );
    assert_in_step(&store, &positions, &[]);
}

#[tokio::test(start_paused = true)]
async fn the_shard_ends_once_every_output_committed() {
    let (stream, store, faults) = world();
    let positions = fill(&stream);
    let parent = kcl_core::ShardId::new(SHARD);
    stream.split(&parent).unwrap();
    let (open, _) = watch::channel(false);
    let mut handling = Handling::new(&open);
    handling.stuck = |i| i == 4;
    let late = factory("a", &store, &handling)
        .commit_every(1_000)
        .commit_interval(Duration::from_secs(3));
    let w = run("a", (&stream, &store, &faults), late);
    let computed = wait_until(Duration::from_secs(30), || {
        handling.by("a").len() == RECORDS - 5
    });
    assert!(computed.await.is_some());
    sleep(Duration::from_secs(5)).await;
    assert_eq!(committed(&store), (0..4).collect());
    assert_ne!(checkpoint(&store), Checkpoint::ShardEnd);
    open.send_replace(true);
    let ended = wait_until(Duration::from_secs(30), || {
        checkpoint(&store) == Checkpoint::ShardEnd
    });
    let took = ended.await.expect("the shard ended");
    assert!(
        took <= Duration::from_secs(4),
        "SHARD_END waited at most one commit interval: {took:?}"
    );
    assert_eq!(committed(&store).len(), RECORDS);
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
    assert_in_step(&store, &positions, &[]);
}

#[test]
fn parking_keys_is_refused_with_outputs() {
    let (open, _) = watch::channel(true);
    let handling = Handling::new(&open);
    let store = MemoryLeaseStore::new();
    let factory = factory("a", &store, &handling)
        .on_failure(FailurePolicy::dead_letter(1))
        .park_keys(true);
    let error = factory.check().unwrap_err();
    assert_eq!(error.key, "Parallel::park_keys");
}

/// Two workers on a store that fails, throttles, answers late or never, applies writes whose
/// answers it loses and lands stragglers late, with each worker frozen past the failover time
/// now and then: every output commits exactly once and in step with the checkpoints.
#[tokio::test(start_paused = true)]
async fn outputs_commit_once_through_store_faults_freezes_and_takeovers() {
    const N: usize = 300;
    let seeds = std::env::var("OUTPUTS_SEEDS").map_or(SEEDS, |s| s.parse().unwrap());
    for seed in 0..seeds {
        let faults = Faults::seeded(seed);
        let (stream, store) = (
            MemoryStream::with_faults(1, faults.clone()),
            MemoryLeaseStore::with_faults(faults.clone()),
        );
        let positions = fill_n(&stream, N);
        let (open, _) = watch::channel(true);
        let mut handling = Handling::new(&open);
        handling.slow = |i| Duration::from_millis(50 + (i as u64 * 37) % 200);
        handling.writes = |i| i % 4 != 3;
        handling.fails_once = |i| i % 25 == 12;
        faults.set_error_rate(0.4);
        faults.set_throttle_rate(0.05);
        faults.set_ambiguous_rate(0.3);
        faults.set_stragglers(0.05, Duration::from_secs(3));
        faults.set_max_latency(Duration::from_millis(40));
        let world = (&stream, &store, &faults);
        let a = run("a", world, factory("a", &store, &handling));
        let b = run("b", world, factory("b", &store, &handling));
        let mut round = 0;
        let all = wait_until(Duration::from_secs(900), || {
            round += 1;
            // Every 10 s, one worker or the other is frozen for 7 s (past the failover time).
            let frozen = ["a", "b"][(round / 1_000) % 2];
            if round % 1_000 == 100 {
                faults.pause(frozen);
            } else if round % 1_000 == 800 {
                faults.resume(frozen);
            }
            committed(&store).len() == N - N / 4
        });
        assert!(all.await.is_some(), "seed {seed}: every output committed");
        faults.clear();
        for w in [a, b] {
            w.shutdown.shutdown();
            w.task.await.unwrap().unwrap();
        }
        let without: Vec<usize> = (3..N).step_by(4).collect();
        assert_in_step(&store, &positions, &without);
    }
}

/// Seeds of the faults test; `OUTPUTS_SEEDS` runs more.
const SEEDS: u64 = 20;
