//! One poison record among 10,000 on one shard: what it costs the other keys, its own key,
//! and a batch processor's bisect, against blocking (the default: the shard restarts until the
//! record succeeds). Real time on the in-memory backends, a 2-thread runtime; the `Parallel`
//! rows are medians of several runs.
//!
//! `cargo bench -p kcl-core --bench poison`
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kcl_core::failure::{DeadLetters, FailurePolicy};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, Parallel, ProcessRecordsInput, ProcessorFactory, Record,
    RecordProcessor, ShardId, Worker, WorkerConfig,
};

const RECORDS: usize = 10_000;
const KEYS: usize = 50;
const POISON: usize = 4_321;
const LATENCY: Duration = Duration::from_millis(1);
const RUNS: usize = 3;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn fill(stream: &MemoryStream, poison: bool) -> Vec<Record> {
    (0..RECORDS)
        .map(|i| {
            let data = if poison && i == POISON {
                "poison".to_owned()
            } else {
                i.to_string()
            };
            stream.put(&format!("k{}", i % KEYS), data)
        })
        .collect()
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .taker_interval(Duration::from_millis(100))
        .idle_time_between_reads(Duration::from_millis(50))
        .ack_checkpoint_interval(Duration::from_millis(200))
        .max_unacknowledged(RECORDS)
}

fn worker<F: ProcessorFactory>(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    config: WorkerConfig,
    factory: F,
) -> kcl_core::Worker<kcl_core::memory::MemoryStream, MemoryLeaseStore, F> {
    Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config)
        .dead_letters(DeadLetters::new(MemorySink::new()))
        .build_with(factory)
        .unwrap()
}

/// Per record: when its handler finished with `Ok` (since the start), and when each run started.
#[derive(Default)]
struct Runs {
    finished: BTreeMap<usize, Duration>,
    started: Vec<(usize, Duration)>,
}

/// A `Parallel` run: per record, when it finished, and the runs; stops after `limit`.
fn parallel(policy: FailurePolicy, poison: bool, limit: Duration) -> (Runs, bool) {
    runtime().block_on(async {
        let (stream, store) = (MemoryStream::new(1), MemoryLeaseStore::new());
        let records = fill(&stream, poison);
        let runs = Arc::new(Mutex::new(Runs::default()));
        let t0 = Instant::now();
        let handler = {
            let runs = runs.clone();
            move |record: Record| {
                let runs = runs.clone();
                async move {
                    let data = String::from_utf8_lossy(&record.data).into_owned();
                    let i = data.parse().unwrap_or(POISON);
                    runs.lock().unwrap().started.push((i, t0.elapsed()));
                    tokio::time::sleep(LATENCY).await;
                    if data == "poison" {
                        return Err(BoxError::from("poison"));
                    }
                    runs.lock()
                        .unwrap()
                        .finished
                        .entry(i)
                        .or_insert(t0.elapsed());
                    Ok(())
                }
            }
        };
        let factory = Parallel::new(handler).max_in_flight(10).on_failure(policy);
        let w = worker(&stream, &store, config(), factory);
        let stop = w.shutdown_handle();
        let task = tokio::spawn(w.run());
        let last = records.last().unwrap().position();
        let passed = || {
            store
                .leases()
                .iter()
                .any(|l| l.checkpoint == Checkpoint::Sequence(last.clone()))
        };
        while !passed() && t0.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = passed();
        stop.shutdown();
        let _ = task.await;
        let runs = std::mem::take(&mut *runs.lock().unwrap());
        (runs, done)
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The latest finish of the records of keys other than the poison's.
fn others_done(runs: &Runs) -> Duration {
    runs.finished
        .iter()
        .filter(|(i, _)| *i % KEYS != POISON % KEYS)
        .map(|(_, t)| *t)
        .max()
        .unwrap_or_default()
}

/// How long the poison's key was held: from the poison's first run to the next record of its
/// key starting.
fn key_held(runs: &Runs) -> Duration {
    let first = runs
        .started
        .iter()
        .find(|(i, _)| *i == POISON)
        .map(|(_, t)| *t);
    let next = runs
        .started
        .iter()
        .find(|(i, _)| *i == POISON + KEYS)
        .map(|(_, t)| *t);
    match (first, next) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    }
}

fn parallel_rows() {
    let policy = FailurePolicy::dead_letter(3);
    let mut clean = Vec::new();
    let mut poisoned = Vec::new();
    let mut held = Vec::new();
    for _ in 0..RUNS {
        let (runs, _) = parallel(policy.clone(), false, Duration::from_secs(60));
        clean.push(others_done(&runs).as_secs_f64());
        let (runs, done) = parallel(policy.clone(), true, Duration::from_secs(60));
        assert!(done, "the poison record was dead-lettered and passed");
        poisoned.push(others_done(&runs).as_secs_f64());
        held.push(key_held(&runs).as_secs_f64());
    }
    println!(
        "| Parallel, dead-letter after 3 tries (1 s, 2 s) | the other {} keys' last record done at {:.2} s (without the poison record: {:.2} s) | {:.2} s | passed it once dead-lettered |",
        KEYS - 1,
        median(poisoned),
        median(clean),
        median(held)
    );
    let (runs, done) = parallel(FailurePolicy::block(), true, Duration::from_secs(20));
    let after = runs.started.iter().filter(|(i, _)| *i > POISON).count();
    let distinct = runs
        .started
        .iter()
        .filter(|(i, _)| *i > POISON)
        .map(|(i, _)| *i)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    println!(
        "| Parallel, block (the default) | every key stops: the shard restarts from the watermark and fails again; in 20 s {distinct} of the {} records after the poison one ran ({after} runs in all, none counted) | 20 s and on | {} |",
        RECORDS - POISON - 1,
        if done { "passed it" } else { "never passed it" }
    );
}

/// A batch processor that fails a batch holding the poison record, without saying which.
struct Batches {
    deliveries: Arc<Mutex<(usize, BTreeMap<String, u32>)>>,
}

impl RecordProcessor for Batches {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let mut poisoned = false;
        {
            let mut d = self.deliveries.lock().unwrap();
            d.0 += 1;
            for r in input.records() {
                let data = String::from_utf8_lossy(&r.data).into_owned();
                poisoned |= data == "poison";
                *d.1.entry(data).or_default() += 1;
            }
        }
        if poisoned {
            return Err("poison".into());
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

fn bisect_row() {
    runtime().block_on(async {
        let (stream, store) = (MemoryStream::new(1), MemoryLeaseStore::new());
        let records = fill(&stream, true);
        let deliveries = Arc::new(Mutex::new((0, BTreeMap::new())));
        let factory = {
            let deliveries = deliveries.clone();
            move |_: &ShardId| Batches {
                deliveries: deliveries.clone(),
            }
        };
        let policy = FailurePolicy::dead_letter(3)
            .backoff(Duration::from_millis(100), Duration::from_secs(1));
        let w = worker(&stream, &store, config().failure(policy), factory);
        let stop = w.shutdown_handle();
        let t0 = Instant::now();
        let task = tokio::spawn(w.run());
        let last = records.last().unwrap().position();
        while !store.leases().iter().any(|l| l.checkpoint == Checkpoint::Sequence(last.clone())) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let took = t0.elapsed();
        stop.shutdown();
        let _ = task.await;
        let (hooks, per) = std::mem::take(&mut *deliveries.lock().unwrap());
        let most = per.iter().filter(|(d, _)| *d != "poison").map(|(_, n)| *n).max().unwrap_or(0);
        let delivered: u32 = per.values().sum();
        println!(
            "| batch processor, one batch of {RECORDS}, bisect, dead-letter after 3 tries | {} deliveries in all ({} extra parts, {} records delivered, at most {most} times a good record; bound 2 x 14 parts, 15 times) | {:.2} s to pass it | passed it once dead-lettered |",
            hooks,
            hooks - 1 - 2,
            delivered,
            took.as_secs_f64(),
        );
    });
}

fn main() {
    println!("| run | the other keys | the poison key held | checkpoint |");
    println!("| --- | --- | --- | --- |");
    parallel_rows();
    bisect_row();
}
