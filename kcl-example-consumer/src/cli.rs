//! Command-line interface: `run` (the default) consumes a stream, `demo` shows the framework
//! working on in-memory backends.
//!
//! Every `run` option can also come from a `KCL_…` environment variable or a config file key
//! of the same name (`failover-time` or `failover_time`). Each option is typed: its value
//! parser reads a flag, a variable and a file value alike ([`crate::settings`] lays the file
//! under the command line), so an error always names the key.

use clap::{Args, Parser, Subcommand};
use kcl_serve::LogFormat;

use crate::settings::RunArgs;
use crate::settings::parse::{parse_duration, parse_listen};

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
forces exit. `kcl-example-consumer drain` (a preStop hook) hands every lease over and stops it,
even under --restart-grace (POST /drain, from this host, with the token the consumer writes to
--drain-token-file).";

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
    /// Ask the consumer running beside this command (a pod's `preStop` hook) to hand every
    /// lease over and stop, for a scale-in; wait until it holds none, say what happened, and
    /// exit 0 once it is drained (1 if it is not by --timeout).
    Drain(DrainArgs),
    /// What the lease table will cost a fleet each month on on-demand DynamoDB, in each
    /// coordination mode, next to KCL Java 3.x's bill for the same fleet (an idle stream;
    /// checkpoints are extra and the same in every mode). DynamoDB only: a fleet run with
    /// `--lease-store postgres://…` has no such bill (docs/postgres.md counts its statements).
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

/// Options of `drain`.
#[derive(Debug, Args, Clone)]
pub(crate) struct DrainArgs {
    /// Address of the consumer's HTTP server (POST /drain answers local callers only); 0.0.0.0
    /// asks 127.0.0.1. Read from KCL_LISTEN or the config file's `listen` like the consumer.
    #[arg(long, env = "KCL_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub(crate) addr: std::net::SocketAddr,

    /// The consumer's drain token file, sent with the request (POST /drain refuses a caller
    /// without it). Read from KCL_DRAIN_TOKEN_FILE or the config file's `drain-token-file`
    /// like the consumer [default: /tmp/kcl-drain-<PORT>.token, PORT being --addr's].
    #[arg(long, env = "KCL_DRAIN_TOKEN_FILE", value_name = "FILE")]
    pub(crate) drain_token_file: Option<std::path::PathBuf>,

    /// Give up waiting after this long (exit 1): keep it below the pod's
    /// terminationGracePeriodSeconds, which counts the preStop hook too.
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    pub(crate) timeout: std::time::Duration,
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

/// The command for `argv`: `run`'s options read their `KCL_…` variables only where `run` is
/// what runs (no subcommand, or `run`), so that a variable meant for `run` never fails
/// `healthcheck`, `demo` or `cost`.
pub(crate) fn command_for(argv: &[std::ffi::OsString]) -> clap::Command {
    let other = argv
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|a| matches!(a, "demo" | "healthcheck" | "drain" | "cost" | "help"));
    if other { without_run_env() } else { command() }
}

/// The command with `run`'s options read from no variable (see [`command_for`]).
fn without_run_env() -> clap::Command {
    fn hide(arg: clap::Arg) -> clap::Arg {
        arg.hide_env_values(true)
    }
    <Cli as clap::CommandFactory>::command()
        .mut_subcommand("demo", |c| c.mut_args(hide))
        .mut_subcommand("healthcheck", |c| c.mut_args(hide))
        .mut_subcommand("drain", |c| c.mut_args(hide))
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
        .mut_subcommand("drain", |c| c.mut_args(hide))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        command().debug_assert();
        without_run_env().debug_assert();
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
