//! The failure policy on the in-memory backends, under paused time: a poison record costs its
//! own key a bounded delay and the other keys nothing, is dead-lettered whole after its tries,
//! and the checkpoint passes it only once the sink took it; batches are bisected or cut where
//! the processor says.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use kcl_core::failure::{
    BatchFailed, DeadLetter, DeadLetterSink, DeadLetters, FailurePolicy, Permanent, Reason,
};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, ExtendedSequenceNumber, Parallel, ProcessRecordsInput,
    ProcessorFactory, Record, RecordProcessor, ShardId, ShutdownHandle, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const SHARD: &str = "shardId-000000000000";

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(500))
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

impl Running {
    async fn stop(self) {
        self.shutdown.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

fn run<F: ProcessorFactory>(
    config: WorkerConfig,
    world: (&MemoryStream, &MemoryLeaseStore),
    sink: &MemorySink,
    factory: F,
) -> Running {
    run_as("a", config, world, sink, factory)
}

fn run_as<F: ProcessorFactory>(
    id: &str,
    config: WorkerConfig,
    (stream, store): (&MemoryStream, &MemoryLeaseStore),
    sink: &MemorySink,
    factory: F,
) -> Running {
    let w = Worker::builder(stream.client(id), store.client(id))
        .id(id)
        .config(config)
        .dead_letters(
            DeadLetters::new(sink.clone())
                .application("app")
                .stream("orders"),
        )
        .build_with(factory)
        .unwrap();
    Running {
        shutdown: w.shutdown_handle(),
        task: tokio::spawn(w.run()),
    }
}

/// Whether the checkpoint is at or past `position`.
fn passed(store: &MemoryLeaseStore, position: &ExtendedSequenceNumber) -> bool {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    match lease.map(|l| l.checkpoint) {
        Some(Checkpoint::Sequence(at)) => at >= *position,
        _ => false,
    }
}

/// The three backends of a test: a one-shard stream, a lease table, a sink.
fn world() -> (MemoryStream, MemoryLeaseStore, MemorySink) {
    (
        MemoryStream::new(1),
        MemoryLeaseStore::new(),
        MemorySink::new(),
    )
}

/// `Parallel` whose handler fails the record `poison` with `Permanent`, parking its key.
fn parking(runs: &Runs) -> Parallel<impl kcl_core::RecordHandler> {
    Parallel::new(handler(runs, "poison", || Permanent::new("bad").into()))
        .on_failure(FailurePolicy::dead_letter(5))
        .park_keys(true)
}

/// Waits (up to 30 s) until the checkpoint is at or past `position`.
async fn until_passed(store: &MemoryLeaseStore, position: &ExtendedSequenceNumber) {
    let done = wait_until(Duration::from_secs(30), || passed(store, position)).await;
    assert!(done.is_some(), "the checkpoint never reached {position}");
}

/// Handler runs: (data, started, ended, ok).
type Runs = Arc<Mutex<Vec<(String, Instant, Instant, bool)>>>;

/// A handler that takes 10 ms a record and fails on the record whose data is `poison`
/// (with `error`), recording its runs.
fn handler(
    runs: &Runs,
    poison: &'static str,
    error: fn() -> BoxError,
) -> impl Fn(Record) -> std::pin::Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    move |record: Record| {
        let runs = runs.clone();
        Box::pin(async move {
            let started = Instant::now();
            sleep(Duration::from_millis(10)).await;
            let data = String::from_utf8_lossy(&record.data).into_owned();
            let ok = data != poison;
            runs.lock()
                .unwrap()
                .push((data, started, Instant::now(), ok));
            if ok { Ok(()) } else { Err(error()) }
        })
    }
}

/// Puts records 0..n, record `i` with data `i` (or `poison` at `at`) and key `key-{i % keys}`.
fn fill(stream: &MemoryStream, n: usize, keys: usize, at: usize, poison: &str) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let data = if i == at {
                poison.to_owned()
            } else {
                i.to_string()
            };
            stream.put(&format!("key-{}", i % keys), data)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_poison_record_costs_only_its_key_and_is_dead_lettered_whole_after_its_tries() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 500, 50, 120, "poison");
    let poison = records[120].clone();
    let runs = Runs::default();
    let policy =
        FailurePolicy::dead_letter(3).backoff(Duration::from_secs(2), Duration::from_secs(8));
    let factory = Parallel::new(handler(&runs, "poison", || "boom".into()))
        .max_in_flight(10)
        .on_failure(policy);
    let w = run(config(), (&stream, &store), &sink, factory);
    // key-20 holds the poison record (120) and waits behind it; the 49 other keys do not.
    let other_key = |data: &str| data.parse::<usize>().is_ok_and(|i| i % 50 != 20);
    let others_done = wait_until(Duration::from_secs(60), || {
        runs.lock()
            .unwrap()
            .iter()
            .filter(|r| r.3 && other_key(&r.0))
            .count()
            == 490
    });
    let took = others_done
        .await
        .expect("every record of the other keys finished");
    assert!(
        took < Duration::from_secs(2),
        "the other keys were not held: {took:?}"
    );
    let letters = sink.letters();
    assert!(
        letters.is_empty(),
        "the other records finished while the poison one still had tries"
    );
    assert!(
        !passed(&store, &poison.position()),
        "the checkpoint waits for the poison record"
    );
    assert!(
        wait_until(Duration::from_secs(30), || sink.letters().len() == 1)
            .await
            .is_some()
    );
    let letter = &sink.letters()[0];
    assert_eq!(
        letter.record, poison,
        "the whole record: payload, key, sequence"
    );
    assert_eq!((letter.attempts, &letter.reason), (3, &Reason::Attempts));
    assert_eq!(
        (letter.first_error.as_str(), letter.last_error.as_str()),
        ("boom", "boom")
    );
    assert_eq!(letter.application.as_deref(), Some("app"));
    assert_eq!(letter.shard.as_str(), SHARD);
    let last = records.last().unwrap().position();
    assert!(
        wait_until(Duration::from_secs(10), || passed(&store, &last))
            .await
            .is_some()
    );
    let runs = runs.lock().unwrap().clone();
    let poison_runs: Vec<_> = runs.iter().filter(|r| r.0 == "poison").collect();
    assert_eq!(poison_runs.len(), 3, "tried three times");
    // The gaps between tries are the backoff: 2 s, then 4 s.
    let gap = |a: usize| poison_runs[a + 1].1 - poison_runs[a].2;
    assert_eq!((gap(0).as_secs(), gap(1).as_secs()), (2, 4));
    // Its key waited (order per key) and ran on after the dead letter.
    assert_eq!(runs.iter().filter(|r| r.3).count(), 499);
    let after: Vec<_> = runs
        .iter()
        .filter(|r| r.0 == "170" || r.0 == "470")
        .collect();
    assert_eq!(after.len(), 2);
    assert!(
        after.iter().all(|r| r.1 >= poison_runs[2].2),
        "its key's later records waited"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refusing_sink_holds_the_checkpoint_and_loses_nothing() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 100, 10, 5, "poison");
    let runs = Runs::default();
    sink.refuse(true);
    let policy =
        FailurePolicy::dead_letter(1).backoff(Duration::from_millis(500), Duration::from_secs(1));
    let factory = Parallel::new(handler(&runs, "poison", || "boom".into())).on_failure(policy);
    let w = run(config(), (&stream, &store), &sink, factory);
    sleep(Duration::from_secs(10)).await;
    assert!(
        sink.refused() >= 5,
        "the sink was retried: {}",
        sink.refused()
    );
    assert!(
        !passed(&store, &records[5].position()),
        "nothing passes the refused record"
    );
    sink.refuse(false);
    let last = records.last().unwrap().position();
    assert!(
        wait_until(Duration::from_secs(10), || passed(&store, &last))
            .await
            .is_some()
    );
    assert_eq!(sink.letters().len(), 1);
    assert_eq!(sink.letters()[0].record, records[5]);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_parked_key_runs_none_of_its_later_records() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 60, 6, 3, "poison");
    let runs = Runs::default();
    let factory = parking(&runs);
    let w = run(config(), (&stream, &store), &sink, factory);
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    let letters = sink.letters();
    // key-3: records 3 (the poison, permanent: one try), then 9, 15, ..., 57 parked behind it.
    let parked: Vec<_> = letters
        .iter()
        .map(|l| String::from_utf8_lossy(&l.record.data).into_owned())
        .collect();
    let expected: Vec<_> = std::iter::once("poison".to_owned())
        .chain((9..60).step_by(6).map(|i| i.to_string()))
        .collect();
    assert_eq!(parked, expected, "the key's records, in order");
    assert_eq!(
        (letters[0].attempts, &letters[0].reason),
        (1, &Reason::Permanent)
    );
    assert!(
        letters
            .iter()
            .all(|l| l.parked_key == letters[0].parked_key && l.parked_key.is_some())
    );
    assert!(
        matches!(&letters[1].reason, Reason::Parked { behind } if *behind == records[3].position())
    );
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.iter().filter(|r| r.0 == "poison").count(), 1);
    for parked in &expected[1..] {
        assert!(
            runs.iter().all(|r| &r.0 != parked),
            "{parked} of the parked key ran"
        );
    }
    assert_eq!(runs.iter().filter(|r| r.3).count(), 60 - expected.len());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_parked_key_stays_parked_for_the_next_owner() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 12, 6, 3, "poison");
    let runs = Runs::default();
    let factory = || parking(&runs);
    let a = run_as("a", config(), (&stream, &store), &sink, factory());
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    a.stop().await;
    let lease = store
        .leases()
        .into_iter()
        .find(|l| l.key.as_str() == SHARD)
        .unwrap();
    assert_eq!(
        lease.parked_keys.len(),
        1,
        "the lease row parks the key: {lease:?}"
    );
    // New records of the parked key (key-3) and another, read by the next owner.
    let later = [
        stream.put("key-3", "later-3"),
        stream.put("key-4", "later-4"),
    ];
    let b = run_as("b", config(), (&stream, &store), &sink, factory());
    assert!(
        wait_until(Duration::from_secs(30), || passed(
            &store,
            &later[1].position()
        ))
        .await
        .is_some()
    );
    let letters: Vec<_> = sink
        .letters()
        .iter()
        .map(|l| String::from_utf8_lossy(&l.record.data).into_owned())
        .collect();
    assert_eq!(
        letters,
        ["poison", "9", "later-3"],
        "parked by whoever holds the shard"
    );
    let ran: Vec<_> = runs.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert!(ran.contains(&"later-4".to_owned()) && !ran.contains(&"later-3".to_owned()));
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unparked_key_runs_again_on_the_holder() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 12, 6, 3, "poison");
    let runs = Runs::default();
    let factory = parking(&runs);
    let w = run(config(), (&stream, &store), &sink, factory);
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    let parked = sink.letters()[0].parked_key.clone().unwrap();
    let changed = kcl_core::admin::unpark(&store, &parked).await.unwrap();
    assert_eq!(changed.len(), 1);
    assert!(store.leases().iter().all(|l| l.parked_keys.is_empty()));
    // The holder sees it at its next renewal (a third of the failover time).
    sleep(Duration::from_secs(3)).await;
    let again = stream.put("key-3", "again-3");
    assert!(
        wait_until(Duration::from_secs(30), || passed(
            &store,
            &again.position()
        ))
        .await
        .is_some()
    );
    let ran: Vec<_> = runs.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert!(
        ran.contains(&"again-3".to_owned()),
        "the unparked key ran: {ran:?}"
    );
    assert_eq!(sink.letters().len(), 2, "nothing more was parked");
    w.stop().await;
}

/// A batch processor that fails a batch holding the record with data `poison`, naming it
/// (`BatchFailed`) or not; it records every delivery and which hooks succeeded.
#[derive(Clone, Default)]
struct Batches {
    /// Per data: deliveries, and deliveries in a hook that returned Ok.
    seen: Arc<Mutex<BTreeMap<String, (u32, u32)>>>,
    hooks: Arc<Mutex<u32>>,
}

struct Failing {
    batches: Batches,
    names: bool,
}

impl RecordProcessor for Failing {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        *self.batches.hooks.lock().unwrap() += 1;
        let data: Vec<String> = input
            .records()
            .iter()
            .map(|r| String::from_utf8_lossy(&r.data).into_owned())
            .collect();
        let bad = data.iter().position(|d| d == "poison");
        {
            let mut seen = self.batches.seen.lock().unwrap();
            for (i, d) in data.iter().enumerate() {
                let entry = seen.entry(d.clone()).or_default();
                entry.0 += 1;
                // Named: the records before the bad one are processed.
                if bad.is_none() || (self.names && i < bad.unwrap_or(0)) {
                    entry.1 += 1;
                }
            }
        }
        match bad {
            None => Ok(checkpointer.checkpoint().await?),
            Some(i) if self.names => Err(BatchFailed::at(&input.records()[i], "boom").into()),
            Some(_) => Err("boom".into()),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_batch_is_bisected_to_its_bad_record_within_the_stated_bound() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 100, 100, 37, "poison");
    let batches = Batches::default();
    let policy =
        FailurePolicy::dead_letter(2).backoff(Duration::from_millis(100), Duration::from_secs(1));
    let config = config().max_records(100).failure(policy);
    let factory = {
        let batches = batches.clone();
        move |_: &ShardId| Failing {
            batches: batches.clone(),
            names: false,
        }
    };
    let w = run(config, (&stream, &store), &sink, factory);
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    assert_eq!(sink.letters().len(), 1);
    assert_eq!(sink.letters()[0].record, records[37]);
    let seen = batches.seen.lock().unwrap().clone();
    // One batch of 100: ⌈log2 100⌉ = 7 levels.
    for (data, (delivered, ok)) in seen.iter() {
        if data == "poison" {
            assert_eq!(*ok, 0);
            assert!(
                *delivered <= 1 + 7 + 1,
                "poison delivered {delivered} times"
            );
        } else {
            assert_eq!(*ok, 1, "{data} succeeded once, never again");
            assert!(*delivered <= 1 + 7, "{data} delivered {delivered} times");
        }
    }
    assert_eq!(seen.len(), 100);
    let hooks = *batches.hooks.lock().unwrap();
    // The documented bound: the batch, at most 2 × ⌈log2 n⌉ extra deliveries of parts, and the
    // lone record's tries after its first (attempts − 1).
    assert!(hooks <= 1 + 2 * 7 + 1, "{hooks} deliveries");
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_named_record_is_retried_from_where_it_failed_then_skipped() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 50, 50, 20, "poison");
    let batches = Batches::default();
    let config = config().max_records(50).failure(FailurePolicy::skip(3));
    let factory = {
        let batches = batches.clone();
        move |_: &ShardId| Failing {
            batches: batches.clone(),
            names: true,
        }
    };
    let w = run(config, (&stream, &store), &sink, factory);
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    assert!(sink.letters().is_empty(), "skipped, not dead-lettered");
    let seen = batches.seen.lock().unwrap().clone();
    for (data, (delivered, ok)) in seen.iter() {
        let i: usize = data.parse().unwrap_or(20);
        let expected = match i {
            0..20 => (1, 1),
            20 => (3, 0),
            _ => (4, 1),
        };
        assert_eq!((*delivered, *ok), expected, "record {data}");
    }
    assert_eq!(*batches.hooks.lock().unwrap(), 4);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_record_given_up_at_the_tail_is_checkpointed_and_not_given_up_again() {
    let (stream, store, sink) = world();
    let records = fill(&stream, 5, 5, 4, "poison");
    let batches = Batches::default();
    let config = || config().failure(FailurePolicy::dead_letter(2));
    let factory = || {
        let batches = batches.clone();
        move |_: &ShardId| Failing {
            batches: batches.clone(),
            names: false,
        }
    };
    let a = run_as("a", config(), (&stream, &store), &sink, factory());
    let tail = records[4].position();
    until_passed(&store, &tail).await;
    a.stop().await;
    // The next owner starts after it: no second letter.
    let b = run_as("b", config(), (&stream, &store), &sink, factory());
    sleep(Duration::from_secs(10)).await;
    b.stop().await;
    assert_eq!(sink.letters().len(), 1);
}

/// A sink whose first put never answers.
#[derive(Clone, Default)]
struct HangsOnce(Arc<Mutex<(usize, Vec<DeadLetter>)>>);

impl DeadLetterSink for HangsOnce {
    async fn put(&self, letter: &DeadLetter) -> Result<(), kcl_core::BackendError> {
        let first = {
            let mut state = self.0.lock().unwrap();
            state.0 += 1;
            state.0 == 1
        };
        if first {
            std::future::pending::<()>().await;
        }
        self.0.lock().unwrap().1.push(letter.clone());
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_does_not_answer_is_timed_out_and_tried_again() {
    let (stream, store) = (MemoryStream::new(1), MemoryLeaseStore::new());
    let records = fill(&stream, 20, 5, 7, "poison");
    let runs = Runs::default();
    let sink = HangsOnce::default();
    let factory = Parallel::new(handler(&runs, "poison", || "boom".into()))
        .on_failure(FailurePolicy::dead_letter(1));
    let w = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config().call_timeout(Duration::from_secs(2)))
        .dead_letters(DeadLetters::new(sink.clone()))
        .build_with(factory)
        .unwrap();
    let (stop, task) = (w.shutdown_handle(), tokio::spawn(w.run()));
    let last = records.last().unwrap().position();
    until_passed(&store, &last).await;
    let (puts, kept) = sink.0.lock().unwrap().clone();
    assert_eq!(
        (puts, kept.len()),
        (2, 1),
        "timed out once, accepted the second time"
    );
    stop.shutdown();
    task.await.unwrap().unwrap();
}

#[test]
fn a_policy_that_dead_letters_without_a_sink_is_refused_by_build() {
    let build = |config: WorkerConfig| {
        Worker::builder(MemoryStream::new(1), MemoryLeaseStore::new())
            .config(config)
            .build_with(Parallel::new(|_: Record| async { Ok::<(), BoxError>(()) }))
            .map(|_| ())
    };
    let error = build(config().failure(FailurePolicy::dead_letter(3))).unwrap_err();
    assert_eq!(error.key, "failure.exhausted");
    let parallel = Worker::builder(MemoryStream::new(1), MemoryLeaseStore::new())
        .build_with(
            Parallel::new(|_: Record| async { Ok::<(), BoxError>(()) })
                .on_failure(FailurePolicy::dead_letter(3)),
        )
        .unwrap_err();
    assert_eq!(parallel.key, "Parallel::on_failure");
    assert!(build(config().failure(FailurePolicy::skip(3))).is_ok());
}
