//! Exactly-once outputs against plain checkpoints (issue 51): what a processor pays to commit
//! its writes with its checkpoint in one `TransactWriteItems`
//! (`Checkpointer::commit_outputs` on `kcl_aws::DynamoDbLeaseStore`), against the same writes
//! made as an at-least-once user makes them (a `BatchWriteItem` of 25 puts at a time, or a
//! `PutItem` each) and then `checkpoint()`.
//!
//! A worker runs in this process on a stream of 1, then 8 shards, over records written
//! beforehand, in batches of at most [`BATCH`] records (so that a batch commits in one
//! transaction of 100 actions, DynamoDB's limit: 99 puts and the lease row). For each batch
//! the processor puts one item per record into an output table. Measured per mode and shard
//! count: records per second from the first delivery to the last commit or checkpoint, the
//! time of each commit call (around `commit_outputs`, around the puts and `checkpoint()`),
//! and the write units per 1,000 records by DynamoDB's billing rules. moto reports no
//! consumed capacity, so the units are computed from the items' sizes
//! (`Transact::measure` for each put, `kcl_core::lease::usage::item_size` for the lease row):
//! a transactional write costs two units per KB of each item, the lease row's included, a
//! standard write one. Modes alternate within one sitting (the order rotating from run to
//! run), after a warm-up run of each.
//!
//! With `KCL_POSTGRES_URL` set, two more modes (issue 52, [`postgres`]): the same outputs as
//! rows of a Postgres table, committed with the lease row (leases in Postgres) or through a
//! `PostgresSink` (leases in DynamoDB). Their lease store's requests come from its own
//! counts (`LeaseStoreExtras::usage`), printed by operation for every mode.

mod postgres;
mod report;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_dynamodb::types::{
    AttributeValue, PutRequest, ReturnConsumedCapacity, Select, TransactWriteItem, WriteRequest,
};
use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::lease::usage::{Operation, Tally as Requests, item_size, write_units};
use kcl_core::outputs::{Outputs, Transact};
use kcl_core::{
    BoxError, Checkpointer, InitializationInput, LeaseStore, ProcessRecordsInput, Record,
    RecordProcessor, ShardId, Worker, WorkerBuilder, WorkerConfig,
};
use kcl_integration_tests::{Context, items, wait_until};

use crate::latency::percentile;

/// Records written before each run.
const RECORDS: usize = 4_000;
/// Records per batch (`max_records`): 99 puts and the lease row make one transaction.
const BATCH: u32 = 99;
/// Bytes of each record's payload, copied into its output item.
const PAYLOAD: usize = 100;
/// Items per `BatchWriteItem` (DynamoDB's limit).
const BATCH_WRITE: usize = 25;

/// How the processor writes its outputs and checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// One `TransactWriteItems` per batch: the puts and the lease row (`commit_outputs`).
    Transactional,
    /// `BatchWriteItem`s of 25 puts, then `checkpoint()`.
    PlainBatch,
    /// A `PutItem` per record, then `checkpoint()`.
    PlainEach,
    /// Leases in Postgres: one transaction of the lease row's update and an `INSERT` per
    /// record (`commit_outputs` into `PostgresLeaseStore`).
    PostgresLeases,
    /// Leases in DynamoDB: one transaction of the shard's position row and an `INSERT` per
    /// record, then the lease row's checkpoint (`commit_outputs` into `PostgresSink`).
    PostgresSink,
}

impl Mode {
    const ALL: [Self; 5] = [
        Self::Transactional,
        Self::PlainBatch,
        Self::PlainEach,
        Self::PostgresLeases,
        Self::PostgresSink,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Transactional => "transactional: `commit_outputs`",
            Self::PlainBatch => "plain: `BatchWriteItem` ×4, `checkpoint()`",
            Self::PlainEach => "plain: `PutItem` ×99, `checkpoint()`",
            Self::PostgresLeases => "Postgres, leases in Postgres: `commit_outputs`",
            Self::PostgresSink => "Postgres sink, leases in DynamoDB: `commit_outputs`",
        }
    }

    fn postgres(self) -> bool {
        matches!(self, Self::PostgresLeases | Self::PostgresSink)
    }

    /// Units per KB of each item written into DynamoDB (none: Postgres's rows).
    fn factor(self) -> f64 {
        match self {
            Self::Transactional => 2.0,
            Self::PlainBatch | Self::PlainEach => 1.0,
            Self::PostgresLeases | Self::PostgresSink => 0.0,
        }
    }

    /// Units per KB of each lease-row write (commit or checkpoint) into DynamoDB: none with
    /// the leases in Postgres.
    fn row_factor(self) -> Option<f64> {
        match self {
            Self::Transactional => Some(2.0),
            Self::PlainBatch | Self::PlainEach | Self::PostgresSink => Some(1.0),
            Self::PostgresLeases => None,
        }
    }
}

/// What the processors of one run saw.
#[derive(Debug, Default)]
struct Tally {
    first: Option<Instant>,
    last: Option<Instant>,
    committed: usize,
    /// Each commit call's time.
    calls: Vec<Duration>,
    /// Write units of the output items (one each, times the mode's factor).
    item_units: f64,
    /// What moto reported for the plain puts (`ReturnConsumedCapacity`).
    reported: f64,
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Tally>>;

fn lock(tally: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The processor: one put per record, committed per batch as its mode says.
#[derive(Debug, Clone)]
struct Writer {
    mode: Mode,
    store: DynamoDbLeaseStore,
    out: String,
    shard: String,
    tally: Shared,
    /// The Postgres modes' table and store or sink.
    pg: Option<postgres::Pg>,
}

impl RecordProcessor for Writer {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.shard = input.shard_id.to_string();
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let records = input.records();
        if records.is_empty() {
            return Ok(());
        }
        lock(&self.tally).first.get_or_insert_with(Instant::now);
        let result = self.commit(records, checkpointer).await;
        let now = Instant::now();
        let mut tally = lock(&self.tally);
        match result {
            Ok((took, units, reported)) => {
                tally.calls.push(took);
                tally.item_units += units;
                tally.reported += reported;
                tally.committed += records.len();
                tally.last = Some(now);
            }
            Err(e) => tally.errors.push(format!("{}: {e:#}", self.shard)),
        }
        Ok(())
    }
}

impl Writer {
    /// Writes and commits one batch: the call's time, the items' units, moto's report.
    async fn commit(
        &self,
        records: &[Record],
        checkpointer: &mut Checkpointer,
    ) -> anyhow::Result<(Duration, f64, f64)> {
        if let Some(pg) = &self.pg {
            let writes = pg.writes(&self.shard, records);
            let started = Instant::now();
            pg.commit(records, writes, checkpointer).await?;
            return Ok((started.elapsed(), 0.0, 0.0));
        }
        let writes = records
            .iter()
            .map(|r| put(&self.out, &self.shard, r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let units: f64 = writes
            .iter()
            .map(|w| self.mode.factor() * write_units(self.store.measure(w).bytes))
            .sum();
        let started = Instant::now();
        let reported = match self.mode {
            Mode::Transactional => {
                let mut outputs = Outputs::new();
                for (record, write) in records.iter().zip(writes) {
                    outputs.push(record, write);
                }
                checkpointer.commit_outputs(&self.store, outputs).await?;
                0.0
            }
            Mode::PlainBatch => {
                let reported = self.batch_write(writes).await?;
                checkpointer.checkpoint().await?;
                reported
            }
            Mode::PlainEach => {
                let mut reported = 0.0;
                for item in writes.into_iter().map(item_of) {
                    let answer = self
                        .store
                        .client()
                        .put_item()
                        .table_name(&self.out)
                        .set_item(Some(item))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await
                        .context("PutItem")?;
                    reported += answer
                        .consumed_capacity()
                        .and_then(|c| c.capacity_units())
                        .unwrap_or_default();
                }
                checkpointer.checkpoint().await?;
                reported
            }
            Mode::PostgresLeases | Mode::PostgresSink => {
                anyhow::bail!("{} without its Postgres table", self.mode.name())
            }
        };
        Ok((started.elapsed(), units, reported))
    }

    /// The puts as `BatchWriteItem`s of 25, unprocessed items sent again.
    async fn batch_write(&self, writes: Vec<TransactWriteItem>) -> anyhow::Result<f64> {
        let mut reported = 0.0;
        let requests = writes
            .into_iter()
            .map(|w| {
                let put = PutRequest::builder().set_item(Some(item_of(w))).build()?;
                Ok(WriteRequest::builder().put_request(put).build())
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        for chunk in requests.chunks(BATCH_WRITE) {
            let mut pending = chunk.to_vec();
            for _ in 0..20 {
                let answer = self
                    .store
                    .client()
                    .batch_write_item()
                    .request_items(&self.out, pending)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .context("BatchWriteItem")?;
                reported += answer
                    .consumed_capacity()
                    .iter()
                    .filter_map(|c| c.capacity_units())
                    .sum::<f64>();
                pending = answer
                    .unprocessed_items
                    .and_then(|mut u| u.remove(&self.out))
                    .unwrap_or_default();
                if pending.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::ensure!(pending.is_empty(), "BatchWriteItem left items unprocessed");
        }
        Ok(reported)
    }
}

/// The output item of `record`: its shard and sequence number as `id`, its payload.
fn put(table: &str, shard: &str, record: &Record) -> anyhow::Result<TransactWriteItem> {
    let id = format!("{shard}/{}", record.sequence_number);
    let put = aws_sdk_dynamodb::types::Put::builder()
        .table_name(table)
        .item("id", AttributeValue::S(id))
        .item(
            "payload",
            AttributeValue::S(String::from_utf8_lossy(&record.data).into_owned()),
        )
        .build()?;
    Ok(TransactWriteItem::builder().put(put).build())
}

fn item_of(write: TransactWriteItem) -> HashMap<String, AttributeValue> {
    write.put.map(|p| p.item).unwrap_or_default()
}

/// One run's figures.
#[derive(Debug)]
struct Measured {
    records_per_s: f64,
    calls: Vec<Duration>,
    /// DynamoDB write units per 1,000 records; `None` with the leases in Postgres.
    units_per_1000: Option<f64>,
    /// Lease-row writes (transactions or checkpoints) per 1,000 records.
    row_writes_per_1000: f64,
    /// The lease store's requests per 1,000 records by operation (its `usage`), when the
    /// last record was committed.
    requests_per_1000: BTreeMap<Operation, f64>,
    /// The median commit call of the run's first quarter of calls, and of its last: moto
    /// copies every table a transaction touches before it runs it, so its transactions slow
    /// down as the output table grows.
    early: Duration,
    late: Duration,
    /// What moto reported for the puts, per 1,000 records.
    reported_puts_per_1000: f64,
    /// What moto reported for the lease-row writes, per 1,000 records.
    reported_rows_per_1000: f64,
}

/// The lease-row writes of a run (commits and checkpoints), counted by the store when the
/// last record was committed, before the worker's shutdown writes its own.
#[derive(Debug, Clone, Copy)]
struct RowWrites {
    requests: f64,
    reported: f64,
}

impl RowWrites {
    fn of(usage: &BTreeMap<Operation, Requests>) -> Self {
        let mut tally = Requests::default();
        for operation in [Operation::CommitOutputs, Operation::Checkpoint] {
            tally += usage.get(&operation).copied().unwrap_or_default();
        }
        #[allow(clippy::cast_precision_loss)]
        Self {
            requests: tally.requests as f64,
            reported: tally.write_units,
        }
    }
}

/// One run: a fresh stream of `shards` shards holding [`RECORDS`] records, a worker whose
/// processor writes them as `mode` says; until every record is committed. `postgres`: the
/// server of the Postgres modes.
async fn run(
    mode: Mode,
    shards: i32,
    records: usize,
    postgres: Option<&str>,
) -> anyhow::Result<Measured> {
    let ctx = Context::new("bench-exactly-once")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(shards).await?;
    let payload = "x".repeat(PAYLOAD - 6);
    let batch: Vec<(String, String)> = (0..records)
        .map(|i| (format!("k{i}"), format!("{i:06}{payload}")))
        .collect();
    ctx.put(&batch).await?;
    let out = format!("{}-out", ctx.table);
    let store = ctx.store().with_output_table(out.clone(), &["id"]);
    let tally = Shared::default();
    let writer = Writer {
        mode,
        store: store.clone(),
        out: out.clone(),
        shard: String::new(),
        tally: tally.clone(),
        pg: None,
    };
    let (usage, stored) = if mode.postgres() {
        let url = postgres.context("the Postgres modes need KCL_POSTGRES_URL")?;
        postgres::consume_into(mode, &ctx, url, writer, records).await?
    } else {
        items::create(&ctx, &out, false).await?;
        let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
        let usage = consume(
            Worker::builder(source, store.clone()),
            &store,
            writer,
            records,
        );
        (usage.await?, count(&ctx, &out).await?)
    };
    anyhow::ensure!(stored == records, "{stored} outputs stored of {records}");
    let tally = std::mem::take(&mut *lock(&tally));
    measured(mode, &ctx, &usage, tally, records).await
}

/// Runs the worker of `builder` (its lease store `store`), one `writer` per shard, until
/// every one of `records` records is committed; then shuts it down. The store's counts by
/// operation at that moment, before the shutdown's own writes.
async fn consume<L: LeaseStore>(
    builder: WorkerBuilder<KinesisShardSource, L>,
    store: &L,
    writer: Writer,
    records: usize,
) -> anyhow::Result<BTreeMap<Operation, Requests>> {
    let tally = writer.tally.clone();
    let config = WorkerConfig::default()
        .max_records(BATCH)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200));
    let worker = (builder.id("bench").config(config)).build(move |_: &ShardId| writer.clone())?;
    let shutdown = worker.shutdown_handle();
    let mut running = std::pin::pin!(worker.run());
    let waited = tokio::select! {
        ended = &mut running => anyhow::bail!("the worker stopped before the last commit: {ended:?}"),
        waited = wait_until(
            "every record committed",
            Duration::from_secs(120),
            Duration::from_millis(10),
            async || {
                let tally = lock(&tally);
                anyhow::ensure!(tally.errors.is_empty(), "{:?}", tally.errors);
                Ok(tally.committed >= records)
            },
        ) => waited,
    };
    let usage = store.usage().map(|u| u.by_operation());
    shutdown.shutdown();
    tokio::time::timeout(Duration::from_secs(30), running).await??;
    waited?;
    usage.context("the store counts its requests")
}

/// The figures of a finished run, the DynamoDB lease rows' units from their size now.
async fn measured(
    mode: Mode,
    ctx: &Context,
    usage: &BTreeMap<Operation, Requests>,
    tally: Tally,
    records: usize,
) -> anyhow::Result<Measured> {
    let rows = RowWrites::of(usage);
    let units = match mode.row_factor() {
        Some(factor) => {
            let row_units = (ctx.store().list().await?.iter())
                .map(|lease| write_units(item_size(lease)))
                .fold(1.0, f64::max);
            Some(tally.item_units + factor * row_units * rows.requests)
        }
        None => None,
    };
    let (Some(first), Some(last)) = (tally.first, tally.last) else {
        anyhow::bail!("nothing delivered");
    };
    #[allow(clippy::cast_precision_loss)]
    let per_1000 = 1000.0 / records as f64;
    let quarter = tally.calls.len().div_ceil(4);
    let mut early = tally.calls.get(..quarter).unwrap_or_default().to_vec();
    let from = tally.calls.len().saturating_sub(quarter);
    let mut late = tally.calls.get(from..).unwrap_or_default().to_vec();
    #[allow(clippy::cast_precision_loss)]
    let requests_per_1000 = (usage.iter())
        .map(|(operation, t)| (*operation, t.requests as f64 * per_1000))
        .collect();
    Ok(Measured {
        early: percentile(&mut early, 0.5),
        late: percentile(&mut late, 0.5),
        records_per_s: 1000.0 / per_1000 / (last - first).as_secs_f64(),
        calls: tally.calls,
        units_per_1000: units.map(|u| u * per_1000),
        row_writes_per_1000: rows.requests * per_1000,
        requests_per_1000,
        reported_puts_per_1000: tally.reported * per_1000,
        reported_rows_per_1000: rows.reported * per_1000,
    })
}

/// Items in `table` (a consistent `Scan` counting).
async fn count(ctx: &Context, table: &str) -> anyhow::Result<usize> {
    let mut total = 0;
    let mut start = None;
    loop {
        let page = ctx
            .dynamodb
            .scan()
            .table_name(table)
            .select(Select::Count)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .context("Scan")?;
        total += usize::try_from(page.count).unwrap_or_default();
        match page.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => return Ok(total),
        }
    }
}

/// `--only exactly-once`: warm-up, then `runs` runs of every mode at 1 and 8 shards,
/// alternating; prints the tables. The Postgres modes run when `KCL_POSTGRES_URL` is set.
pub(crate) async fn table(runs: usize) -> anyhow::Result<()> {
    let postgres = kcl_integration_tests::leases::postgres_url()?;
    let modes: Vec<Mode> = (Mode::ALL.into_iter())
        .filter(|m| postgres.is_some() || !m.postgres())
        .collect();
    let server = match &postgres {
        Some(url) => format!("Postgres {}", postgres::version(url).await?),
        None => "no Postgres (KCL_POSTGRES_URL unset: its modes skipped)".to_owned(),
    };
    println!(
        "exactly-once outputs, {} profile, {}, {runs} runs each, {RECORDS} records of {PAYLOAD} B, batches of {BATCH}, {server}",
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
    );
    for &mode in &modes {
        run(mode, 1, 300, postgres.as_deref())
            .await
            .with_context(|| format!("warm-up of {}", mode.name()))?;
    }
    let started = Instant::now();
    let mut all = report::All::default();
    for r in 0..runs {
        for shards in [1, 8] {
            for k in 0..modes.len() {
                let mode = modes[(k + r) % modes.len()];
                let measured = run(mode, shards, RECORDS, postgres.as_deref())
                    .await
                    .with_context(|| format!("run {r}, {shards} shards, {}", mode.name()))?;
                eprintln!(
                    "run {r}, {shards} shards, {}: {:.0} records/s",
                    mode.name(),
                    measured.records_per_s
                );
                all.add(mode, shards, measured);
            }
        }
    }
    all.print(&modes);
    println!("Measured in {:.0} s.", started.elapsed().as_secs_f64());
    Ok(())
}
