//! A worker process for the integration tests.
//!
//! Runs one [`kcl_core::Worker`] on the AWS backends (endpoints, region and credentials from
//! the standard environment) and appends what happens to a JSONL file, one object a line:
//! `started`, `init`, `record` (shard, sequence and sub-sequence number, partition key, data), `checkpoint`,
//! `checkpoint_failed`, `shard_end`, `shutdown_checkpoint`, `lease_lost`, `stopped`. Every
//! line carries the worker id, a global line number and a wall-clock time in milliseconds.
//! A record's line is written (and flushed) before the batch is checkpointed, so a killed
//! process never checkpointed a record missing from its file.
//!
//! SIGTERM or SIGINT shuts down gracefully (processors checkpoint in `shutdown_requested`,
//! leases are released, or kept for a restart under `--restart-grace-ms`); a second signal
//! forces the shutdown. With `--http` the process serves as a deployed one does (kcl-serve:
//! probes, `/metrics`, `POST /drain`, KEDA's external scaler), and journals a `serving` line
//! with both addresses. With `--outputs-table` and `--plain-table` each record's output is
//! written exactly once and at least once (`work`, `committed`, `commit_refused`,
//! `commit_failed` lines; see the `outputs` module).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use kcl_aws::{DynamoDbLeaseStore, DynamoDbStreamsSource, KinesisShardSource};
use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId};
use kcl_core::parallel::ParallelProcessor;
use kcl_core::singleton::{Singleton, SingletonConfig, TaskContext};
use kcl_core::{
    Autoscaling, BalanceBy, Balancing, BoxError, CheckpointError, Checkpointer, Coordination,
    ExtendedSequenceNumber, InitialPosition, InitializationInput, LeaseStore, Liveness, Parallel,
    ProcessRecordsInput, ProcessorFactory, RecordHandler, RecordProcessor, RetrievalMode, ShardId,
    ShardSource, Worker, WorkerConfig,
};
use kcl_integration_tests::tracker::FileTracker;
use kcl_serve::HttpMessenger;
use kcl_serve::messenger::Limits;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[path = "kcl-test-worker/outputs.rs"]
mod outputs;

use outputs::OutputTables;

/// Command line of the test worker.
#[derive(Debug, Parser)]
struct Args {
    /// Stream name or ARN.
    #[arg(long)]
    stream: String,
    /// Lease table (application) name.
    #[arg(long)]
    table: String,
    /// Worker id.
    #[arg(long)]
    worker_id: String,
    /// JSONL file to append events to.
    #[arg(long)]
    out: PathBuf,
    /// Failover time in milliseconds.
    #[arg(long, default_value_t = 3000)]
    failover_ms: u64,
    /// Taker interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    taker_ms: u64,
    /// Pause after an empty read, in milliseconds.
    #[arg(long, default_value_t = 500)]
    idle_ms: u64,
    /// Shard sync interval in milliseconds.
    #[arg(long, default_value_t = 2000)]
    shard_sync_ms: u64,
    /// Records per GetRecords.
    #[arg(long, default_value_t = 100)]
    max_records: u32,
    /// Most handoffs asked for in one taker cycle.
    #[arg(long, default_value_t = 1)]
    max_steal: usize,
    /// Most leases this worker holds (`max_leases`); unlimited if not given.
    #[arg(long)]
    max_leases: Option<usize>,
    /// Do not checkpoint after each batch (only at shard end and shutdown).
    #[arg(long)]
    no_batch_checkpoint: bool,
    /// Sleep this long in each batch before checkpointing, in milliseconds.
    #[arg(long, default_value_t = 0)]
    batch_delay_ms: u64,
    /// Sleep this long after journaling each record, in milliseconds.
    #[arg(long, default_value_t = 0)]
    record_delay_ms: u64,
    /// Also checkpoint at every N-th record of the shard (inside batches, so inside KPL
    /// aggregates); 0: never.
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Where a shard without a checkpoint starts: `trim-horizon` or `latest`.
    #[arg(long, default_value = "trim-horizon")]
    initial_position: String,
    /// `every-worker` or `leader`.
    #[arg(long, default_value = "leader")]
    coordination: Coordination,
    /// `per-lease` or `heartbeat`.
    #[arg(long, default_value = "per-lease")]
    liveness: Liveness,
    /// `polling` or `fan-out` (a stream consumer named after the table).
    #[arg(long, default_value = "polling")]
    retrieval: RetrievalMode,
    /// The call timeout in milliseconds (also how long a subscription may stay silent).
    #[arg(long, default_value_t = 15_000)]
    call_timeout_ms: u64,
    /// Multi-stream mode: the streams to consume, one name a line (`name LATEST` to start a
    /// new stream at LATEST), read at every shard sync; `--stream` is then ignored. Journal
    /// lines name shards by their lease keys (`account:stream:epoch:shardId`).
    #[arg(long)]
    streams_file: Option<PathBuf>,
    /// Multi-stream mode: how long a stream gone from the file is still read before its
    /// leases are deleted, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    stream_removal_grace_ms: u64,
    /// Also compete for the singleton task NAME (lines `singleton_start` with its fencing
    /// token and `singleton_stop`); its failover time is the worker's.
    #[arg(long)]
    singleton: Option<String>,
    /// How often singleton candidates read the row, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    singleton_poll_ms: u64,
    /// With `--singleton`: take messages for it over HTTP on a free local port, with this
    /// shared secret (lines `message` with the text and the fencing token).
    #[arg(long)]
    messenger_secret: Option<String>,
    /// Journal one `batch` line per batch (shard, record count, first record's payload)
    /// instead of a line per record: for measuring the worker's own cost.
    #[arg(long)]
    journal_batches: bool,
    /// Process with `kcl_core::Parallel`, this many records of a shard at once, in order per
    /// partition key: a `record_start` line when a record's handler starts, its `record` line
    /// when it finishes, after a pause of up to twice `--record-delay-ms`, or for one record in
    /// ten, ten times it (drawn from the record's sequence number).
    #[arg(long)]
    parallel: Option<usize>,
    /// Under `--parallel`: the first record of this partition key the handler gets never
    /// finishes (it waits for ever), so the key's later records wait behind it and the shard's
    /// checkpoint stays before it while the other keys' records finish.
    #[arg(long)]
    stuck_pk: Option<String>,
    /// Read this DynamoDB table's stream (`kcl_aws::DynamoDbStreamsSource`) instead of
    /// `--stream`; a record's data is the adapter's JSON.
    #[arg(long)]
    dynamodb_streams_table: Option<String>,
    /// Keep the leases through a restart for this long beyond the failover time
    /// (`restart_grace`), in milliseconds; released at once when not given.
    #[arg(long)]
    restart_grace_ms: Option<u64>,
    /// Checkpoint acknowledged records after this many (`ack_checkpoint_every`).
    #[arg(long, default_value_t = 1000)]
    ack_checkpoint_every: u64,
    /// ... or this long, in milliseconds (`ack_checkpoint_interval`).
    #[arg(long, default_value_t = 5000)]
    ack_checkpoint_ms: u64,
    /// `load` or `count` (`Balancing::by`).
    #[arg(long, default_value = "count", value_parser = ["load", "count"])]
    balance_by: String,
    /// This worker's capacity (`Balancing::capacity`).
    #[arg(long, default_value_t = 1.0)]
    capacity: f64,
    /// The load figures' time constant, in milliseconds (`Balancing::smoothing`).
    #[arg(long, default_value_t = 60_000)]
    smoothing_ms: u64,
    /// The move budget's window, in milliseconds (`Balancing::move_window`).
    #[arg(long, default_value_t = 60_000)]
    move_window_ms: u64,
    /// `Balancing::stickiness`, in milliseconds.
    #[arg(long, default_value_t = 600_000)]
    stickiness_ms: u64,
    /// A file naming hot shards, one id a line, read at each batch: each record of a hot
    /// shard costs `--hot-record-ms` of busy time, slept after journaling it.
    #[arg(long)]
    hot_shards_file: Option<PathBuf>,
    /// What one record of a hot shard costs, in milliseconds.
    #[arg(long, default_value_t = 0)]
    hot_record_ms: u64,
    /// Serve as a deployed process does (kcl-serve): `/healthz`, `/metrics`, `/status` and
    /// `POST /drain` on a free local port, and KEDA's external scaler on another; a `serving`
    /// line names both (`http`, `scaler`). Signals are then kcl-serve's.
    #[arg(long)]
    http: bool,
    /// `Autoscaling::catch_up`, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    catch_up_ms: u64,
    /// `Autoscaling::min_workers`.
    #[arg(long, default_value_t = 1)]
    min_workers: u32,
    /// `Autoscaling::scale_down_window`, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    scale_down_window_ms: u64,
    /// `Autoscaling::publish_interval`, in milliseconds; not published when not given.
    #[arg(long)]
    publish_ms: Option<u64>,
    /// Commit each record's output (`ADD n :1` on the item `shard/seq/sub`) into this table
    /// with the batch's checkpoint, exactly once (`Checkpointer::commit_outputs`), instead of
    /// checkpointing after each batch; journal `work`, then `committed`, `commit_refused`
    /// (the lease was lost) or `commit_failed` (see the `outputs` module).
    #[arg(long)]
    outputs_table: Option<String>,
    /// Also write each record's output into this table with a plain `UpdateItem`, before the
    /// checkpoint: at least once.
    #[arg(long)]
    plain_table: Option<String>,
    /// With `--outputs-table` or `--plain-table`: each batch works this long on its thread
    /// (blocking it) before its commit, in milliseconds.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
}

/// The autoscaling of `--catch-up-ms`, `--min-workers`, `--scale-down-window-ms` and
/// `--publish-ms` (the rest as default).
fn autoscaling(args: &Args) -> Autoscaling {
    let ms = Duration::from_millis;
    Autoscaling::default()
        .catch_up(ms(args.catch_up_ms))
        .workers(args.min_workers, None)
        .windows(Duration::ZERO, ms(args.scale_down_window_ms))
        .publish_interval(args.publish_ms.map(ms))
}

/// The balancing of `--balance-by`, `--capacity`, `--smoothing-ms`, `--move-window-ms` and
/// `--stickiness-ms` (budget and band as default).
fn balancing(args: &Args) -> Balancing {
    let by = match args.balance_by.as_str() {
        "count" => BalanceBy::Count,
        _ => BalanceBy::Load,
    };
    let (mut b, ms) = (Balancing::default(), Duration::from_millis);
    b.move_window = ms(args.move_window_ms);
    b.by(by)
        .capacity(args.capacity)
        .smoothing(ms(args.smoothing_ms))
        .stickiness(ms(args.stickiness_ms))
}

/// Appends JSON lines; shared by every processor of the process.
#[derive(Debug, Clone)]
struct Journal {
    file: Arc<Mutex<File>>,
    worker: Arc<str>,
    line: Arc<AtomicU64>,
}

impl Journal {
    fn open(path: &PathBuf, worker: &str) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            worker: Arc::from(worker),
            line: Arc::new(AtomicU64::new(0)),
        })
    }

    fn write(&self, event: &str, mut fields: Value) {
        if let Value::Object(map) = &mut fields {
            map.insert("event".into(), json!(event));
            map.insert("worker".into(), json!(&*self.worker));
            map.insert("ms".into(), json!(chrono::Utc::now().timestamp_millis()));
        }
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        // The line number is taken under the lock, so numbers follow the file order.
        let n = self.line.fetch_add(1, Ordering::SeqCst);
        if let Value::Object(map) = &mut fields {
            map.insert("n".into(), json!(n));
        }
        let result = writeln!(file, "{fields}").and_then(|()| file.flush());
        if let Err(error) = result {
            tracing::error!(%error, "cannot write the journal");
        }
    }
}

struct Recorder {
    shard: ShardId,
    journal: Journal,
    batch_checkpoint: bool,
    batch_delay: Duration,
    record_delay: Duration,
    /// `--hot-shards-file` and `--hot-record-ms`.
    hot: Option<(Arc<PathBuf>, Duration)>,
    checkpoint_every: u64,
    /// Records of this shard delivered to this processor.
    seen: u64,
    journal_batches: bool,
    /// Under `--parallel`: the processor records are handed to.
    parallel: Option<ParallelProcessor<Handler>>,
    /// Under `--outputs-table` or `--plain-table`: where each record's output goes, and
    /// how the batch commits.
    outputs: Option<OutputTables>,
}

/// A record's journal fields: shard, sequence and sub-sequence number, partition key, data.
fn record_line(shard: &ShardId, record: &kcl_core::Record) -> Value {
    json!({
        "shard": shard.as_str(),
        "seq": record.sequence_number.as_str(),
        "sub": record.sub_sequence_number,
        "pk": record.partition_key,
        "data": String::from_utf8_lossy(&record.data),
    })
}

/// The record handler under `--parallel`.
struct Handler {
    shard: ShardId,
    journal: Journal,
    delay: Duration,
    /// `--stuck-pk`.
    stuck: Option<String>,
}

impl RecordHandler for Handler {
    async fn handle(&self, record: kcl_core::Record) -> Result<(), BoxError> {
        let line = |event: &str| self.journal.write(event, record_line(&self.shard, &record));
        line("record_start");
        if self.stuck.as_ref() == Some(&record.partition_key) {
            std::future::pending::<()>().await;
        }
        // Drawn from the sequence number: up to twice the delay, and one record in ten ten
        // times as long, so that keys overtake each other and slow records hold the watermark.
        let draw = record
            .sequence_number
            .as_str()
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let factor = if draw % 10 == 0 {
            10.0
        } else {
            (draw % 200) as f64 / 100.0
        };
        tokio::time::sleep(self.delay.mul_f64(factor)).await;
        line("record");
        Ok(())
    }
}

impl Recorder {
    /// What a record of this shard costs now (`--hot-shards-file`).
    fn hot_cost(&self) -> Duration {
        let Some((file, cost)) = &self.hot else {
            return Duration::ZERO;
        };
        let listed = std::fs::read_to_string(file.as_path()).unwrap_or_default();
        let hot = listed.lines().any(|l| l.trim() == self.shard.as_str());
        if hot { *cost } else { Duration::ZERO }
    }

    async fn checkpoint(
        &self,
        checkpointer: &mut Checkpointer,
        event: &str,
        position: Option<ExtendedSequenceNumber>,
    ) -> Result<(), BoxError> {
        let at = position
            .as_ref()
            .or(checkpointer.last_delivered())
            .map(ToString::to_string);
        let result = match position {
            Some(position) => checkpointer.checkpoint_at(position).await,
            None => checkpointer.checkpoint().await,
        };
        match result {
            Ok(()) => {
                self.journal
                    .write(event, json!({"shard": self.shard.as_str(), "seq": at}));
                Ok(())
            }
            Err(error) => {
                let lost = matches!(error, CheckpointError::LeaseLost { .. });
                self.journal.write(
                    "checkpoint_failed",
                    json!({"shard": self.shard.as_str(), "seq": at, "lease_lost": lost, "error": error.to_string()}),
                );
                if lost { Ok(()) } else { Err(error.into()) }
            }
        }
    }
}

impl RecordProcessor for Recorder {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.journal.write(
            "init",
            json!({"shard": self.shard.as_str(), "checkpoint": input.checkpoint.to_string()}),
        );
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if let Some(parallel) = &mut self.parallel {
            return parallel.process_records(input, checkpointer).await;
        }
        if self.journal_batches {
            let first = input
                .records()
                .first()
                .map(|r| String::from_utf8_lossy(&r.data));
            self.journal.write(
                "batch",
                json!({"shard": self.shard.as_str(), "count": input.records().len(), "data": first}),
            );
        }
        let hot = self.hot_cost();
        for record in input.records().iter().filter(|_| !self.journal_batches) {
            self.journal
                .write("record", record_line(&self.shard, record));
            let delay = self.record_delay + hot;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            self.seen += 1;
            if self.checkpoint_every > 0 && self.seen.is_multiple_of(self.checkpoint_every) {
                self.checkpoint(checkpointer, "checkpoint", Some(record.position()))
                    .await?;
            }
        }
        if !self.batch_delay.is_zero() {
            tokio::time::sleep(self.batch_delay).await;
        }
        if let Some(outputs) = self
            .outputs
            .as_ref()
            .filter(|_| !input.records().is_empty())
        {
            return outputs
                .process(&self.shard, input.records(), checkpointer, &self.journal)
                .await;
        }
        if self.batch_checkpoint {
            self.checkpoint(checkpointer, "checkpoint", None).await?;
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.parallel = None; // cancels what is in flight
        self.journal
            .write("lease_lost", json!({"shard": self.shard.as_str()}));
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.journal
            .write("shard_end", json!({"shard": self.shard.as_str()}));
        self.checkpoint(checkpointer, "checkpoint", None).await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.checkpoint(checkpointer, "shutdown_checkpoint", None)
            .await
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "worker failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let journal = Journal::open(&args.out, &args.worker_id)?;
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let retrieval = args.retrieval.with_consumer(args.table.clone());
    // As a user builds it: what the coordination uses of the table is the store's default.
    let store = DynamoDbLeaseStore::new(&sdk, args.table.clone());
    let config = WorkerConfig::default()
        .failover_time(Duration::from_millis(args.failover_ms))
        .taker_interval(Duration::from_millis(args.taker_ms))
        .idle_time_between_reads(Duration::from_millis(args.idle_ms))
        .shard_sync_interval(Duration::from_millis(args.shard_sync_ms))
        .parent_poll_interval(Duration::from_millis(200))
        .max_records(args.max_records)
        .max_leases_to_steal(args.max_steal)
        .max_leases(args.max_leases.unwrap_or(usize::MAX))
        .max_backoff(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(10))
        .coordination(args.coordination)
        .liveness(args.liveness)
        .retrieval(retrieval)
        .call_timeout(Duration::from_millis(args.call_timeout_ms))
        .ack_checkpoint_every(args.ack_checkpoint_every)
        .ack_checkpoint_interval(Duration::from_millis(args.ack_checkpoint_ms))
        .restart_grace(args.restart_grace_ms.map(Duration::from_millis))
        .balancing(balancing(&args))
        .autoscaling(autoscaling(&args))
        .initial_position(match args.initial_position.as_str() {
            "latest" => InitialPosition::Latest,
            "trim-horizon" => InitialPosition::TrimHorizon,
            other => anyhow::bail!("invalid --initial-position {other}"),
        });
    let recorder = {
        let journal = journal.clone();
        let batch_checkpoint = !args.no_batch_checkpoint;
        let batch_delay = Duration::from_millis(args.batch_delay_ms);
        let record_delay = Duration::from_millis(args.record_delay_ms);
        let checkpoint_every = args.checkpoint_every;
        let journal_batches = args.journal_batches;
        let parallel = args.parallel;
        let stuck_pk = args.stuck_pk.clone();
        let hot_cost = Duration::from_millis(args.hot_record_ms);
        let hot = (args.hot_shards_file.clone()).map(|file| (Arc::new(file), hot_cost));
        let outputs =
            (args.outputs_table.is_some() || args.plain_table.is_some()).then(|| OutputTables {
                store: store.clone(),
                exactly: args.outputs_table.clone(),
                plain: args.plain_table.clone(),
                work: Duration::from_millis(args.work_ms),
            });
        move |shard: ShardId| Recorder {
            outputs: outputs.clone(),
            hot: hot.clone(),
            parallel: parallel.map(|n| {
                let handler = Handler {
                    shard: shard.clone(),
                    journal: journal.clone(),
                    delay: record_delay,
                    stuck: stuck_pk.clone(),
                };
                Parallel::new(handler).max_in_flight(n).create(&shard)
            }),
            shard,
            journal: journal.clone(),
            batch_checkpoint,
            batch_delay,
            record_delay,
            checkpoint_every,
            seen: 0,
            journal_batches,
        }
    };
    let id = args.worker_id.as_str();
    let singleton = match &args.singleton {
        Some(name) => {
            let config = SingletonConfig::default()
                .failover_time(Duration::from_millis(args.failover_ms))
                .poll_interval(Duration::from_millis(args.singleton_poll_ms));
            let singleton = Singleton::new(name, id, store.clone(), config)?;
            Some(match &args.messenger_secret {
                Some(secret) => singleton.with_messenger(Arc::new(serve_messages(secret).await?)),
                None => singleton,
            })
        }
        None => None,
    };
    let serving = if args.http {
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let serving = kcl_serve::Serving::start(local, &config).await?;
        Some(serving.with_scaler(local).await?)
    } else {
        None
    };
    let extra = Extra {
        journal: journal.clone(),
        singleton,
        serving,
    };
    if let Some(path) = args.streams_file {
        let tracker = FileTracker::new(path, sdk.clone());
        let source = MultiStreamSource::new(tracker, move |stream: &StreamId| {
            KinesisShardSource::new(&sdk, stream.name.clone())
        })
        .removal_grace(Duration::from_millis(args.stream_removal_grace_ms));
        let factory = StreamFactories::new()
            .otherwise(move |stream: &StreamId, shard: &ShardId| recorder(stream.lease_key(shard)));
        drive(Worker::new(id, config, source, store, factory)?, extra).await
    } else if let Some(table) = &args.dynamodb_streams_table {
        let source = DynamoDbStreamsSource::for_table(&sdk, table).await?;
        let factory = move |shard: &ShardId| recorder(shard.clone());
        drive(Worker::new(id, config, source, store, factory)?, extra).await
    } else {
        let source = KinesisShardSource::new(&sdk, args.stream.clone());
        let factory = move |shard: &ShardId| recorder(shard.clone());
        drive(Worker::new(id, config, source, store, factory)?, extra).await
    }
}

/// Takes singleton messages on a free local port; the messenger advertises it.
async fn serve_messages(secret: &str) -> anyhow::Result<HttpMessenger> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = format!("http://{}", listener.local_addr()?);
    let messenger = HttpMessenger::new(secret, Some(address), Limits::default());
    let router = messenger.router();
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the messages endpoint failed");
        }
    });
    Ok(messenger)
}

/// What runs beside the worker.
struct Extra {
    journal: Journal,
    singleton: Option<Singleton<DynamoDbLeaseStore>>,
    /// `--http`: kcl-serve runs the worker.
    serving: Option<kcl_serve::Serving>,
}

/// Competes for the singleton until `stop`, journaling each run.
async fn compete(
    singleton: Singleton<DynamoDbLeaseStore>,
    journal: Journal,
    stop: CancellationToken,
) {
    let result = singleton
        .run_with(stop, |ctx: TaskContext| {
            let journal = journal.clone();
            async move {
                let token = ctx.fencing_token().0;
                journal.write("singleton_start", json!({"token": token}));
                let mut inbox = ctx.inbox();
                loop {
                    tokio::select! {
                        () = ctx.cancelled().cancelled() => break,
                        Some(message) = async { inbox.as_mut()?.recv().await } => {
                            let data = String::from_utf8_lossy(&message);
                            journal.write("message", json!({"data": data, "token": token}));
                        }
                    }
                }
                journal.write("singleton_stop", json!({"token": token}));
            }
        })
        .await;
    if let Err(error) = result {
        tracing::error!(%error, "the singleton failed");
    }
}

/// Runs `worker` until it stops: SIGTERM or SIGINT shut it down gracefully, a second forces.
async fn drive<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    worker: Worker<S, L, F>,
    extra: Extra,
) -> anyhow::Result<()> {
    let journal = extra.journal;
    let handle = worker.shutdown_handle();
    // Handed back at once on the first signal, as the worker's leases are.
    let singleton_stop = CancellationToken::new();
    let singleton = extra
        .singleton
        .map(|s| tokio::spawn(compete(s, journal.clone(), singleton_stop.clone())));
    if let Some(serving) = extra.serving {
        let (http, scaler) = (serving.http_addr(), serving.scaler_addr());
        journal.write("serving", json!({"http": http, "scaler": scaler}));
        journal.write("started", json!({}));
        let id = journal.worker.to_string();
        let options = kcl_serve::Options {
            on_signal: singleton_stop.clone(),
            ..kcl_serve::Options::default()
        };
        let ended = serving.run(worker, id, options).await;
        if let Some(singleton) = singleton {
            let _ = singleton.await;
        }
        let ok = matches!(ended, kcl_serve::Ended::Stopped);
        journal.write("stopped", json!({"ok": ok}));
        return match ended {
            kcl_serve::Ended::Failed(error) => Err(error.into()),
            _ => Ok(()),
        };
    }
    let stop_singleton = singleton_stop.clone();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut signals = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            signals += 1;
            if signals == 1 {
                tracing::info!("signal: shutting down gracefully");
                stop_singleton.cancel();
                handle.shutdown();
            } else {
                tracing::warn!("second signal: forcing shutdown");
                handle.force();
            }
        }
    });
    journal.write("started", json!({}));
    let result = worker.run().await;
    singleton_stop.cancel();
    if let Some(singleton) = singleton {
        let _ = singleton.await;
    }
    journal.write("stopped", json!({"ok": result.is_ok()}));
    result.map_err(anyhow::Error::from)
}
