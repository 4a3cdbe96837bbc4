//! The failure policy end to end on the emulators (kinesis-mock, moto's DynamoDB and SQS),
//! through the real SDK clients: a `Parallel` worker with one poison record among 50 keys
//! lands it in SQS with its payload after its tries while the other keys keep finishing, and
//! checkpoints past it only then; the letter is redriven into the stream (kcl-aws's
//! `LetterStore` and `Redriver`, what `kcl-admin dead-letters redrive` runs) and a fixed
//! handler processes it. A batch processor that does not say which record failed is bisected
//! to it within the stated bound; a sink that refuses for 10 s holds the checkpoint and loses
//! nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kcl_aws::KinesisShardSource;
use kcl_aws::dead_letter::{LetterStore, Location, Redriver, SqsSink};
use kcl_core::failure::{DeadLetter, DeadLetterSink, DeadLetters, FailurePolicy};
use kcl_core::{
    BackendError, BoxError, Checkpoint, Checkpointer, ErrorKind, LeaseStore as _, Parallel,
    ProcessRecordsInput, ProcessorFactory, Record, RecordProcessor, ShardId, Worker, WorkerConfig,
};
use kcl_integration_tests::letters::queue;
use kcl_integration_tests::{Context, wait_until, with_timeout};

const KEYS: usize = 50;

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .idle_time_between_reads(Duration::from_millis(200))
        .ack_checkpoint_interval(Duration::from_millis(300))
}

/// Puts `n` records, record `i` with data `i` (or `poison` at `at`) and key `k{i % 50}`.
async fn fill(ctx: &Context, n: usize, at: usize) -> anyhow::Result<()> {
    let records: Vec<(String, String)> = (0..n)
        .map(|i| {
            let data = if i == at {
                "poison".to_owned()
            } else {
                i.to_string()
            };
            (format!("k{}", i % KEYS), data)
        })
        .collect();
    ctx.put(&records).await
}

/// The shard's checkpoint, if the lease exists.
async fn checkpoint(ctx: &Context) -> anyhow::Result<Option<Checkpoint>> {
    let leases = match ctx.store().list().await {
        Ok(leases) => leases,
        // Not created yet.
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let shard = leases
        .into_iter()
        .find(|l| l.key.as_str() == "shardId-000000000000");
    Ok(shard.map(|l| l.checkpoint))
}

/// Whether the checkpoint is at or past the record with data `data` (by the stream's order).
async fn passed(ctx: &Context, data: &str) -> anyhow::Result<bool> {
    let shard = "shardId-000000000000";
    let records = ctx.read_shard(shard).await?;
    let Some((sequence, _)) = records.iter().find(|(_, d)| d == data) else {
        return Ok(false);
    };
    let at = kcl_core::SequenceNumber::parse(sequence.clone())
        .ok_or_else(|| anyhow::anyhow!("not a sequence number: {sequence}"))?;
    Ok(match checkpoint(ctx).await? {
        Some(Checkpoint::Sequence(p)) => p.sequence >= at,
        Some(Checkpoint::ShardEnd) => true,
        _ => false,
    })
}

fn worker<F: ProcessorFactory>(
    ctx: &Context,
    id: &str,
    config: WorkerConfig,
    letters: DeadLetters,
    factory: F,
) -> (
    kcl_core::ShutdownHandle,
    tokio::task::JoinHandle<Result<(), kcl_core::Error>>,
) {
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let w = Worker::builder(source, ctx.store())
        .id(id)
        .config(config)
        .dead_letters(letters)
        .build_with(factory)
        .unwrap();
    (w.shutdown_handle(), tokio::spawn(w.run()))
}

/// Per record data: when its handler finished with `Ok`.
type Finished = Arc<Mutex<BTreeMap<String, Instant>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_among_50_keys_goes_to_sqs_and_comes_back_by_redrive() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("poison-sqs").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(parallel_to_sqs(ctx))).await
}

async fn parallel_to_sqs(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    fill(&ctx, 300, 120).await?;
    let url = queue(&ctx, false).await?;
    let sqs = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let letters = DeadLetters::new(SqsSink::new(&sqs, url.clone()))
        .application(ctx.table.clone())
        .stream(ctx.stream.clone());
    let finished = Finished::default();
    let t0 = Instant::now();
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let (finished, fixed) = (finished.clone(), fixed.clone());
        move |record: Record| {
            let (finished, fixed) = (finished.clone(), fixed.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let data = String::from_utf8_lossy(&record.data).into_owned();
                if data == "poison" && !fixed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(BoxError::from("cannot parse"));
                }
                finished.lock().unwrap().insert(data, Instant::now());
                Ok(())
            }
        }
    };
    let policy =
        FailurePolicy::dead_letter(3).backoff(Duration::from_secs(2), Duration::from_secs(4));
    let factory = Parallel::new(handler).max_in_flight(10).on_failure(policy);
    let (stop, task) = worker(&ctx, "w-1", config(), letters, factory);
    // Every record of the other 49 keys finishes while the poison one still has tries.
    let other = |d: &str| d.parse::<usize>().is_ok_and(|i| i % KEYS != 120 % KEYS);
    wait_until(
        "the other keys' records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        async || Ok(finished.lock().unwrap().keys().filter(|d| other(d)).count() == 294),
    )
    .await?;
    let others_done = t0.elapsed();
    let store = LetterStore::open(
        &sqs,
        Location::Sqs {
            queue_url: url.clone(),
        },
    )
    .with_visibility_timeout(Duration::from_secs(1));
    assert!(
        store.list().await?.letters.is_empty(),
        "dead-lettered before its tries were spent"
    );
    assert!(
        !passed(&ctx, "poison").await?,
        "the checkpoint passed the poison record early"
    );
    // Then it lands in SQS after its three tries (2 s + 4 s), and the checkpoint passes it.
    let mut listed = Vec::new();
    wait_until(
        "the letter in SQS",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            listed = store.list().await?.letters;
            Ok(!listed.is_empty())
        },
    )
    .await?;
    let landed = t0.elapsed();
    let letter: &DeadLetter = &listed[0].letter;
    assert_eq!(&letter.record.data[..], b"poison");
    assert_eq!(letter.record.partition_key, format!("k{}", 120 % KEYS));
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.last_error, "cannot parse");
    wait_until(
        "the checkpoint past it",
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || passed(&ctx, "299").await,
    )
    .await?;
    eprintln!(
        "the other 49 keys done at {:.2} s; the poison record in SQS at {:.2} s",
        others_done.as_secs_f64(),
        landed.as_secs_f64()
    );
    assert!(
        others_done < landed,
        "the other keys were held by the poison record"
    );
    // Redriven into the stream, as `kcl-admin dead-letters redrive` does; the fixed handler
    // processes it.
    fixed.store(true, std::sync::atomic::Ordering::Relaxed);
    let kinesis = ctx.sdk_at(&ctx.endpoints.kinesis).await;
    let redriven = Redriver::new(&kinesis)
        .put(letter, &kcl_aws::StreamRef::from(ctx.stream.clone()))
        .await?;
    store.remove(&[&listed[0]]).await?;
    eprintln!(
        "redriven to {} {}",
        redriven.shard, redriven.sequence_number
    );
    wait_until(
        "the redriven record handled",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || Ok(finished.lock().unwrap().contains_key("poison")),
    )
    .await?;
    assert!(
        store.list().await?.letters.is_empty(),
        "the letter was removed"
    );
    stop.shutdown();
    task.await??;
    Ok(())
}

/// A batch processor that fails a batch holding `poison`, without saying which record;
/// it counts the deliveries.
#[derive(Clone, Default)]
struct Bisected {
    hooks: Arc<Mutex<usize>>,
    seen: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl RecordProcessor for Bisected {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        *self.hooks.lock().unwrap() += 1;
        let mut poisoned = false;
        for r in input.records() {
            let data = String::from_utf8_lossy(&r.data).into_owned();
            poisoned |= data == "poison";
            *self.seen.lock().unwrap().entry(data).or_default() += 1;
        }
        if poisoned {
            return Err("poison".into());
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

/// A sink that refuses until `open_at`, then keeps what it is given.
#[derive(Clone)]
struct Refusing {
    open_at: Instant,
    refused: Arc<Mutex<usize>>,
    kept: Arc<Mutex<Vec<DeadLetter>>>,
}

impl DeadLetterSink for Refusing {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        if Instant::now() < self.open_at {
            *self.refused.lock().unwrap() += 1;
            return Err(BackendError::new(ErrorKind::Retryable, "put", "refusing"));
        }
        self.kept.lock().unwrap().push(letter.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_bisected_to_its_poison_record_and_a_refusing_sink_holds_the_checkpoint()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("poison-bisect").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(bisect(ctx))).await
}

async fn bisect(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    // One batch of 100 (the records are there before the worker reads).
    fill(&ctx, 100, 37).await?;
    let sink = Refusing {
        open_at: Instant::now() + Duration::from_secs(10),
        refused: Arc::default(),
        kept: Arc::default(),
    };
    let processor = Bisected::default();
    let factory = {
        let processor = processor.clone();
        move |_: &ShardId| processor.clone()
    };
    let policy =
        FailurePolicy::dead_letter(2).backoff(Duration::from_millis(200), Duration::from_secs(1));
    let config = config().max_records(100).failure(policy);
    let (stop, task) = worker(&ctx, "w-1", config, DeadLetters::new(sink.clone()), factory);
    // While the sink refuses (10 s), the poison record waits and the checkpoint with it.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(*sink.refused.lock().unwrap() > 0, "the sink was asked");
    assert!(sink.kept.lock().unwrap().is_empty());
    assert!(
        !passed(&ctx, "poison").await?,
        "the checkpoint passed a record the sink refused"
    );
    wait_until(
        "the checkpoint at the last record",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || passed(&ctx, "99").await,
    )
    .await?;
    let kept = sink.kept.lock().unwrap().clone();
    assert_eq!(kept.len(), 1);
    assert_eq!(&kept[0].record.data[..], b"poison");
    let hooks = *processor.hooks.lock().unwrap();
    let seen = processor.seen.lock().unwrap().clone();
    // ⌈log2 100⌉ = 7 levels: at most 2 × 7 extra parts and the poison record's 1 more try;
    // a good record at most 1 + 7 times.
    eprintln!(
        "bisect: {hooks} deliveries, a good record at most {} times",
        seen.iter()
            .filter(|(d, _)| *d != "poison")
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    );
    assert!(hooks <= 1 + 2 * 7 + 1, "{hooks} deliveries");
    for (data, n) in &seen {
        let most = if data == "poison" { 1 + 7 + 1 } else { 1 + 7 };
        assert!(*n <= most, "{data} delivered {n} times");
    }
    assert_eq!(seen.len(), 100, "every record delivered");
    stop.shutdown();
    task.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_is_kept_in_the_lease_row_and_unparked_there() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("poison-park").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(park(ctx))).await
}

async fn park(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    fill(&ctx, 100, 20).await?;
    let finished = Finished::default();
    let handler = {
        let finished = finished.clone();
        move |record: Record| {
            let finished = finished.clone();
            async move {
                let data = String::from_utf8_lossy(&record.data).into_owned();
                if data == "poison" {
                    return Err(BoxError::from(kcl_core::failure::Permanent::new("bad")));
                }
                finished.lock().unwrap().insert(data, Instant::now());
                Ok(())
            }
        }
    };
    let sink = Refusing {
        open_at: Instant::now(),
        refused: Arc::default(),
        kept: Arc::default(),
    };
    let factory = Parallel::new(handler)
        .on_failure(FailurePolicy::dead_letter(3))
        .park_keys(true);
    let (stop, task) = worker(
        &ctx,
        "w-1",
        config(),
        DeadLetters::new(sink.clone()),
        factory,
    );
    wait_until(
        "the checkpoint at the last record",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || passed(&ctx, "99").await,
    )
    .await?;
    // key k20: the poison record (20) and 70 behind it are dead-lettered; 70 never ran.
    let kept: Vec<String> = sink
        .kept
        .lock()
        .unwrap()
        .iter()
        .map(|l| String::from_utf8_lossy(&l.record.data).into_owned())
        .collect();
    assert_eq!(kept, ["poison", "70"]);
    assert!(!finished.lock().unwrap().contains_key("70"));
    let lease = ctx
        .store()
        .get(&ShardId::new("shardId-000000000000"))
        .await?
        .unwrap();
    assert_eq!(lease.parked_keys.len(), 1, "parked in the row: {lease:?}");
    let parked = sink.kept.lock().unwrap()[0].parked_key.clone().unwrap();
    // Unparked in DynamoDB (the counter left alone: the holder keeps its lease).
    let rows = kcl_core::admin::unpark(&ctx.store(), &parked).await?;
    assert_eq!(rows.len(), 1);
    let after = ctx
        .store()
        .get(&ShardId::new("shardId-000000000000"))
        .await?
        .unwrap();
    assert!(after.parked_keys.is_empty());
    assert_eq!(after.owner, lease.owner);
    // The holder sees it in the answer to its next renewal (every 2 s), then runs the key's
    // new records: a record put before that renewal lands would be parked with the key.
    wait_until(
        "a renewal after the unpark",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let row = ctx
                .store()
                .get(&ShardId::new("shardId-000000000000"))
                .await?;
            Ok(row.is_some_and(|r| r.counter > after.counter))
        },
    )
    .await?;
    ctx.put(&[("k20".to_owned(), "after".to_owned())]).await?;
    wait_until(
        "the unparked key's record handled",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || Ok(finished.lock().unwrap().contains_key("after")),
    )
    .await?;
    assert_eq!(sink.kept.lock().unwrap().len(), 2, "nothing more parked");
    stop.shutdown();
    task.await??;
    Ok(())
}
