//! `run`'s options, typed: a flag's, a `KCL_…` variable's and a config file's value go
//! through the same value parser ([`super::parse`]), and the command line lays the file under
//! the flags and the environment ([`super::layered`]).

use kcl_core::failure::Exhausted;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use kcl_core::{BalanceBy, Coordination, InitialPositionKind, Liveness, RetrievalMode};
use kcl_serve::{LogFormat, SourceKind};

use super::Backend;
use super::parse::{
    OffOr, Span, Unlimited, parse_balance_by, parse_capacity, parse_count, parse_duration,
    parse_fraction, parse_listen, parse_max_leases, parse_port, parse_timestamp, parse_u32,
};
use crate::fault::Fault;

/// Who looks after the lease table: kcl-aws's `TableSetup`; text where no AWS backend reads
/// it (a build without feature `aws`).
#[cfg(feature = "aws")]
pub(crate) type TableSetupArg = kcl_aws::TableSetup;
/// Who looks after the lease table: kcl-aws's `TableSetup`; text where no AWS backend reads
/// it (a build without feature `aws`).
#[cfg(not(feature = "aws"))]
pub(crate) type TableSetupArg = String;

/// The default `--log-filter`.
const DEFAULT_LOG_FILTER: &str = "info,aws_config=error";

/// Options of `run`, typed: a flag's, a `KCL_…` variable's and a config file's value are
/// parsed by the same value parser ([`crate::settings`] lays the file under them). Each
/// reads the variable `KCL_<ID>` too ([`crate::cli::command`]).
#[derive(Debug, Args, Clone)]
pub(crate) struct RunArgs {
    /// Config file (TOML, or YAML for .yaml/.yml) whose keys mirror these flags.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// What is read: `kinesis` (a Kinesis stream: --stream or --streams) or
    /// `dynamodb-streams` (a DynamoDB table's stream: --table, or --stream with the stream's
    /// ARN; leases and checkpoints as the Java DynamoDB Streams Kinesis Adapter keeps them).
    #[arg(long, value_name = "SOURCE", default_value = "kinesis")]
    pub(crate) source: SourceKind,

    /// With --source dynamodb-streams: the DynamoDB table whose current stream
    /// (LatestStreamArn) is read.
    #[arg(long, value_name = "NAME")]
    pub(crate) table: Option<String>,

    /// Stream name or ARN (this or --streams is required); with --source dynamodb-streams,
    /// a DynamoDB stream ARN.
    #[arg(long, value_name = "NAME|ARN")]
    pub(crate) stream: Option<String>,

    /// Several streams, names or ARNs separated by commas (a list in a config file), read by
    /// one fleet in KCL Java's multi-stream mode: leases keyed
    /// `account:stream:creationEpoch:shardId`, so a KCL Java multi-stream table is picked up
    /// with its checkpoints (use it for a KCL Java multi-stream fleet even of one stream).
    /// Window lines name the shard by that key.
    #[arg(long, value_name = "NAME|ARN,…")]
    pub(crate) streams: Option<String>,

    /// With --streams: how long a stream that left the list (also across a restart) is still
    /// read before its leases are deleted; it keeps its checkpoints if it comes back within
    /// it [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) stream_removal_grace: Option<Duration>,

    /// Application name: the name of the DynamoDB lease table shared by every worker of this
    /// application (with --lease-store postgres, the application of its rows) (required).
    #[arg(long, value_name = "NAME")]
    pub(crate) application_name: Option<String>,

    /// Where a shard without a checkpoint starts: TRIM_HORIZON (oldest retained record),
    /// LATEST (new records only) or AT_TIMESTAMP (see --initial-timestamp).
    #[arg(long, value_name = "POSITION", default_value = "TRIM_HORIZON")]
    pub(crate) initial_position: InitialPositionKind,

    /// Start time for AT_TIMESTAMP, RFC 3339 (e.g. 2024-05-01T12:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = parse_timestamp)]
    pub(crate) initial_timestamp: Option<DateTime<Utc>>,

    /// This worker's unique id in the lease table [default: $POD_NAME, else <hostname>-<pid>].
    #[arg(long, value_name = "ID")]
    pub(crate) worker_id: Option<String>,

    /// Most leases (shards) this worker holds at once: a number or `unlimited`.
    #[arg(
        long,
        value_name = "N",
        default_value = "unlimited",
        value_parser = parse_max_leases
    )]
    pub(crate) max_leases: usize,

    /// Most leases asked from busier workers per balancing cycle.
    #[arg(
        long,
        value_name = "N",
        default_value = "1",
        value_parser = parse_count
    )]
    pub(crate) max_leases_to_steal: usize,

    /// Most reads (GetRecords, GetShardIterator) in flight at once across every shard held:
    /// bounds connections and in-flight responses (up to 10 MiB each).
    #[arg(
        long,
        value_name = "N",
        default_value = "16",
        value_parser = parse_count
    )]
    pub(crate) max_concurrent_reads: usize,

    /// Who reads the whole lease table: `leader` (an elected leader and a standby follow
    /// it through its stream; the others read only their own leases, so the table's reads
    /// grow with shards, not workers × shards), or `every-worker` (each worker reads it
    /// every second, as KCL Java 1.x and 2.x did).
    #[arg(long, value_name = "MODE", default_value = "leader")]
    pub(crate) coordination: Coordination,

    /// What the leader balances (with `--coordination leader`): `count` (the default: lease
    /// counts only, as KCL Java 2.x) or, opt-in, `load` (each worker's load per unit of
    /// capacity, from what each lease costs its holder: busy time, bytes and records read,
    /// backlog; written with the renewals the worker makes anyway). `every-worker`
    /// coordination balances counts.
    #[arg(
        long,
        value_name = "load|count",
        default_value = "count",
        value_parser = parse_balance_by
    )]
    pub(crate) balance_by: BalanceBy,

    /// This worker's capacity relative to a standard worker (1), between 0.001 and 1000: a
    /// worker of capacity 2 (twice the CPU) is given twice the load under `--balance-by load`.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_capacity)]
    pub(crate) capacity: f64,

    /// Serve KEDA's external scaler (gRPC) on this port, on the host of --listen: it answers
    /// with the fleet's desired_workers (docs/autoscaling.md). Off unless set; with it,
    /// --publish-interval defaults to 15s, so that every worker can answer.
    #[arg(long, value_name = "PORT", value_parser = parse_port)]
    pub(crate) scaler_port: Option<u16>,

    /// The workers the fleet asks for (desired_workers) read its backlog within this, on top
    /// of what keeps arriving.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub(crate) catch_up: Span,

    /// The share of each worker's capacity desired_workers plans to use (the headroom),
    /// above 0 and at most 1.
    #[arg(long, value_name = "FRACTION", default_value = "0.7", value_parser = parse_fraction)]
    pub(crate) utilization: f64,

    /// desired_workers is never below this (at least 1).
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_u32)]
    pub(crate) min_workers: u32,

    /// desired_workers is never above this; `unlimited`: only the shards cap it (a shard is
    /// read by one worker).
    #[arg(long, value_name = "N|unlimited", default_value = "unlimited")]
    pub(crate) max_workers: Unlimited,

    /// A rise of desired_workers is followed once the figure has asked for more for this long
    /// (0s: at once, as the HPA's default scale-up).
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub(crate) scale_up_window: Span,

    /// A fall of desired_workers goes only down to the highest figure of this window (the
    /// HPA's default scale-down stabilization): scale-in is slower than scale-out.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub(crate) scale_down_window: Span,

    /// How often the leader writes the fleet's figures to the lease table, from which every
    /// other worker answers an autoscaler (one row; 15s is about 5,800 write units a day), or
    /// `off` [default: 15s with --scaler-port, else off].
    #[arg(long, value_name = "DURATION|off")]
    pub(crate) publish_interval: Option<OffOr>,

    /// What proves a worker alive: `per-lease` (each held lease is renewed every third of
    /// the failover time, as KCL Java does) or `heartbeat` (one heartbeat row per worker,
    /// renewed every half failover time, whatever it holds: a tenth of the writes or less;
    /// every worker sharing the table must be kcl: KCL Java would take these leases).
    #[arg(long, value_name = "MODE", default_value = "per-lease")]
    pub(crate) liveness: Liveness,

    /// How records are read: `polling` (GetRecords, pausing `idle-time-between-reads` after
    /// an empty answer) or `fan-out` (enhanced fan-out: a stream consumer named after the
    /// application pushes records as they arrive; extra AWS cost per consumer-shard hour and
    /// per GB, at most 20 consumers a stream).
    #[arg(long, value_name = "MODE", default_value = "polling")]
    pub(crate) retrieval: RetrievalMode,

    /// A lease not renewed for this long is taken over by another worker (renewals happen
    /// every third of it).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub(crate) failover_time: Span,

    /// Graceful shutdown deadline: processors checkpoint and leases are handed back within it.
    /// Keep it below the orchestrator's kill timeout.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub(crate) shutdown_timeout: Span,

    /// With a worker id that is the same at every start (a StatefulSet pod's name, an ECS
    /// service's fixed name, a systemd unit): on SIGTERM its leases stay its own for this long
    /// beyond the failover time, and it resumes them at once when it comes back, so a rolling
    /// restart moves no lease. `off` (the default) hands them back at once: right for a
    /// Deployment, whose pods get new names.
    #[arg(long, value_name = "DURATION|off", default_value = "off")]
    pub(crate) restart_grace: OffOr,

    /// Records asked for per GetRecords call (1 to 10000).
    #[arg(
        long,
        value_name = "N",
        default_value = "10000",
        value_parser = parse_u32
    )]
    pub(crate) max_records: u32,

    /// Pause after an empty read before polling the shard again.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub(crate) idle_time_between_reads: Span,

    /// How often the stream's shards are listed to pick up resharding.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) shard_sync_interval: Span,

    /// A held shard whose checkpoint has not moved for this long while records past it wait
    /// is reported stalled (in /status, /readyz's text and kcl_shards_stalled): its
    /// processor hangs, keeps failing, or never checkpoints. Keep it above the window (this
    /// consumer checkpoints as each window closes). `off` reports no shard stalled.
    #[arg(long, value_name = "DURATION|off", default_value = "10m")]
    pub(crate) stalled_after: OffOr,

    /// What a batch that keeps failing costs (docs/when-a-record-fails.md): `block` (the
    /// shard restarts from its checkpoint until the batch succeeds: KCL Java's behaviour),
    /// `dead-letter` (the batch is bisected to the record that fails, which goes to
    /// --dead-letters after --failure-attempts tries) or `skip` (that record is logged at
    /// ERROR and passed).
    #[arg(long, value_name = "POLICY", default_value = "block")]
    pub(crate) on_failure: Exhausted,

    /// Tries of a failing record, the first included, before --on-failure applies.
    #[arg(long, value_name = "N", default_value = "3", value_parser = parse_u32)]
    pub(crate) failure_attempts: u32,

    /// Records of a shard given up in a row (none succeeding) after which the shard is taken
    /// to be in an outage, not to meet poison records: it gives up no more, blocks until a
    /// record succeeds, and fails readiness. 0: never.
    #[arg(long, value_name = "N", default_value = "10", value_parser = parse_u32)]
    pub(crate) failure_outage_after: u32,

    /// Where dead letters go: `sqs:QUEUE-URL`, `s3://BUCKET/PREFIX`, `kinesis:STREAM` or
    /// `file:PATH` (kcl-admin dead-letters reads them back). Needed by `--on-failure
    /// dead-letter`.
    #[arg(long, value_name = "LOCATION")]
    pub(crate) dead_letters: Option<String>,

    /// Length of the tumbling windows (by record arrival time) counted per shard.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) window: Span,

    /// Also write each closed window's counts (records, bytes) to this DynamoDB table exactly
    /// once: added to the item of its shard and window start in the same transaction as the
    /// checkpoint at the window's last record, conditioned on this worker's lease, so no
    /// crash, freeze or handoff adds a record twice or loses one. The table is the lease
    /// table's account and region; created on demand (partition key `shard`, sort key
    /// `window_start`, both strings) unless --table-setup is external. It belongs to one
    /// application (another is refused), and holds each shard's position, against which
    /// records checkpointed by a worker without this flag are reported (`GET
    /// /exactly-once`). Off unless set; needs backend aws. In Postgres with --lease-store
    /// postgres or --exactly-once-store: two tables, NAME and NAME_positions (a lowercase
    /// SQL name), made on demand alike.
    #[arg(long, value_name = "TABLE")]
    pub(crate) exactly_once_table: Option<String>,

    /// With the leases in DynamoDB: keep the --exactly-once-table in the Postgres database
    /// of this URL instead (`postgres://USER:PASSWORD@HOST:PORT/DATABASE`; the password is
    /// never printed). Each commit is one Postgres transaction of the windows, the shard's
    /// position and kcl-postgres's `kcl_positions` row (a `PostgresSink`, fenced by the worker
    /// for each tenure); the lease's checkpoint in DynamoDB follows. With --lease-store
    /// postgres the table is in the lease database already: not needed. Off unless set.
    #[arg(long, value_name = "URL")]
    pub(crate) exactly_once_store: Option<String>,

    /// Partition keys listed per window line (the busiest ones); 0 lists none.
    #[arg(long, value_name = "N", default_value = "20", value_parser = parse_count)]
    pub(crate) top_keys: usize,

    /// Address of the health and metrics HTTP server.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "0.0.0.0:8080",
        value_parser = parse_listen
    )]
    pub(crate) listen: SocketAddr,

    /// Where the drain token is written at start: a random secret that `POST /drain` must
    /// carry, which `kcl-example-consumer drain` (the preStop hook) reads from the same file
    /// [default: /tmp/kcl-drain-<PORT>.token, PORT being --listen's]. Must be writable: with a
    /// read-only root filesystem, an emptyDir at /tmp.
    #[arg(long, value_name = "FILE")]
    pub(crate) drain_token_file: Option<PathBuf>,

    /// Also push the metrics over OTLP/HTTP (protobuf) to URL, a collector beside the
    /// process, e.g. http://localhost:4318/v1/metrics (an AWS Distro for OpenTelemetry
    /// sidecar whose awsemf exporter puts them in CloudWatch). Off unless set.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,

    /// How often the metrics are pushed over OTLP (default 60s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) otlp_interval: Option<Duration>,

    /// Run the fleet's summary job, a singleton: every DURATION, on one worker of the fleet
    /// at a time, one JSON line on stdout with the lease table's state (and the messages sent
    /// to the job since the last one). Off unless set.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) summary_every: Option<Duration>,

    /// A file holding the shared secret of singleton messages: with it, the HTTP server
    /// takes `POST /singletons/summary/messages` (Authorization: Bearer <secret>) for the
    /// summary job. The endpoint is never open without a secret.
    #[arg(long, value_name = "PATH")]
    pub(crate) messages_secret_file: Option<String>,

    /// Where the other workers reach this one's HTTP server (e.g. `http://$(POD_IP):8080`),
    /// advertised in the summary job's row while this worker runs it. Needed with
    /// `--messages-secret-file`.
    #[arg(long, value_name = "URL")]
    pub(crate) advertise: Option<String>,

    /// Log format: pretty (human) or json (one object per line).
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "pretty",
        value_parser = LogFormat::parse
    )]
    pub(crate) log_format: LogFormat,

    /// Log filter, tracing-subscriber syntax (e.g. `info,kcl_core=debug`). The default leaves
    /// out the AWS SDK's own credential-chain warnings, repeated at every retry: the worker
    /// says once what fails and what to check.
    #[arg(
        long,
        value_name = "FILTER",
        default_value = DEFAULT_LOG_FILTER
    )]
    pub(crate) log_filter: String,

    /// Backends: aws (Kinesis and DynamoDB) or memory (an in-process stream of 4 shards fed
    /// by a built-in producer, to try the binary without AWS).
    #[arg(
        long,
        value_name = "BACKEND",
        default_value = "aws",
        value_parser = Backend::parse
    )]
    pub(crate) backend: Backend,

    /// For trying probes and alerts, never in production: the processor fails every call of
    /// this hook, `process-records` or `initialize`, so that each shard is reported
    /// `failing` and /readyz is not ready. `none` injects nothing.
    #[arg(
        long,
        value_name = "HOOK",
        default_value = "none",
        value_parser = Fault::parse
    )]
    pub(crate) inject_failure: Fault,

    /// Where the leases and checkpoints are kept: `dynamodb` (the table --application-name)
    /// or a Postgres URL, `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (kcl-postgres: the
    /// application's rows of the table `kcl_leases`; the password is never printed). The
    /// stream is read from Kinesis either way. With Postgres, --exactly-once-table is a
    /// Postgres table of the same database, committed with the lease row.
    #[arg(long, value_name = "dynamodb|URL", default_value = "dynamodb")]
    pub(crate) lease_store: String,

    /// Who looks after the lease table: `managed` (the worker creates it on first start and
    /// adds the owner index and the stream the leader mode uses; needs dynamodb:CreateTable
    /// and dynamodb:UpdateTable; in Postgres, CREATE on the schema) or `external` (made
    /// elsewhere, e.g. by Terraform or migrations: nothing is created or changed; a missing
    /// table stops the worker with what to create). The same for --exactly-once-table.
    #[arg(long, value_name = "SETUP", default_value = "managed")]
    pub(crate) table_setup: TableSetupArg,

    /// Print the effective settings, each with where it came from, and exit.
    #[arg(long)]
    pub(crate) print_config: bool,
}
