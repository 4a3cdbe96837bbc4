//! `kcl-example-consumer`: a Kinesis consumer built on kcl, and a demo of the framework.
//!
//! `run` (the default) consumes a stream through Kinesis and DynamoDB; `demo` runs a small
//! fleet on the in-memory backends. See `--help`.

mod backends;
mod cli;
mod cost;
mod demo;
#[cfg(feature = "aws")]
mod exactly_once;
mod fault;
#[cfg(feature = "postgres")]
mod postgres;
mod settings;
mod summary;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::FromArgMatches;
use kcl_core::failure::DeadLetters;
use kcl_core::{LeaseStore, ProcessorFactory, ShardSource, Worker};
use kcl_example_consumer::table::WindowTable;
use kcl_example_consumer::{StdoutSink, WindowCounter};
use kcl_serve as http;
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, Command};
use crate::settings::{Failure, Settings};

/// Exit code for invalid settings (as clap uses for usage errors).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (matches, file) = match settings::matches(&cli::command_for(&argv), &argv) {
        Ok(parsed) => parsed,
        Err(Failure::Clap(e)) => e.exit(),
        Err(Failure::Settings(e)) => return fail(&e.to_string(), EXIT_USAGE),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}"), 1),
    };
    match cli.command {
        Some(Command::Demo(args)) => {
            if let Err(e) = http::init_logging(args.log_format, &args.log_filter) {
                return fail(&e, EXIT_USAGE);
            }
            match runtime.block_on(demo::run(args)) {
                Ok(code) => code,
                Err(e) => fail(&format!("{e:#}"), 1),
            }
        }
        Some(Command::Healthcheck(args)) => {
            let listen = match listen_of(&matches, ("healthcheck", "listen"), &args.listen) {
                Ok(listen) => listen,
                Err(e) => return fail(&e.to_string(), EXIT_USAGE),
            };
            match http::healthcheck(&listen, &args.path, args.timeout) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e, 1),
            }
        }
        Some(Command::Drain(args)) => drain(&matches, &args),
        Some(Command::Cost(args)) => cost::print(&args),
        Some(Command::Run(_)) | None => {
            let run_matches = matches.subcommand_matches("run").unwrap_or(&matches);
            let settings = match settings::resolve(run_matches, file.as_ref()) {
                Ok(s) => s,
                Err(e) => return fail(&e.to_string(), EXIT_USAGE),
            };
            if run_matches.get_flag("print_config") {
                return print_config(&settings);
            }
            if let Err(e) = http::init_logging(settings.log_format, &settings.log_filter) {
                return fail(&e, EXIT_USAGE);
            }
            match runtime.block_on(backends::run(settings)) {
                Ok(code) => code,
                Err(e) => {
                    // Logging is set up by now: the chain once, in the log's format.
                    tracing::error!(error = format!("{e:#}"), "consumer failed");
                    ExitCode::from(1)
                }
            }
        }
    }
}

#[allow(clippy::print_stderr)]
fn fail(message: &str, code: u8) -> ExitCode {
    eprintln!("kcl-example-consumer: {message}");
    ExitCode::from(code)
}

/// The address `healthcheck` probes or `drain` asks (`(subcommand, option)`): the option or
/// `KCL_LISTEN`, else the `listen` of the config file the consumer reads (`KCL_CONFIG`), else
/// the consumer's default: the address the consumer beside it serves on, however it was told.
fn listen_of(
    matches: &clap::ArgMatches,
    (subcommand, option): (&str, &str),
    given: &impl ToString,
) -> Result<String, settings::SettingsError> {
    let given = given.to_string();
    let defaulted = matches
        .subcommand_matches(subcommand)
        .and_then(|m| m.value_source(option))
        .is_none_or(|source| source == clap::parser::ValueSource::DefaultValue);
    let Some(path) = std::env::var_os("KCL_CONFIG").filter(|_| defaulted) else {
        return Ok(given);
    };
    let file = settings::FileValues::load(std::path::Path::new(&path))?;
    Ok(file.values.get("listen").cloned().unwrap_or(given))
}

/// `drain`: asks the consumer beside it to hand its leases over and stop, and says how it
/// went.
#[allow(clippy::print_stdout)]
fn drain(matches: &clap::ArgMatches, args: &cli::DrainArgs) -> ExitCode {
    let addr = listen_of(matches, ("drain", "addr"), &args.addr).and_then(|a| {
        settings::parse::parse_listen(&a).map_err(|reason| settings::SettingsError {
            key: "listen".into(),
            origin: None,
            reason,
        })
    });
    let addr = match addr {
        Ok(addr) => addr,
        Err(e) => return fail(&e.to_string(), EXIT_USAGE),
    };
    let token = match drain_token_file(args, addr) {
        Ok(token) => token,
        Err(e) => return fail(&e.to_string(), EXIT_USAGE),
    };
    match http::drain::request_with(addr, &token, args.timeout) {
        Ok(done) => {
            println!(
                "drained: {} lease{} handed over in {:.1}s; the consumer stops now",
                done.leases,
                if done.leases == 1 { "" } else { "s" },
                done.took.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&format!("drain: {e}"), 1),
    }
}

/// The drain token file `drain` reads: `--drain-token-file` or `KCL_DRAIN_TOKEN_FILE`, else
/// the `drain-token-file` of the config file the consumer reads (`KCL_CONFIG`), else the
/// default place for `addr`'s port: where the consumer beside it wrote it, however it was told.
fn drain_token_file(
    args: &cli::DrainArgs,
    addr: std::net::SocketAddr,
) -> Result<std::path::PathBuf, settings::SettingsError> {
    if let Some(path) = &args.drain_token_file {
        return Ok(path.clone());
    }
    if let Some(config) = std::env::var_os("KCL_CONFIG") {
        let file = settings::FileValues::load(std::path::Path::new(&config))?;
        if let Some(path) = file.values.get("drain_token_file") {
            return Ok(path.into());
        }
    }
    Ok(http::drain::token::default_path(addr.port()))
}

#[allow(clippy::print_stdout)]
fn print_config(settings: &Settings) -> ExitCode {
    print!("{}", settings.to_toml());
    ExitCode::SUCCESS
}

/// The processor factory of `run`: one [`WindowCounter`] per shard, printing to stdout
/// (failing on purpose with `--inject-failure`), committing its windows to `table` if given
/// (`--exactly-once-table`).
pub(crate) fn window_counters(
    settings: &Settings,
    table: Option<Arc<dyn WindowTable>>,
) -> impl ProcessorFactory<Processor = fault::Faulty<WindowCounter<StdoutSink>>> {
    let (window, top_keys, fault) = (settings.window, settings.top_keys, settings.fault);
    move |shard: &kcl_core::ShardId| {
        let counter = WindowCounter::new(shard, window, top_keys, StdoutSink);
        let counter = match &table {
            Some(table) => counter.with_table(table.clone()),
            None => counter,
        };
        fault::Faulty::new(counter, fault)
    }
}

/// What a run serves beside the probes and metrics: routes, and problems for `/status`
/// (`--exactly-once-table`'s).
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) routes: axum::Router,
    pub(crate) problems: http::AppProblems,
}

/// What a worker is given beside its source, store and processors.
#[derive(Default)]
pub(crate) struct Extras {
    /// Where its dead letters go (`--dead-letters`).
    pub(crate) letters: Option<DeadLetters>,
    /// Routes and problems to serve (`--exactly-once-table`'s).
    pub(crate) served: Option<Served>,
    /// The sink the exactly-once table commits through, which keeps each shard's position
    /// (`--exactly-once-store`): the worker fences it for each tenure.
    #[cfg(feature = "postgres")]
    pub(crate) positions: Option<kcl_postgres::PostgresSink>,
}

/// Runs a worker on any backends with everything `run` promises: metrics and health over
/// HTTP, graceful shutdown on the first SIGTERM/SIGINT, forced on the second.
pub(crate) async fn run_worker<S, L, F>(
    settings: &Settings,
    source: S,
    store: L,
    factory: F,
    extras: Extras,
) -> anyhow::Result<ExitCode>
where
    S: ShardSource,
    L: LeaseStore + Clone,
    F: ProcessorFactory,
{
    let summary = summary::start(settings, &store)?;
    let mut serving =
        http::Serving::start_with(settings.listen, &settings.worker, settings.otlp.as_ref())
            .await?;
    #[cfg(feature = "scaler")]
    if let Some(addr) = settings.scaler {
        serving = serving.with_scaler(addr).await?;
    }
    if let Some(path) = &settings.drain_token_file {
        serving = serving.with_drain_token(path.clone());
    }
    let mut builder = Worker::builder(source, store)
        .id(settings.worker_id.clone())
        .config(settings.worker.clone());
    if let Some(letters) = extras.letters {
        builder = builder.dead_letters(letters);
    }
    // Without it, every commit into the sink would be refused (PositionsNotOpened).
    #[cfg(feature = "postgres")]
    if let Some(sink) = extras.positions {
        builder = builder.positions(sink);
    }
    let worker = builder.build_with(factory).map_err(|e| {
        anyhow::anyhow!(
            "invalid setting `{}`: {}",
            e.key.replace('_', "-"),
            e.reason
        )
    })?;
    let (routes, problems) = extras.served.map(|s| (s.routes, s.problems)).unzip();
    let options = http::Options {
        routes: [summary.as_ref().and_then(|s| s.routes.clone()), routes]
            .into_iter()
            .flatten()
            .reduce(axum::Router::merge),
        problems,
        on_signal: summary
            .as_ref()
            .map_or_else(CancellationToken::new, |s| s.stop.clone()),
        ..http::Options::default()
    };
    tracing::info!(
        worker_id = %settings.worker_id,
        stream = %settings.input,
        application = %settings.application_name,
        "starting"
    );
    warn_unstable_id(settings);
    let ended = serving
        .run(worker, settings.worker_id.clone(), options)
        .await;
    if let Some(summary) = summary {
        let _ = tokio::time::timeout(Duration::from_secs(5), summary.task).await;
    }
    match ended {
        http::Ended::Stopped => Ok(ExitCode::SUCCESS),
        http::Ended::Forced | http::Ended::Exited => Ok(ExitCode::from(130)),
        http::Ended::Failed(e) => Err(anyhow::Error::new(e).context("the worker failed")),
    }
}

/// Warns when `restart_grace` is set for a worker whose id the next start will not have.
fn warn_unstable_id(settings: &Settings) {
    let generated = settings
        .effective
        .get("worker_id")
        .is_some_and(|(_, origin)| *origin == settings::Origin::Default)
        && std::env::var_os("POD_NAME").is_none();
    if generated && settings.worker.restart_grace.is_some() {
        tracing::warn!(
            worker_id = %settings.worker_id,
            "restart_grace is set, but this worker's id is made of the host name and process \
             id, which the next start will not have: its leases will wait the failover time + \
             the grace for a worker that never comes; give a stable --worker-id (a \
             StatefulSet's POD_NAME), or turn restart_grace off"
        );
    }
}
