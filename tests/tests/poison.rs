//! The failure policy end to end on the emulators (kinesis-mock, moto's DynamoDB and SQS),
//! through the real SDK clients: a `Parallel` worker with one poison record among 50 keys
//! lands it in SQS with its payload after its tries while the other keys keep finishing, and
//! checkpoints past it only then; the letter is redriven into the stream (kcl-aws's
//! `LetterStore` and `Redriver`, what `kcl-admin dead-letters redrive` runs) and a fixed
//! handler processes it. A batch processor that does not say which record failed is bisected
//! to it within the stated bound; a sink that refuses for 10 s holds the checkpoint and loses
//! nothing. A parked key (`park_keys`) redriven through its holder (`kcl_core::admin`'s
//! plan, request and done, what `kcl-admin dead-letters redrive` runs): the holder, reading
//! its SQS queue back (`SinkReader`), replays the key's letters before any live record of the
//! key, each once, deletes them and unparks the key, under per-lease renewals and under
//! heartbeats; a holder without a reader refuses, and the key stays parked with its letters.

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

/// The one shard's row.
async fn row(ctx: &Context) -> anyhow::Result<kcl_core::Lease> {
    ctx.store()
        .get(&ShardId::new("shardId-000000000000"))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no row for the shard"))
}

/// Data of key `k`'s records, one of them failing while `broken` is set: `k:{i}` at every
/// sixth record from 3 (`k:3` fails), `o:{i}` on five other keys between.
fn redrive_fill(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            if i % 6 == 3 {
                ("k".to_owned(), format!("k:{i}"))
            } else {
                (format!("o{}", i % 6), format!("o:{i}"))
            }
        })
        .collect()
}

/// The letters of the SQS queue at `url`, listed and made visible again at once (as
/// `kcl-admin dead-letters redrive` does once it has chosen).
async fn listed(store: &LetterStore) -> anyhow::Result<Vec<kcl_aws::dead_letter::Stored>> {
    let listing = store.list().await?;
    store
        .release(&listing, &std::collections::HashSet::new())
        .await?;
    Ok(listing.letters)
}

/// How many messages the queue at `url` has visible, and held by a reader.
async fn messages(ctx: &Context, url: &str) -> anyhow::Result<(u64, u64)> {
    use aws_sdk_sqs::types::QueueAttributeName as Name;
    let out = ctx
        .sqs_client()
        .await
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(Name::ApproximateNumberOfMessages)
        .attribute_names(Name::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await?;
    let count = |name: Name| -> anyhow::Result<u64> {
        let value = out.attributes().and_then(|a| a.get(&name));
        let value = value.ok_or_else(|| anyhow::anyhow!("no {name:?}"))?;
        Ok(value.parse()?)
    };
    Ok((
        count(Name::ApproximateNumberOfMessages)?,
        count(Name::ApproximateNumberOfMessagesNotVisible)?,
    ))
}

/// What `kcl-admin dead-letters redrive` does for a parked key: counts its letters by the
/// shard that wrote them, plans from the lease rows, and writes the requests.
async fn ask_redrive(
    ctx: &Context,
    letters: &[kcl_aws::dead_letter::Stored],
    parked_key: &str,
) -> anyhow::Result<kcl_core::admin::RedrivePlan> {
    let mut counts: BTreeMap<ShardId, usize> = BTreeMap::new();
    for stored in letters {
        if stored.letter.parked_key.as_deref() == Some(parked_key) {
            *counts.entry(stored.letter.shard.clone()).or_default() += 1;
        }
    }
    let rows = ctx.store().list().await?;
    let plan = kcl_core::admin::plan_redrive(&rows, parked_key, &counts);
    assert!(plan.orphans.is_empty(), "{plan:?}");
    assert_eq!(plan.requests.len(), 1, "{plan:?}");
    let asked = kcl_core::admin::request_redrive(&ctx.store(), &plan).await?;
    assert_eq!(asked.len(), 1, "{plan:?}");
    Ok(plan)
}

/// Successful runs of the redrive tests' handler: data, in the order they succeeded.
type Runs = Arc<Mutex<Vec<String>>>;

/// A `Parallel` worker parking keys, dead-lettering into the SQS queue at `url` (with a
/// reader of it if `reader`), whose handler fails `k:3` while `broken` is set.
async fn redrive_worker(
    ctx: &Context,
    url: &str,
    liveness: kcl_core::Liveness,
    reader: bool,
    runs: &Runs,
    broken: &Arc<std::sync::atomic::AtomicBool>,
) -> (
    kcl_core::ShutdownHandle,
    tokio::task::JoinHandle<Result<(), kcl_core::Error>>,
) {
    let sqs = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let mut letters = DeadLetters::new(SqsSink::new(&sqs, url.to_owned()))
        .application(ctx.table.clone())
        .stream(ctx.stream.clone());
    if reader {
        let location = Location::Sqs {
            queue_url: url.to_owned(),
        };
        letters = letters.reader(location.reader(&sqs).expect("SQS has a reader"));
    }
    let handler = {
        let (runs, broken) = (runs.clone(), broken.clone());
        move |record: Record| {
            let (runs, broken) = (runs.clone(), broken.clone());
            async move {
                // Slow enough that live records of the key arrive while its letters replay.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let data = String::from_utf8_lossy(&record.data).into_owned();
                if data == "k:3" && broken.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(BoxError::from(kcl_core::failure::Permanent::new("bad")));
                }
                runs.lock().unwrap().push(data);
                Ok(())
            }
        }
    };
    let factory = Parallel::new(handler)
        .max_in_flight(4)
        .on_failure(
            FailurePolicy::dead_letter(2)
                .backoff(Duration::from_millis(100), Duration::from_secs(1)),
        )
        .park_keys(true);
    worker(ctx, "w-1", config().liveness(liveness), letters, factory)
}

/// Fills the stream, starts the worker, and waits until `k:3` and the 4 records of `k` behind
/// it are letters in the queue and the checkpoint passed the last record; the parked key.
async fn parked_in_sqs(
    ctx: &Context,
    store: &LetterStore,
) -> anyhow::Result<(String, Vec<kcl_aws::dead_letter::Stored>)> {
    wait_until(
        "the checkpoint at the last record",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || passed(ctx, "o:29").await,
    )
    .await?;
    let mut letters = Vec::new();
    wait_until(
        "k's 5 letters in SQS",
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || {
            letters = listed(store).await?;
            Ok(letters.len() >= 5)
        },
    )
    .await?;
    let data: Vec<String> = letters
        .iter()
        .map(|s| String::from_utf8_lossy(&s.letter.record.data).into_owned())
        .collect();
    assert_eq!(data, ["k:3", "k:9", "k:15", "k:21", "k:27"], "k's letters");
    let parked_key = letters[0]
        .letter
        .parked_key
        .clone()
        .ok_or_else(|| anyhow::anyhow!("k:3's letter parks no key"))?;
    assert!(
        letters
            .iter()
            .all(|s| s.letter.parked_key.as_deref() == Some(&parked_key)),
        "every letter parks the key"
    );
    let parks = row(ctx).await?.parked_keys;
    assert_eq!(parks.len(), 1, "parked in the row: {parks:?}");
    Ok((parked_key, letters))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_is_redriven_through_its_holder_before_its_live_records() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("poison-redrive").await? else {
        return Ok(());
    };
    with_timeout(
        Duration::from_secs(60),
        Box::pin(redrive_through_holder(ctx, kcl_core::Liveness::PerLease)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_is_redriven_through_its_holder_before_its_live_records_under_heartbeats()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("poison-redrive-hb").await? else {
        return Ok(());
    };
    with_timeout(
        Duration::from_secs(60),
        Box::pin(redrive_through_holder(ctx, kcl_core::Liveness::Heartbeat)),
    )
    .await
}

/// k's records are handled in stream order, each once: its 5 letters replayed by the holder
/// before any of the live records of k put every 100 ms before, during and after the redrive;
/// then no letter is left and the row parks nothing.
async fn redrive_through_holder(ctx: Context, liveness: kcl_core::Liveness) -> anyhow::Result<()> {
    let t0 = Instant::now();
    ctx.create_stream(1).await?;
    ctx.put(&redrive_fill(30)).await?;
    let url = queue(&ctx, false).await?;
    let sqs = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let store = LetterStore::open(
        &sqs,
        Location::Sqs {
            queue_url: url.clone(),
        },
    );
    let runs = Runs::default();
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (stop, task) = redrive_worker(&ctx, &url, liveness, true, &runs, &broken).await;
    let (parked_key, letters) = parked_in_sqs(&ctx, &store).await?;
    let parked_at = t0.elapsed();
    broken.store(false, std::sync::atomic::Ordering::SeqCst);
    // Live records of k every 100 ms, from before the request until after it is done.
    let live_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = tokio::spawn({
        let (ctx, live_stop) = (ctx.clone(), live_stop.clone());
        async move {
            let mut i = 0;
            while !live_stop.load(std::sync::atomic::Ordering::SeqCst) {
                ctx.put_one("k", &format!("k:live-{i}")).await?;
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(i)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let plan = ask_redrive(&ctx, &letters, &parked_key).await?;
    let asked_at = t0.elapsed();
    let store_ = ctx.store();
    wait_until(
        "the redrive done",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(kcl_core::admin::redrive_done(&store_, &plan).await?.0),
    )
    .await?;
    let done_at = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    live_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let lives = live.await??;
    ctx.put_one("k", "k:after").await?;
    wait_until(
        "k:after handled",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || Ok(runs.lock().unwrap().iter().any(|d| d == "k:after")),
    )
    .await?;
    stop.shutdown();
    task.await??;
    // k's records as they are in the stream, and as they succeeded: the same, each once.
    let expected: Vec<String> = ctx
        .read_shard("shardId-000000000000")
        .await?
        .into_iter()
        .map(|(_, data)| data)
        .filter(|d| d.starts_with("k:"))
        .collect();
    let ran: Vec<String> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.starts_with("k:"))
        .cloned()
        .collect();
    eprintln!(
        "{liveness:?}: parked at {:.2} s, asked at {:.2} s, done at {:.2} s ({lives} live records \
         of k); k ran {ran:?}",
        parked_at.as_secs_f64(),
        asked_at.as_secs_f64(),
        done_at.as_secs_f64()
    );
    assert_eq!(ran, expected, "k's records in stream order, each once");
    // Every message of the queue is k's: none left, visible or held by a reader.
    let (visible, held) = messages(&ctx, &url).await?;
    assert_eq!((visible, held), (0, 0), "letters of k left (visible, held)");
    let parks = row(&ctx).await?.parked_keys;
    assert!(parks.is_empty(), "the row parks {parks:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_reader_refuses_a_redrive_and_the_key_stays_parked() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("poison-redrive-refused").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(redrive_refused(ctx))).await
}

async fn redrive_refused(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    ctx.put(&redrive_fill(30)).await?;
    let url = queue(&ctx, false).await?;
    let sqs = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let store = LetterStore::open(
        &sqs,
        Location::Sqs {
            queue_url: url.clone(),
        },
    );
    let runs = Runs::default();
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (stop, task) = redrive_worker(
        &ctx,
        &url,
        kcl_core::Liveness::PerLease,
        false,
        &runs,
        &broken,
    )
    .await;
    let (parked_key, letters) = parked_in_sqs(&ctx, &store).await?;
    broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let plan = ask_redrive(&ctx, &letters, &parked_key).await?;
    let refused = wait_until(
        "the request refused",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let parks = row(&ctx).await?.parked_keys;
            Ok(!parks.iter().any(|e| e.contains("/redrive/")))
        },
    )
    .await?;
    eprintln!("refused after {:.2} s", refused.as_secs_f64());
    assert!(
        !kcl_core::admin::redrive_done(&ctx.store(), &plan).await?.0,
        "not done"
    );
    let parks = row(&ctx).await?.parked_keys;
    assert_eq!(parks.len(), 1, "the key stays parked: {parks:?}");
    let left = listed(&store).await?;
    assert_eq!(left.len(), 5, "every letter stays");
    assert!(
        !runs.lock().unwrap().iter().any(|d| d == "k:3"),
        "nothing of k replayed"
    );
    // A later record of k is parked behind them, not run.
    ctx.put_one("k", "k:later").await?;
    wait_until(
        "the checkpoint past k:later",
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || passed(&ctx, "k:later").await,
    )
    .await?;
    assert!(
        !runs.lock().unwrap().iter().any(|d| d.starts_with("k:")),
        "nothing of k ran"
    );
    let left = listed(&store).await?;
    assert_eq!(left.len(), 6, "k:later parked as a letter");
    stop.shutdown();
    task.await??;
    Ok(())
}
