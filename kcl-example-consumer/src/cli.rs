//! Command-line interface: `run` (the default) consumes a stream, `demo` shows the framework
//! working on in-memory backends.
//!
//! Every `run` option can also come from a `KCL_…` environment variable or a config file key
//! of the same name (`failover-time` or `failover_time`). Each option is typed: its value
//! parser reads a flag, a variable and a file value alike ([`crate::settings`] lays the file
//! under the command line), so an error always names the key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use kcl_core::{Coordination, InitialPositionKind, Liveness, RetrievalMode};
use kcl_serve::{LogFormat, SourceKind};

use crate::fault::Fault;
use crate::settings::Backend;
use crate::settings::parse::{
    OffOr, Span, parse_count, parse_listen, parse_max_leases, parse_timestamp, parse_u32,
};

/// Who looks after the lease table: kcl-aws's `TableSetup`; text where no AWS backend reads
/// it (a build without feature `aws`).
#[cfg(feature = "aws")]
pub(crate) type TableSetupArg = kcl_aws::TableSetup;
/// Who looks after the lease table: kcl-aws's `TableSetup`; text where no AWS backend reads
/// it (a build without feature `aws`).
#[cfg(not(feature = "aws"))]
pub(crate) type TableSetupArg = String;

/// The default `--log-filter`.
pub(crate) const DEFAULT_LOG_FILTER: &str = "info,aws_config=error";

const AFTER_HELP: &str = "\
Precedence: command-line flag > KCL_* environment variable > config file > default.
Config file keys mirror the flags: `failover-time = \"5s\"` (TOML) or `failover-time: 5s` (YAML).

AWS access uses the standard AWS configuration chain (AWS_REGION, AWS_PROFILE, web identity
for IAM roles for service accounts, ECS task roles, instance profiles). Point at emulators with
AWS_ENDPOINT_URL, or AWS_ENDPOINT_URL_KINESIS and AWS_ENDPOINT_URL_DYNAMODB.

Output: one JSON line per closed window on stdout; logs on stderr.
HTTP: /healthz (liveness), /readyz (worker running and lease table reachable),
/metrics (Prometheus text), /status (JSON).
Signals: SIGTERM or SIGINT shuts down gracefully within --shutdown-timeout; a second one
forces exit.";

/// A Kinesis consumer built on kcl: counts records and bytes per partition key in tumbling
/// windows and prints one JSON line per window.
#[derive(Debug, Parser)]
#[command(
    name = "kcl-example-consumer",
    version,
    args_conflicts_with_subcommands = true,
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    /// What to do; `run` when omitted.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Options of `run`, accepted without the subcommand.
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Consume a Kinesis stream, sharing its shards with the other workers of the application
    /// (the default).
    #[command(after_help = AFTER_HELP)]
    Run(Box<RunArgs>),
    /// Show leases spreading, moving on shutdown and crash, and no record lost, on in-memory
    /// backends (no install needed).
    Demo(DemoArgs),
    /// Probe a running consumer's health endpoint and exit 0 if it answers 200: a container
    /// health check for images without a shell or curl (distroless, ECS).
    Healthcheck(HealthcheckArgs),
    /// What the lease table will cost a fleet each month on on-demand DynamoDB, in each
    /// coordination mode, next to KCL Java 3.x's bill for the same fleet (an idle stream;
    /// checkpoints are extra and the same in every mode).
    Cost(CostArgs),
}

/// Options of `cost`.
#[derive(Debug, Args, Clone)]
pub(crate) struct CostArgs {
    /// Shards of the stream (leases).
    #[arg(long)]
    pub(crate) shards: u32,

    /// Workers of the fleet.
    #[arg(long)]
    pub(crate) workers: u32,

    /// The fleet's failover time.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) failover_time: std::time::Duration,

    /// Average size of a lease row in bytes (multi-stream keys are longer: about 330).
    #[arg(long, default_value = "267")]
    pub(crate) row_bytes: u32,
}

/// Options of `healthcheck`.
#[derive(Debug, Args, Clone)]
pub(crate) struct HealthcheckArgs {
    /// Address of the consumer's HTTP server; 0.0.0.0 probes 127.0.0.1.
    #[arg(long, env = "KCL_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: String,

    /// Path to probe: /healthz (alive) or /readyz (consuming).
    #[arg(long, default_value = "/healthz")]
    pub(crate) path: String,

    /// Give up after this long.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub(crate) timeout: std::time::Duration,
}

/// Options of `run`, typed: a flag's, a `KCL_…` variable's and a config file's value are
/// parsed by the same value parser ([`crate::settings`] lays the file under them). Each
/// reads the variable `KCL_<ID>` too ([`command`]).
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
    /// application (required).
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

    /// Length of the tumbling windows (by record arrival time) counted per shard.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub(crate) window: Span,

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

    /// Who looks after the lease table: `managed` (the worker creates it on first start and
    /// adds the owner index and the stream the leader mode uses; needs dynamodb:CreateTable
    /// and dynamodb:UpdateTable) or `external` (made elsewhere, e.g. by Terraform: nothing is
    /// created or changed; a missing table stops the worker with what to create).
    #[arg(long, value_name = "SETUP", default_value = "managed")]
    pub(crate) table_setup: TableSetupArg,

    /// Print the effective settings, each with where it came from, and exit.
    #[arg(long)]
    pub(crate) print_config: bool,
}

/// Options of `demo`.
#[derive(Debug, Args, Clone)]
pub(crate) struct DemoArgs {
    /// Shards of the demo stream.
    #[arg(long, default_value_t = 8)]
    pub(crate) shards: u32,

    /// Workers started at first (one more joins later).
    #[arg(long, default_value_t = 3)]
    pub(crate) workers: usize,

    /// Records produced per second.
    #[arg(long, default_value_t = 400)]
    pub(crate) rate: u32,

    /// Failover time of the workers: how long a crashed worker's leases take to move.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub(crate) failover_time: std::time::Duration,

    /// Do not split a shard during the run.
    #[arg(long)]
    pub(crate) no_split: bool,

    /// Do not crash a worker during the run (only the graceful stop is shown).
    #[arg(long)]
    pub(crate) no_crash: bool,

    /// Run against real endpoints (Kinesis and DynamoDB, or their emulators through
    /// AWS_ENDPOINT_URL_*) instead of the in-memory backends.
    #[arg(long, alias = "aws")]
    pub(crate) endpoints: bool,

    /// Log filter for the workers' logs on stderr (the demo's own report is on stdout).
    #[arg(long, env = "KCL_LOG_FILTER", default_value = "warn")]
    pub(crate) log_filter: String,

    /// Log format: pretty or json.
    #[arg(long, env = "KCL_LOG_FORMAT", default_value = "pretty", value_parser = LogFormat::parse)]
    pub(crate) log_format: LogFormat,
}

/// The command, with environment values hidden from `--help` (they may be secrets).
pub(crate) fn command() -> clap::Command {
    fn hide(arg: clap::Arg) -> clap::Arg {
        arg.hide_env_values(true)
    }
    /// A `run` option reads the variable named after it: `--max-leases`, `KCL_MAX_LEASES`.
    fn kcl_env(arg: clap::Arg) -> clap::Arg {
        if arg.get_long().is_none() || arg.get_id() == "print_config" {
            return arg;
        }
        let env = format!("KCL_{}", arg.get_id().as_str().to_uppercase());
        arg.env(env).hide_env_values(true)
    }
    <Cli as clap::CommandFactory>::command()
        .mut_args(kcl_env)
        .mut_subcommand("run", |c| c.mut_args(kcl_env))
        .mut_subcommand("demo", |c| c.mut_args(hide))
        .mut_subcommand("healthcheck", |c| c.mut_args(hide))
}

/// Parses `10s`, `500ms`, `1m30s`.
/// A duration such as `10s`, at most [`kcl_core::MAX_DURATION`] (7 days): beyond any useful
/// value, and small enough that adding it to a clock reading never overflows.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("expected a duration such as 10s, 500ms or 1m30s, got {s:?} ({e})"))?;
    if d > kcl_core::MAX_DURATION {
        return Err(format!("must be at most 7 days, got {}", s.trim()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn every_run_option_has_a_kcl_env_named_after_it() {
        let cmd = command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "print_config" || arg.is_positional() || arg.get_long().is_none() {
                continue;
            }
            let expected = format!("KCL_{}", id.to_uppercase());
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(expected.as_str()),
                "env of --{id}"
            );
        }
    }
}
