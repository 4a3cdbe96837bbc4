//! A worker process for the integration tests.
//!
//! Runs one [`kcl_core::Worker`] on the AWS backends (endpoints, region and credentials from
//! the standard environment), its leases in DynamoDB or, with `--lease-store postgres://…`,
//! in Postgres (the same code, generic over the store; `--outputs-table` and `--plain-table`
//! go to DynamoDB tables, committing with the lease row, or with `--outputs-postgres` to
//! Postgres tables), and appends what happens to a JSONL file, one object a line:
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

use anyhow::Context as _;
use clap::Parser;
use kcl_aws::{DynamoDbLeaseStore, DynamoDbStreamsSource, KinesisShardSource};
use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId};
use kcl_core::parallel::ParallelProcessor;
use kcl_core::singleton::{Singleton, SingletonConfig, TaskContext};
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, ExtendedSequenceNumber, InitializationInput,
    LeaseStore, Parallel, ProcessRecordsInput, ProcessorFactory, RecordHandler, RecordProcessor,
    ShardId, ShardSource, Worker, WorkerConfig,
};
use kcl_integration_tests::tracker::FileTracker;
use kcl_postgres::{PostgresLeaseStore, PostgresSink};
use kcl_serve::HttpMessenger;
use kcl_serve::messenger::Limits;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[path = "kcl-test-worker/args.rs"]
mod args;
#[path = "kcl-test-worker/outputs.rs"]
mod outputs;

use args::{Args, LeaseStoreArg};
use outputs::OutputTables;

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
    let config = args::worker_config(&args)?;
    match args.lease_store.clone() {
        LeaseStoreArg::DynamoDb => {
            // As a user builds it: what the coordination uses of the table is the store's
            // default.
            let store = DynamoDbLeaseStore::new(&sdk, args.table.clone());
            let (outputs, sink) = match &args.outputs_postgres {
                Some(url) => postgres_outputs(&args, url, None).await?,
                None => {
                    let exactly = (args.outputs_table.clone())
                        .map(|t| outputs::Exactly::DynamoDb(store.clone(), t));
                    let client = store.client().clone();
                    let plain =
                        (args.plain_table.clone()).map(|t| outputs::Plain::DynamoDb(client, t));
                    (tables(&args, exactly, plain), None)
                }
            };
            Box::pin(start(args, sdk, journal, config, (store, sink), outputs)).await
        }
        LeaseStoreArg::Postgres(url) => {
            let store = PostgresLeaseStore::connect(&url, &args.table)
                .await
                .with_context(|| format!("the Postgres lease store of {}", args.table))?;
            let outputs = match &args.outputs_postgres {
                Some(at) => {
                    // The outputs commit with the lease row: in the leases' database.
                    anyhow::ensure!(
                        *at == url,
                        "--outputs-postgres must be the --lease-store database"
                    );
                    postgres_outputs(&args, at, Some(&store)).await?.0
                }
                None => {
                    anyhow::ensure!(
                        args.outputs_table.is_none() && args.plain_table.is_none(),
                        "with the leases in Postgres, the output tables are Postgres's: \
                         --outputs-postgres"
                    );
                    None
                }
            };
            Box::pin(start(args, sdk, journal, config, (store, None), outputs)).await
        }
    }
}

/// The output tables of the command line, if any.
fn tables(
    args: &Args,
    exactly: Option<outputs::Exactly>,
    plain: Option<outputs::Plain>,
) -> Option<OutputTables> {
    (exactly.is_some() || plain.is_some()).then(|| OutputTables {
        exactly,
        plain,
        work: Duration::from_millis(args.work_ms),
    })
}

/// The output tables in the Postgres database of `url`: committing with `leases`' rows when
/// given, else with a sink's position rows (returned, for `WorkerBuilder::positions`).
async fn postgres_outputs(
    args: &Args,
    url: &str,
    leases: Option<&PostgresLeaseStore>,
) -> anyhow::Result<(Option<OutputTables>, Option<PostgresSink>)> {
    let mut sink = None;
    let exactly = match (args.outputs_table.clone(), leases) {
        (None, _) => None,
        (Some(table), Some(store)) => Some(outputs::Exactly::PostgresLeases(store.clone(), table)),
        (Some(table), None) => {
            let opened = PostgresSink::connect(url, &args.table)
                .await
                .context("the Postgres sink of the outputs")?;
            sink = Some(opened.clone());
            Some(outputs::Exactly::PostgresSink(opened, table))
        }
    };
    let plain = match args.plain_table.clone() {
        Some(table) => Some(outputs::Plain::Postgres(
            outputs::plain_client(url).await?,
            table,
        )),
        None => None,
    };
    Ok((tables(args, exactly, plain), sink))
}

/// The recorder of each shard's records, as the command line says.
fn recorders(
    args: &Args,
    journal: &Journal,
    outputs: Option<OutputTables>,
) -> impl Fn(ShardId) -> Recorder + Send + Sync + 'static {
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
}

/// Runs the worker on `store`, whichever store it is, with what runs beside it (the sink
/// that keeps positions, if the outputs go to one).
async fn start<L: LeaseStore + Clone>(
    args: Args,
    sdk: aws_config::SdkConfig,
    journal: Journal,
    config: WorkerConfig,
    (store, sink): (L, Option<PostgresSink>),
    outputs: Option<OutputTables>,
) -> anyhow::Result<()> {
    let recorder = recorders(&args, &journal, outputs);
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
        journal,
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
        drive(build(id, config, (source, store), factory, sink)?, extra).await
    } else if let Some(table) = &args.dynamodb_streams_table {
        let source = DynamoDbStreamsSource::for_table(&sdk, table).await?;
        let factory = move |shard: &ShardId| recorder(shard.clone());
        drive(build(id, config, (source, store), factory, sink)?, extra).await
    } else {
        let source = KinesisShardSource::new(&sdk, args.stream.clone());
        let factory = move |shard: &ShardId| recorder(shard.clone());
        drive(build(id, config, (source, store), factory, sink)?, extra).await
    }
}

/// The worker, given `sink` if its outputs go to one.
fn build<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    id: &str,
    config: WorkerConfig,
    (source, store): (S, L),
    factory: F,
    sink: Option<PostgresSink>,
) -> anyhow::Result<Worker<S, L, F>> {
    let builder = Worker::builder(source, store).id(id).config(config);
    let builder = match sink {
        Some(sink) => builder.positions(sink),
        None => builder,
    };
    Ok(builder.build_with(factory)?)
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
struct Extra<L> {
    journal: Journal,
    singleton: Option<Singleton<L>>,
    /// `--http`: kcl-serve runs the worker.
    serving: Option<kcl_serve::Serving>,
}

/// Competes for the singleton until `stop`, journaling each run.
async fn compete<L: LeaseStore>(
    singleton: Singleton<L>,
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
    extra: Extra<L>,
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
