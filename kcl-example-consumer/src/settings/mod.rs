//! Effective settings of `run`: flag > `KCL_…` environment variable > config file > default.
//!
//! Clap does the layering: a config file's values are laid under the command line and the
//! environment as the options' defaults ([`layered`]), so that a flag's, a variable's and a
//! file's value go through the same typed value parser, and [`ArgMatches::value_source`] says
//! which one won. A value that does not parse, whatever its source, is reported in one line
//! naming the key, its source and why; so are the checks across keys here.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches};
use kcl_core::WorkerConfig;
use kcl_serve::source::is_table_name;

mod args;
mod autoscale;
mod checks;
mod endpoints;
mod exactly_once;
mod file;
mod input;
pub(crate) mod parse;
mod store;
mod worker;

pub(crate) use args::RunArgs;
use file::one_line;
pub(crate) use file::{FileValues, keys};
pub(crate) use store::{Leases, PostgresUrl};

pub(crate) use kcl_serve::{LogFormat, SourceSpec};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A command-line flag.
    Flag,
    /// A `KCL_…` environment variable.
    Env,
    /// The config file.
    File(PathBuf),
    /// The built-in default.
    Default,
}

/// An invalid setting: one line naming the key, where the value came from and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{}`{}: {reason}", kebab(key), origin_suffix(key, origin.as_ref()))]
pub(crate) struct SettingsError {
    /// The key (snake case).
    pub(crate) key: String,
    /// Where the bad value came from, if a value was involved.
    pub(crate) origin: Option<Origin>,
    /// Why it was rejected.
    pub(crate) reason: String,
}

fn kebab(key: &str) -> String {
    key.replace('_', "-")
}

fn env_name(key: &str) -> String {
    format!("KCL_{}", key.to_uppercase())
}

fn origin_suffix(key: &str, origin: Option<&Origin>) -> String {
    match origin {
        Some(Origin::Flag) => format!(" (from --{})", kebab(key)),
        Some(Origin::Env) => format!(" (from {})", env_name(key)),
        Some(Origin::File(path)) => format!(" (from {})", path.display()),
        Some(Origin::Default) => " (default)".to_owned(),
        None => String::new(),
    }
}

/// Where `run` reads the stream and keeps its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Kinesis and DynamoDB (or emulators) through kcl-aws.
    Aws,
    /// An in-process stream with a built-in producer, and an in-process lease table.
    Memory,
}

impl Backend {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "aws" => Ok(Self::Aws),
            "memory" => Ok(Self::Memory),
            _ => Err(format!("expected aws or memory, got {s:?}")),
        }
    }
}

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The stream, or streams, consumed.
    pub(crate) input: SourceSpec,
    /// Application name = lease table name.
    pub(crate) application_name: String,
    /// This worker's id.
    pub(crate) worker_id: String,
    /// The worker's configuration, validated by kcl-core.
    pub(crate) worker: WorkerConfig,
    /// Where dead letters go (`--dead-letters`, checked), if anywhere.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub(crate) dead_letters: Option<String>,
    /// Tumbling window length.
    pub(crate) window: Duration,
    /// Partition keys listed per window line.
    pub(crate) top_keys: usize,
    /// Where each window's counts are written exactly once (`--exactly-once-table`), if
    /// anywhere.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub(crate) exactly_once_table: Option<String>,
    /// The Postgres database of the exactly-once table while the leases are in DynamoDB
    /// (`--exactly-once-store`), if given.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) exactly_once_store: Option<PostgresUrl>,
    /// Where the leases are kept (`--lease-store`).
    pub(crate) lease_store: Leases,
    /// HTTP listen address.
    pub(crate) listen: SocketAddr,
    /// Where the drain token is written, when not its default place.
    pub(crate) drain_token_file: Option<PathBuf>,
    /// Where KEDA's external scaler is served, if it is.
    #[cfg_attr(not(feature = "scaler"), allow(dead_code))]
    pub(crate) scaler: Option<SocketAddr>,
    /// Where the metrics are also pushed over OTLP, if anywhere.
    pub(crate) otlp: Option<kcl_serve::OtlpSettings>,
    /// Log format.
    pub(crate) log_format: LogFormat,
    /// Log filter.
    pub(crate) log_filter: String,
    /// Backends.
    pub(crate) backend: Backend,
    /// Who looks after the lease table (used by the AWS backend only).
    #[cfg(feature = "aws")]
    pub(crate) table_setup: kcl_aws::TableSetup,
    /// The fleet's summary job, if configured.
    pub(crate) summary: Option<Summary>,
    /// The failure injected into the processor (`--inject-failure`), if any.
    pub(crate) fault: crate::fault::Fault,
    /// Each key's effective value (as text) and origin, for `--print-config`.
    pub(crate) effective: BTreeMap<String, (String, Origin)>,
}

/// The fleet's summary job: how often, and its messages.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub(crate) every: Duration,
    /// The messages' shared secret and where this worker is reached; `None`: no messages.
    pub(crate) messages: Option<(Secret, String)>,
}

/// A secret read from a file; never printed.
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Where the metrics are also pushed over OTLP/HTTP, and how often: to a collector beside
/// the process (plain HTTP), e.g. an ADOT sidecar whose `awsemf` exporter writes them to
/// CloudWatch.
fn otlp(
    a: &RunArgs,
    v: &Values<'_>,
    worker_id: &str,
) -> Result<Option<kcl_serve::OtlpSettings>, SettingsError> {
    let Some(endpoint) = a.otlp_endpoint.as_deref() else {
        if a.otlp_interval.is_some() {
            return Err(v.fail("otlp_interval", "only used with otlp-endpoint".into()));
        }
        return Ok(None);
    };
    if !endpoint.starts_with("http://") {
        return Err(v.fail(
            "otlp_endpoint",
            format!(
                "{endpoint:?}: want http://HOST:PORT/v1/metrics, a collector beside the process \
                 (this build speaks plain HTTP only)"
            ),
        ));
    }
    let every = a.otlp_interval.unwrap_or(Duration::from_secs(60));
    if every < Duration::from_secs(1) {
        return Err(v.fail("otlp_interval", "must be at least 1s".into()));
    }
    otlp_to(v, endpoint, every, worker_id)
}

#[cfg(not(feature = "otlp"))]
fn otlp_to(
    v: &Values<'_>,
    _endpoint: &str,
    _every: Duration,
    _worker_id: &str,
) -> Result<Option<kcl_serve::OtlpSettings>, SettingsError> {
    Err(v.fail(
        "otlp_endpoint",
        "this build has no OTLP exporter: build with `--features otlp`".into(),
    ))
}

#[cfg(feature = "otlp")]
fn otlp_to(
    _v: &Values<'_>,
    endpoint: &str,
    every: Duration,
    worker_id: &str,
) -> Result<Option<kcl_serve::OtlpSettings>, SettingsError> {
    Ok(Some(kcl_serve::Otlp {
        endpoint: endpoint.to_owned(),
        every,
        service: "kcl-example-consumer".to_owned(),
        instance: worker_id.to_owned(),
    }))
}

fn summary(a: &RunArgs, v: &Values<'_>) -> Result<Option<Summary>, SettingsError> {
    let Some(every) = a.summary_every else {
        if a.messages_secret_file.is_some() {
            return Err(v.fail(
                "messages_secret_file",
                "only used with summary-every".into(),
            ));
        }
        return Ok(None);
    };
    if every < Duration::from_secs(1) {
        return Err(v.fail("summary_every", "must be at least 1s".into()));
    }
    let messages = match a.messages_secret_file.as_deref() {
        None => None,
        Some(path) => {
            let secret = std::fs::read_to_string(path.trim())
                .map_err(|e| v.fail("messages_secret_file", format!("cannot read it: {e}")))?;
            let secret = secret.trim().to_owned();
            if secret.len() < 16 {
                return Err(v.fail(
                    "messages_secret_file",
                    "the secret must be at least 16 characters".into(),
                ));
            }
            let advertise = v.required("advertise", a.advertise.as_deref())?;
            if !advertise.starts_with("http://") {
                return Err(v.fail(
                    "advertise",
                    format!("expected http://host:port, got {advertise:?}"),
                ));
            }
            Some((Secret(secret), advertise))
        }
    };
    Ok(Some(Summary { every, messages }))
}

/// Why the command line cannot run: clap's own error (usage, `--help`, `--version`), or a
/// setting.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Printed and exited by clap.
    Clap(clap::Error),
    /// An invalid setting.
    Settings(SettingsError),
}

/// The command line `argv` of `command`, with the config file it names (`--config`,
/// `KCL_CONFIG`) laid under its flags and the environment.
pub(crate) fn matches(
    command: &clap::Command,
    argv: &[OsString],
) -> Result<(ArgMatches, Option<FileValues>), Failure> {
    let first = command
        .clone()
        .try_get_matches_from(argv)
        .map_err(|e| invalid(e, argv, None))?;
    let run = match first.subcommand() {
        None => &first,
        Some(("run", run)) => run,
        Some(_) => return Ok((first, None)),
    };
    let Some(path) = run.get_one::<PathBuf>("config") else {
        return Ok((first, None));
    };
    let file = FileValues::load(path).map_err(Failure::Settings)?;
    Ok((layered(command, argv, &file)?, Some(file)))
}

/// `argv` parsed by `command` with `file`'s values as the defaults of their options.
pub(crate) fn layered(
    command: &clap::Command,
    argv: &[OsString],
    file: &FileValues,
) -> Result<ArgMatches, Failure> {
    let lay = |command: clap::Command| {
        file.values.iter().fold(command, |command, (key, value)| {
            command.mut_arg(key, |arg| arg.default_value(value.clone()))
        })
    };
    lay(command.clone())
        .mut_subcommand("run", lay)
        .try_get_matches_from(argv)
        .map_err(|e| invalid(e, argv, Some(file)))
}

/// A value clap's parser refused, as a setting error naming where it came from; any other
/// clap error as it is.
fn invalid(e: clap::Error, argv: &[OsString], file: Option<&FileValues>) -> Failure {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let (ErrorKind::ValueValidation, Some(ContextValue::String(arg))) =
        (e.kind(), e.get(ContextKind::InvalidArg))
    else {
        return Failure::Clap(e);
    };
    // `--max-leases <N>`
    let flag = arg.split([' ', '=']).next().unwrap_or_default();
    let key = flag.trim_start_matches('-').replace('-', "_");
    let given = |a: &OsString| {
        a.to_str()
            .is_some_and(|a| a.split('=').next() == Some(flag))
    };
    let origin = if argv.iter().any(given) {
        Origin::Flag
    } else if std::env::var_os(env_name(&key)).is_some() {
        Origin::Env
    } else if let Some(file) = file.filter(|f| f.values.contains_key(&key)) {
        Origin::File(file.path.clone())
    } else {
        Origin::Default
    };
    let reason =
        std::error::Error::source(&e).map_or_else(|| one_line(&e.to_string()), |s| s.to_string());
    Failure::Settings(SettingsError {
        key,
        origin: Some(origin),
        reason,
    })
}

/// The settings of `run` from its matches (see [`matches`]) and the file laid under them.
pub(crate) fn resolve(
    matches: &ArgMatches,
    file: Option<&FileValues>,
) -> Result<Settings, SettingsError> {
    let args = RunArgs::from_arg_matches(matches).map_err(|e| SettingsError {
        key: "config".into(),
        origin: None,
        reason: one_line(&e.to_string()),
    })?;
    build(&args, &Values { matches, file })
}

/// Where each value came from, for the checks across keys and `--print-config`.
struct Values<'a> {
    matches: &'a ArgMatches,
    file: Option<&'a FileValues>,
}

impl Values<'_> {
    fn origin(&self, key: &str) -> Option<Origin> {
        match self.matches.value_source(key)? {
            ValueSource::CommandLine => Some(Origin::Flag),
            ValueSource::EnvVariable => Some(Origin::Env),
            _ => Some(match self.file.filter(|f| f.values.contains_key(key)) {
                Some(file) => Origin::File(file.path.clone()),
                None => Origin::Default,
            }),
        }
    }

    /// The error for `key`, naming where its value came from.
    fn fail(&self, key: &str, reason: String) -> SettingsError {
        SettingsError {
            key: key.to_owned(),
            origin: self.origin(key),
            reason,
        }
    }

    /// `value` of `key`, trimmed, required and not empty.
    fn required(&self, key: &str, value: Option<&str>) -> Result<String, SettingsError> {
        match value.map(str::trim) {
            Some("") => Err(self.fail(key, "must not be empty".into())),
            Some(v) => Ok(v.to_owned()),
            None => Err(self.fail(
                key,
                format!(
                    "required: pass --{}, set {} or add `{}` to the config file",
                    kebab(key),
                    env_name(key),
                    kebab(key)
                ),
            )),
        }
    }

    /// Each key's value as given (or defaulted), with its origin.
    fn effective(&self) -> BTreeMap<String, (String, Origin)> {
        keys()
            .into_iter()
            .filter_map(|key| {
                let raw = self.matches.get_raw(&key)?.next()?;
                let value = raw.to_string_lossy().into_owned();
                // A URL's user information and query may hold a password or a signature:
                // never printed (a sink such as `sqs:https://user:secret@host/q?sig=…`).
                let value = if value.contains("://") {
                    endpoints::shown(&value)
                } else {
                    value
                };
                Some((key.clone(), (value, self.origin(&key)?)))
            })
            .collect()
    }
}

fn build(a: &RunArgs, v: &Values<'_>) -> Result<Settings, SettingsError> {
    let mut effective = v.effective();
    let input = input::input(a, v)?;
    let application_name = v.required("application_name", a.application_name.as_deref())?;
    if !is_table_name(&application_name) {
        return Err(v.fail(
            "application_name",
            format!(
                "{application_name:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"
            ),
        ));
    }
    let worker_id = match &a.worker_id {
        Some(id) => v.required("worker_id", Some(id))?,
        None => {
            let id = default_worker_id();
            effective.insert("worker_id".into(), (id.clone(), Origin::Default));
            id
        }
    };
    if a.window.0 < Duration::from_secs(1) {
        return Err(v.fail("window", "must be at least 1s".into()));
    }
    // An empty batch on a quiet shard every quarter window (1 to 5 s): the open window
    // closes on time, not at the next record.
    let quiet = (a.window.0 / 4).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let worker = worker::worker_config(a, v, &application_name)?.empty_batch_interval(Some(quiet));
    let otlp = otlp(a, v, &worker_id)?;
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&a.log_filter) {
        return Err(v.fail("log_filter", one_line(&e.to_string())));
    }
    checks::fits_dynamodb(v, &input, a.backend, &worker)?;
    let summary = summary(a, v)?;
    let dead_letters = checks::dead_letters(a, v)?;
    let lease_store = store::leases(a, v)?;
    let exactly_once_store = store::exactly_once_store(a, v, &lease_store)?;
    let postgres = match (&lease_store, &exactly_once_store) {
        (Leases::Postgres(url), _) => Some(("lease_store", url)),
        (Leases::DynamoDb, Some(url)) => Some(("exactly_once_store", url)),
        (Leases::DynamoDb, None) => None,
    };
    let exactly_once_table = exactly_once::table(a, v, &application_name, postgres)?;
    let scaler = autoscale::scaler(a, v, a.listen, &mut effective)?;
    Ok(Settings {
        input,
        application_name,
        worker_id,
        worker,
        window: a.window.0,
        top_keys: a.top_keys,
        exactly_once_table,
        exactly_once_store,
        lease_store,
        listen: a.listen,
        drain_token_file: a.drain_token_file.clone(),
        scaler,
        otlp,
        log_format: a.log_format,
        log_filter: a.log_filter.clone(),
        backend: a.backend,
        #[cfg(feature = "aws")]
        table_setup: a.table_setup,
        summary,
        fault: a.inject_failure,
        dead_letters,
        effective,
    })
}

impl Settings {
    /// The effective settings as a config file (TOML), each line commented with its origin,
    /// then (as comments) the endpoint of each AWS service the run will call, as the
    /// environment sets them ([`endpoints`]).
    pub(crate) fn to_toml(&self) -> String {
        self.to_toml_with(&|name| std::env::var(name).ok())
    }

    /// [`to_toml`](Self::to_toml), the environment read through `env`.
    pub(crate) fn to_toml_with(&self, env: &dyn Fn(&str) -> Option<String>) -> String {
        let mut out = String::new();
        for (key, (value, origin)) in &self.effective {
            let from = match origin {
                Origin::Flag => format!("--{}", kebab(key)),
                Origin::Env => env_name(key),
                Origin::File(p) => p.display().to_string(),
                Origin::Default => "default".to_owned(),
            };
            let quoted = toml::Value::String(value.clone()).to_string();
            // A worker id made from this host is one worker's: commented out, so that the
            // output read back as a file (on another host) does not give two workers one id.
            let unpinned = key == "worker_id" && matches!(origin, Origin::Default);
            let (lead, from) = if unpinned {
                (
                    "# ",
                    "default: $POD_NAME, else <hostname>-<pid>; one per worker",
                )
            } else {
                ("", from.as_str())
            };
            out.push_str(&format!("{lead}{} = {quoted}  # {from}\n", kebab(key)));
        }
        out.push_str(&endpoints::section(self, env));
        out
    }
}

/// `$POD_NAME` (Kubernetes downward API), else `<hostname>-<pid>`.
pub(crate) fn default_worker_id() -> String {
    kcl_serve::default_worker_id(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests;
