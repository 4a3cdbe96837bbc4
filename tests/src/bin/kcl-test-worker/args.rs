//! The worker's command line, and the `WorkerConfig` it makes.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use kcl_core::{
    Autoscaling, BalanceBy, Balancing, Coordination, InitialPosition, Liveness, RetrievalMode,
    WorkerConfig,
};

/// `--lease-store`: DynamoDB, or a Postgres server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseStoreArg {
    /// The DynamoDB table `--table`.
    DynamoDb,
    /// The Postgres server of this URL.
    Postgres(String),
}

impl FromStr for LeaseStoreArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "dynamodb" {
            Ok(Self::DynamoDb)
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Self::Postgres(s.to_owned()))
        } else {
            Err("expected `dynamodb` or a URL postgres://…".to_owned())
        }
    }
}

/// Command line of the test worker.
#[derive(Debug, Parser)]
pub(crate) struct Args {
    /// Stream name or ARN.
    #[arg(long)]
    pub(crate) stream: String,
    /// Lease table (application) name: under `--lease-store postgres://…`, the application
    /// whose rows the worker's leases are.
    #[arg(long)]
    pub(crate) table: String,
    /// Where the leases are: `dynamodb` (the table `--table`, on the environment's endpoint)
    /// or a Postgres URL (`postgres://user@host:port/db`: `kcl_postgres::PostgresLeaseStore`,
    /// the rows of application `--table`).
    #[arg(long, default_value = "dynamodb")]
    pub(crate) lease_store: LeaseStoreArg,
    /// Worker id.
    #[arg(long)]
    pub(crate) worker_id: String,
    /// JSONL file to append events to.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Failover time in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub(crate) failover_ms: u64,
    /// Taker interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub(crate) taker_ms: u64,
    /// Pause after an empty read, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub(crate) idle_ms: u64,
    /// Shard sync interval in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub(crate) shard_sync_ms: u64,
    /// Records per GetRecords.
    #[arg(long, default_value_t = 100)]
    pub(crate) max_records: u32,
    /// Most handoffs asked for in one taker cycle.
    #[arg(long, default_value_t = 1)]
    pub(crate) max_steal: usize,
    /// Most leases this worker holds (`max_leases`); unlimited if not given.
    #[arg(long)]
    pub(crate) max_leases: Option<usize>,
    /// Do not checkpoint after each batch (only at shard end and shutdown).
    #[arg(long)]
    pub(crate) no_batch_checkpoint: bool,
    /// Sleep this long in each batch before checkpointing, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) batch_delay_ms: u64,
    /// Sleep this long after journaling each record, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) record_delay_ms: u64,
    /// Also checkpoint at every N-th record of the shard (inside batches, so inside KPL
    /// aggregates); 0: never.
    #[arg(long, default_value_t = 0)]
    pub(crate) checkpoint_every: u64,
    /// Where a shard without a checkpoint starts: `trim-horizon` or `latest`.
    #[arg(long, default_value = "trim-horizon")]
    pub(crate) initial_position: String,
    /// `every-worker` or `leader`.
    #[arg(long, default_value = "leader")]
    pub(crate) coordination: Coordination,
    /// `per-lease` or `heartbeat`.
    #[arg(long, default_value = "per-lease")]
    pub(crate) liveness: Liveness,
    /// `polling` or `fan-out` (a stream consumer named after the table).
    #[arg(long, default_value = "polling")]
    pub(crate) retrieval: RetrievalMode,
    /// The call timeout in milliseconds (also how long a subscription may stay silent).
    #[arg(long, default_value_t = 15_000)]
    pub(crate) call_timeout_ms: u64,
    /// Multi-stream mode: the streams to consume, one name a line (`name LATEST` to start a
    /// new stream at LATEST), read at every shard sync; `--stream` is then ignored. Journal
    /// lines name shards by their lease keys (`account:stream:epoch:shardId`).
    #[arg(long)]
    pub(crate) streams_file: Option<PathBuf>,
    /// Multi-stream mode: how long a stream gone from the file is still read before its
    /// leases are deleted, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub(crate) stream_removal_grace_ms: u64,
    /// Also compete for the singleton task NAME (lines `singleton_start` with its fencing
    /// token and `singleton_stop`); its failover time is the worker's.
    #[arg(long)]
    pub(crate) singleton: Option<String>,
    /// How often singleton candidates read the row, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub(crate) singleton_poll_ms: u64,
    /// With `--singleton`: take messages for it over HTTP on a free local port, with this
    /// shared secret (lines `message` with the text and the fencing token).
    #[arg(long)]
    pub(crate) messenger_secret: Option<String>,
    /// Journal one `batch` line per batch (shard, record count, first record's payload)
    /// instead of a line per record: for measuring the worker's own cost.
    #[arg(long)]
    pub(crate) journal_batches: bool,
    /// Process with `kcl_core::Parallel`, this many records of a shard at once, in order per
    /// partition key: a `record_start` line when a record's handler starts, its `record` line
    /// when it finishes, after a pause of up to twice `--record-delay-ms`, or for one record in
    /// ten, ten times it (drawn from the record's sequence number).
    #[arg(long)]
    pub(crate) parallel: Option<usize>,
    /// Under `--parallel`: the first record of this partition key the handler gets never
    /// finishes (it waits for ever), so the key's later records wait behind it and the shard's
    /// checkpoint stays before it while the other keys' records finish.
    #[arg(long)]
    pub(crate) stuck_pk: Option<String>,
    /// Read this DynamoDB table's stream (`kcl_aws::DynamoDbStreamsSource`) instead of
    /// `--stream`; a record's data is the adapter's JSON.
    #[arg(long)]
    pub(crate) dynamodb_streams_table: Option<String>,
    /// Keep the leases through a restart for this long beyond the failover time
    /// (`restart_grace`), in milliseconds; released at once when not given.
    #[arg(long)]
    pub(crate) restart_grace_ms: Option<u64>,
    /// Checkpoint acknowledged records after this many (`ack_checkpoint_every`).
    #[arg(long, default_value_t = 1000)]
    pub(crate) ack_checkpoint_every: u64,
    /// ... or this long, in milliseconds (`ack_checkpoint_interval`).
    #[arg(long, default_value_t = 5000)]
    pub(crate) ack_checkpoint_ms: u64,
    /// `load` or `count` (`Balancing::by`).
    #[arg(long, default_value = "count", value_parser = ["load", "count"])]
    pub(crate) balance_by: String,
    /// This worker's capacity (`Balancing::capacity`).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) capacity: f64,
    /// The load figures' time constant, in milliseconds (`Balancing::smoothing`).
    #[arg(long, default_value_t = 60_000)]
    pub(crate) smoothing_ms: u64,
    /// The move budget's window, in milliseconds (`Balancing::move_window`).
    #[arg(long, default_value_t = 60_000)]
    pub(crate) move_window_ms: u64,
    /// `Balancing::stickiness`, in milliseconds.
    #[arg(long, default_value_t = 600_000)]
    pub(crate) stickiness_ms: u64,
    /// A file naming hot shards, one id a line, read at each batch: each record of a hot
    /// shard costs `--hot-record-ms` of busy time, slept after journaling it.
    #[arg(long)]
    pub(crate) hot_shards_file: Option<PathBuf>,
    /// What one record of a hot shard costs, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) hot_record_ms: u64,
    /// Serve as a deployed process does (kcl-serve): `/healthz`, `/metrics`, `/status` and
    /// `POST /drain` on a free local port, and KEDA's external scaler on another; a `serving`
    /// line names both (`http`, `scaler`). Signals are then kcl-serve's.
    #[arg(long)]
    pub(crate) http: bool,
    /// `Autoscaling::catch_up`, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub(crate) catch_up_ms: u64,
    /// `Autoscaling::min_workers`.
    #[arg(long, default_value_t = 1)]
    pub(crate) min_workers: u32,
    /// `Autoscaling::scale_down_window`, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub(crate) scale_down_window_ms: u64,
    /// `Autoscaling::publish_interval`, in milliseconds; not published when not given.
    #[arg(long)]
    pub(crate) publish_ms: Option<u64>,
    /// Commit each record's output (`ADD n :1` on the item `shard/seq/sub`) into this table
    /// with the batch's checkpoint, exactly once (`Checkpointer::commit_outputs`), instead of
    /// checkpointing after each batch; journal `work`, then `committed`, `commit_refused`
    /// (the lease was lost) or `commit_failed` (see the `outputs` module).
    #[arg(long)]
    pub(crate) outputs_table: Option<String>,
    /// Also write each record's output into this table with a plain `UpdateItem`, before the
    /// checkpoint: at least once.
    #[arg(long)]
    pub(crate) plain_table: Option<String>,
    /// With `--outputs-table` or `--plain-table`: the tables are in this Postgres database
    /// (made by the caller: `id text primary key, n bigint, data text`); the outputs commit
    /// with the lease row when the leases are in this database too, else with the shard's
    /// `kcl_positions` row (a `PostgresSink` the worker is given).
    #[arg(long)]
    pub(crate) outputs_postgres: Option<String>,
    /// With `--outputs-table` or `--plain-table`: each batch works this long on its thread
    /// (blocking it) before its commit, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) work_ms: u64,
}

/// The autoscaling of `--catch-up-ms`, `--min-workers`, `--scale-down-window-ms` and
/// `--publish-ms` (the rest as default).
pub(crate) fn autoscaling(args: &Args) -> Autoscaling {
    let ms = Duration::from_millis;
    Autoscaling::default()
        .catch_up(ms(args.catch_up_ms))
        .workers(args.min_workers, None)
        .windows(Duration::ZERO, ms(args.scale_down_window_ms))
        .publish_interval(args.publish_ms.map(ms))
}

/// The balancing of `--balance-by`, `--capacity`, `--smoothing-ms`, `--move-window-ms` and
/// `--stickiness-ms` (budget and band as default).
pub(crate) fn balancing(args: &Args) -> Balancing {
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

/// The worker's settings, from the command line.
pub(crate) fn worker_config(args: &Args) -> anyhow::Result<WorkerConfig> {
    let ms = Duration::from_millis;
    let initial = match args.initial_position.as_str() {
        "latest" => InitialPosition::Latest,
        "trim-horizon" => InitialPosition::TrimHorizon,
        other => anyhow::bail!("invalid --initial-position {other}"),
    };
    Ok(WorkerConfig::default()
        .failover_time(ms(args.failover_ms))
        .taker_interval(ms(args.taker_ms))
        .idle_time_between_reads(ms(args.idle_ms))
        .shard_sync_interval(ms(args.shard_sync_ms))
        .parent_poll_interval(ms(200))
        .max_records(args.max_records)
        .max_leases_to_steal(args.max_steal)
        .max_leases(args.max_leases.unwrap_or(usize::MAX))
        .max_backoff(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(10))
        .coordination(args.coordination)
        .liveness(args.liveness)
        .retrieval(args.retrieval.with_consumer(args.table.clone()))
        .call_timeout(ms(args.call_timeout_ms))
        .ack_checkpoint_every(args.ack_checkpoint_every)
        .ack_checkpoint_interval(ms(args.ack_checkpoint_ms))
        .restart_grace(args.restart_grace_ms.map(ms))
        .balancing(balancing(args))
        .autoscaling(autoscaling(args))
        .initial_position(initial))
}
