//! The tests' worker: a processor that commits its records' writes with the checkpoint
//! (`Checkpointer::commit_outputs`) and tells the test how each commit ended, and the
//! writes and reads the tests make of the output table.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::outputs::Outputs;
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, ExtendedSequenceNumber, InitializationInput, Lease,
    LeaseStore, ProcessRecordsInput, Record, RecordProcessor, ShardId, ShutdownHandle, Worker,
    WorkerConfig,
};
use kcl_integration_tests::{Context, items, with_timeout};
use tokio::sync::{Semaphore, mpsc};

use crate::inject::Faults;

pub(crate) const WORKER: &str = "committer";

/// How one `commit_outputs` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied,
    LeaseLost,
    /// Refused by the condition of a write of this record (its data).
    Refused(String),
    /// Refused by the store as invalid, a write of this record (its data).
    Invalid(String),
    Failed(String),
}

#[derive(Debug)]
pub(crate) enum Note {
    Started {
        shard: ShardId,
        fence: u64,
    },
    Committed {
        shard: ShardId,
        fence: u64,
        records: Vec<String>,
        outcome: Outcome,
    },
    LeaseLost {
        shard: ShardId,
        fence: u64,
    },
}

/// The writes of one record, given its data and the tenure's fence.
pub(crate) type Plan = Arc<dyn Fn(&str, u64) -> Vec<TransactWriteItem> + Send + Sync>;

/// Collects the writes of the records delivered, and commits them with the checkpoint once
/// `commit_after[i]` records came since the last commit (the last figure repeats), each
/// commit behind a permit of `gate`.
pub(crate) struct Committer {
    store: DynamoDbLeaseStore,
    plan: Plan,
    notes: mpsc::UnboundedSender<Note>,
    gate: Arc<Semaphore>,
    commit_after: Vec<usize>,
    commits: usize,
    shard: ShardId,
    fence: u64,
    outputs: Outputs<TransactWriteItem>,
    delivered: Vec<(ExtendedSequenceNumber, String)>,
}

impl RecordProcessor for Committer {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.shard = input.shard_id.clone();
        self.fence = input.fencing_token.0;
        let _ = self.notes.send(Note::Started {
            shard: self.shard.clone(),
            fence: self.fence,
        });
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            let data = String::from_utf8_lossy(&record.data).into_owned();
            for write in (self.plan)(&data, self.fence) {
                self.outputs.push(record, write);
            }
            self.delivered.push((Record::position(record), data));
        }
        let wanted = self
            .commit_after
            .get(self.commits)
            .or(self.commit_after.last());
        if self.delivered.len() < wanted.copied().unwrap_or(1) {
            return Ok(());
        }
        self.gate.acquire().await?.forget();
        self.commits += 1;
        let delivered = std::mem::take(&mut self.delivered);
        let result = checkpointer
            .commit_outputs(&self.store, std::mem::take(&mut self.outputs))
            .await;
        let data_of = |at: &ExtendedSequenceNumber| {
            delivered
                .iter()
                .find(|(p, _)| p == at)
                .map_or_else(|| format!("{at}?"), |(_, d)| d.clone())
        };
        let outcome = match result {
            Ok(()) => Outcome::Applied,
            Err(CheckpointError::LeaseLost { .. }) => Outcome::LeaseLost,
            Err(CheckpointError::OutputRefused { record, .. }) => {
                Outcome::Refused(data_of(&record))
            }
            Err(CheckpointError::OutputInvalid { record, .. }) => {
                Outcome::Invalid(data_of(&record))
            }
            Err(other) => Outcome::Failed(kcl_core::error_chain(&other)),
        };
        let records = delivered.into_iter().map(|(_, d)| d).collect();
        let note = Note::Committed {
            shard: self.shard.clone(),
            fence: self.fence,
            records,
            outcome,
        };
        let _ = self.notes.send(note);
        Ok(())
    }

    async fn lease_lost(&mut self) {
        let _ = self.notes.send(Note::LeaseLost {
            shard: self.shard.clone(),
            fence: self.fence,
        });
    }
}

/// One worker committing outputs, and what the test watches it through.
pub(crate) struct Run {
    pub(crate) ctx: Context,
    /// The output table (keyed by `id`).
    pub(crate) out: String,
    /// The worker's store (through `faults`).
    pub(crate) store: DynamoDbLeaseStore,
    pub(crate) faults: Faults,
    pub(crate) notes: mpsc::UnboundedReceiver<Note>,
    pub(crate) gate: Arc<Semaphore>,
    pub(crate) shutdown: ShutdownHandle,
    pub(crate) running: tokio::task::JoinHandle<Result<(), kcl_core::Error>>,
}

pub(crate) struct Setup {
    pub(crate) shards: i32,
    /// Written before the worker starts.
    pub(crate) records: Vec<(String, String)>,
    pub(crate) failover: Duration,
    pub(crate) commit_after: Vec<usize>,
    pub(crate) permits: usize,
    /// How the store learns the output table's key.
    pub(crate) keys: Keys,
}

/// How the store learns the output table's key (`id`), which names the item of a `Put`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// `with_output_table`.
    Told,
    /// `describe_output_tables`.
    Described,
    /// Not told: the store reads it at the first commit.
    Unknown,
}

pub(crate) async fn start(
    ctx: &Context,
    setup: Setup,
    plan: impl Fn(&str, &str, u64) -> Vec<TransactWriteItem> + Send + Sync + 'static,
) -> anyhow::Result<Run> {
    ctx.create_stream(setup.shards).await?;
    ctx.put(&setup.records).await?;
    let out = format!("{}-out", ctx.table);
    items::create(ctx, &out, false).await?;
    let faults = Faults::default();
    let mut store =
        DynamoDbLeaseStore::from_client(faults.client(&ctx.dynamodb), ctx.table.clone());
    match setup.keys {
        Keys::Told => store = store.with_output_table(out.clone(), &["id"]),
        Keys::Described => store.describe_output_tables([&out]).await?,
        Keys::Unknown => {}
    }
    let table = out.clone();
    let plan: Plan = Arc::new(move |data, fence| plan(&table, data, fence));
    let (tx, notes) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(setup.permits));
    let factory = {
        let (store, gate) = (store.clone(), gate.clone());
        move |_: &ShardId| Committer {
            store: store.clone(),
            plan: plan.clone(),
            notes: tx.clone(),
            gate: gate.clone(),
            commit_after: setup.commit_after.clone(),
            commits: 0,
            shard: ShardId::new(""),
            fence: 0,
            outputs: Outputs::new(),
            delivered: Vec::new(),
        }
    };
    let config = WorkerConfig::default()
        .failover_time(setup.failover)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200));
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let worker = Worker::new(WORKER, config, source, store.clone(), factory)?;
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    Ok(Run {
        ctx: ctx.clone(),
        out,
        store,
        faults,
        notes,
        gate,
        shutdown,
        running,
    })
}

impl Run {
    pub(crate) async fn note(&mut self) -> anyhow::Result<Note> {
        let note = tokio::time::timeout(Duration::from_secs(30), self.notes.recv()).await?;
        note.ok_or_else(|| anyhow::anyhow!("the worker stopped"))
    }

    /// The next commit's fence, records and outcome; a lease lost before it is an error.
    pub(crate) async fn committed(&mut self) -> anyhow::Result<(u64, Vec<String>, Outcome)> {
        loop {
            match self.note().await? {
                Note::Committed {
                    fence,
                    records,
                    outcome,
                    ..
                } => return Ok((fence, records, outcome)),
                Note::LeaseLost { shard, fence } => {
                    anyhow::bail!("lease {shard} lost by tenure {fence}")
                }
                Note::Started { .. } => {}
            }
        }
    }

    /// Every item of the output table, by id.
    pub(crate) async fn outputs(
        &self,
    ) -> anyhow::Result<BTreeMap<String, HashMap<String, AttributeValue>>> {
        let mut items = BTreeMap::new();
        let mut start = None;
        loop {
            let page = self
                .ctx
                .dynamodb
                .scan()
                .table_name(&self.out)
                .set_exclusive_start_key(start)
                .consistent_read(true)
                .send()
                .await?;
            for item in page.items.unwrap_or_default() {
                let id = item["id"]
                    .as_s()
                    .map_err(|_| anyhow::anyhow!("no id"))?
                    .clone();
                items.insert(id, item);
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(items),
            }
        }
    }

    pub(crate) async fn row(&self, shard: &ShardId) -> anyhow::Result<Lease> {
        self.ctx
            .store()
            .get(shard)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no lease {shard}"))
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.shutdown();
        tokio::time::timeout(Duration::from_secs(30), self.running).await???;
        Ok(())
    }
}

/// `ADD #n :one` to item `id`, and `SET #fence = :fence`.
pub(crate) fn add(table: &str, id: &str, fence: u64) -> TransactWriteItem {
    let update = Update::builder()
        .table_name(table)
        .key("id", AttributeValue::S(id.to_owned()))
        .update_expression("ADD #n :one SET #fence = :fence")
        .expression_attribute_names("#n", "n")
        .expression_attribute_names("#fence", "fence")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .expression_attribute_values(":fence", AttributeValue::N(fence.to_string()))
        .build()
        .unwrap();
    TransactWriteItem::builder().update(update).build()
}

/// A `Put` of a new item `id`: refused if it exists.
pub(crate) fn create(table: &str, id: &str, fence: u64) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .item("id", AttributeValue::S(id.to_owned()))
        .item("fence", AttributeValue::N(fence.to_string()))
        .condition_expression("attribute_not_exists(id)")
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

pub(crate) fn n(item: &HashMap<String, AttributeValue>) -> u64 {
    item.get("n")
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn fence_of(item: &HashMap<String, AttributeValue>) -> u64 {
    item.get("fence")
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn records(prefix: &str, count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|i| (format!("k{i}"), format!("{prefix}{i}")))
        .collect()
}

pub(crate) async fn test(
    name: &str,
    limit: u64,
    body: impl AsyncFnOnce(Context) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let Some(ctx) = Context::new(name).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(limit), Box::pin(body(ctx))).await
}
