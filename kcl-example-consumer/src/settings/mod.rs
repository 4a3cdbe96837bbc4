//! Effective settings of `run`: flag > `KCL_…` environment variable > config file > default.
//!
//! Clap reports whether a value came from the command line, the environment or its default
//! ([`ArgMatches::value_source`]); a config file value fills in wherever clap only had its
//! default. Every value, whatever its source, then goes through the same parser, so an invalid
//! one is reported in one line naming the key, its source and why.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use kcl_core::{Retrieval, WorkerConfig};

use crate::cli::parse_duration;

mod input;
mod parse;
mod worker;

pub(crate) use kcl_serve::SourceSpec;

use kcl_serve::source::is_table_name;
use parse::parse_count;
use worker::worker_config;

/// Every setting key, as the clap argument id (snake case). Flags and file keys are the
/// kebab-case form; file keys may also be written in snake case.
pub(crate) const KEYS: &[&str] = &[
    "source",
    "table",
    "stream",
    "streams",
    "stream_removal_grace",
    "application_name",
    "initial_position",
    "initial_timestamp",
    "worker_id",
    "max_leases",
    "max_leases_to_steal",
    "max_concurrent_reads",
    "coordination",
    "liveness",
    "retrieval",
    "failover_time",
    "shutdown_timeout",
    "max_records",
    "idle_time_between_reads",
    "shard_sync_interval",
    "stalled_after",
    "window",
    "top_keys",
    "listen",
    "otlp_endpoint",
    "otlp_interval",
    "summary_every",
    "messages_secret_file",
    "advertise",
    "log_format",
    "log_filter",
    "backend",
    "inject_failure",
    "table_setup",
];

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

pub(crate) use kcl_serve::LogFormat;

/// Where `run` reads the stream and keeps its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Kinesis and DynamoDB (or emulators) through kcl-aws.
    Aws,
    /// An in-process stream with a built-in producer, and an in-process lease table.
    Memory,
}

impl Backend {
    fn parse(s: &str) -> Result<Self, String> {
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
    /// Tumbling window length.
    pub(crate) window: Duration,
    /// Partition keys listed per window line.
    pub(crate) top_keys: usize,
    /// HTTP listen address.
    pub(crate) listen: SocketAddr,
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
    pub(crate) effective: BTreeMap<&'static str, (String, Origin)>,
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
fn otlp(v: &Values, worker_id: &str) -> Result<Option<kcl_serve::OtlpSettings>, SettingsError> {
    let every = v.parsed("otlp_interval", parse_duration)?;
    let Some(endpoint) = v.get("otlp_endpoint") else {
        if every.is_some() {
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
    let every = every.unwrap_or(Duration::from_secs(60));
    if every < Duration::from_secs(1) {
        return Err(v.fail("otlp_interval", "must be at least 1s".into()));
    }
    otlp_to(v, endpoint, every, worker_id)
}

#[cfg(not(feature = "otlp"))]
fn otlp_to(
    v: &Values,
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
    _v: &Values,
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

fn summary(v: &Values) -> Result<Option<Summary>, SettingsError> {
    let Some(every) = v.parsed("summary_every", parse_duration)? else {
        if v.get("messages_secret_file").is_some() {
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
    let messages = match v.get("messages_secret_file") {
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
            let advertise = v.required("advertise")?;
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

/// Values read from a config file, by snake-case key.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileValues {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

impl FileValues {
    /// Reads `path`: YAML if it ends in `.yaml` or `.yml`, TOML otherwise.
    pub(crate) fn load(path: &Path) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|e| SettingsError {
            key: "config".into(),
            origin: None,
            reason: format!("cannot read {}: {e}", path.display()),
        })?;
        let yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        Self::parse(path, &text, yaml)
    }

    /// Parses file contents.
    pub(crate) fn parse(path: &Path, text: &str, yaml: bool) -> Result<Self, SettingsError> {
        let syntax = |reason: String| SettingsError {
            key: "config".into(),
            origin: None,
            reason: format!("{}: {}", path.display(), one_line(&reason)),
        };
        let map: serde_json::Map<String, serde_json::Value> = if yaml {
            if text.trim().is_empty() {
                serde_json::Map::new()
            } else {
                serde_norway::from_str(text).map_err(|e| syntax(e.to_string()))?
            }
        } else {
            toml::from_str(text).map_err(|e| syntax(e.to_string()))?
        };
        let mut values = BTreeMap::new();
        for (raw_key, value) in map {
            let key = raw_key.replace('-', "_");
            if !KEYS.contains(&key.as_str()) {
                return Err(SettingsError {
                    key: raw_key,
                    origin: Some(Origin::File(path.to_owned())),
                    reason: format!("unknown key; known keys: {}", known_keys()),
                });
            }
            let text = scalar(&value).ok_or_else(|| SettingsError {
                key: key.clone(),
                origin: Some(Origin::File(path.to_owned())),
                reason: format!("expected a single value, got {value}"),
            })?;
            values.insert(key, text);
        }
        Ok(Self {
            path: path.to_owned(),
            values,
        })
    }
}

fn known_keys() -> String {
    KEYS.iter().map(|k| kebab(k)).collect::<Vec<_>>().join(", ")
}

/// A file value as text: strings as they are, numbers and booleans printed, a list of
/// strings joined by commas, a TOML datetime (which serde sees as a one-entry map) as its
/// string.
fn scalar(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        // A list (of streams): joined as it is written on the command line.
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(",")),
        Value::Object(m) if m.len() == 1 => match m.values().next() {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Picks each key's value from flags/env (`matches`), then `file`, then clap's default.
pub(crate) fn resolve(
    matches: &ArgMatches,
    file: Option<&FileValues>,
) -> Result<Settings, SettingsError> {
    let mut effective = BTreeMap::new();
    for &key in KEYS {
        let from_clap = matches.get_one::<String>(key).cloned();
        let picked = match (matches.value_source(key), from_clap) {
            (Some(ValueSource::CommandLine), Some(v)) => Some((v, Origin::Flag)),
            (Some(ValueSource::EnvVariable), Some(v)) => Some((v, Origin::Env)),
            (_, default) => match file.and_then(|f| f.values.get(key).map(|v| (f, v))) {
                Some((f, v)) => Some((v.clone(), Origin::File(f.path.clone()))),
                None => default.map(|v| (v, Origin::Default)),
            },
        };
        if let Some(picked) = picked {
            effective.insert(key, picked);
        }
    }
    build(effective)
}

/// The effective values, with what every check of them needs.
struct Values(BTreeMap<&'static str, (String, Origin)>);

impl Values {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|(v, _)| v.as_str())
    }

    /// The error for `key`, naming where its value came from.
    fn fail(&self, key: &str, reason: String) -> SettingsError {
        SettingsError {
            key: key.to_owned(),
            origin: self.0.get(key).map(|(_, o)| o.clone()),
            reason,
        }
    }

    /// `key`'s value parsed with `parse`; `None` if the key has no value.
    fn parsed<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, SettingsError> {
        self.get(key)
            .map(|v| parse(v).map_err(|r| self.fail(key, r)))
            .transpose()
    }

    fn required(&self, key: &str) -> Result<String, SettingsError> {
        match self.get(key) {
            Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
            Some(_) => Err(self.fail(key, "must not be empty".into())),
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
}

fn build(
    mut effective: BTreeMap<&'static str, (String, Origin)>,
) -> Result<Settings, SettingsError> {
    if !effective.contains_key("worker_id") {
        effective.insert("worker_id", (default_worker_id(), Origin::Default));
    }
    let v = Values(effective);
    let input = input::input(&v)?;
    let application_name = v.required("application_name")?;
    if !is_table_name(&application_name) {
        return Err(v.fail(
            "application_name",
            format!(
                "{application_name:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"
            ),
        ));
    }
    let worker_id = v.required("worker_id")?;
    let window = v
        .parsed("window", parse_duration)?
        .unwrap_or(Duration::from_secs(60));
    if window < Duration::from_secs(1) {
        return Err(v.fail("window", "must be at least 1s".into()));
    }
    // An empty batch on a quiet shard every quarter window (1 to 5 s): the open window
    // closes on time, not at the next record.
    let quiet = (window / 4).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let worker = worker_config(&v, &application_name)?.empty_batch_interval(Some(quiet));
    let top_keys = v.parsed("top_keys", parse_count)?.unwrap_or(20);
    let listen = v
        .parsed("listen", |s: &str| {
            s.trim()
                .parse::<SocketAddr>()
                .map_err(|e| format!("expected an address such as 0.0.0.0:8080, got {s:?} ({e})"))
        })?
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080)));
    let otlp = otlp(&v, &worker_id)?;
    let log_format = v
        .parsed("log_format", LogFormat::parse)?
        .unwrap_or(LogFormat::Pretty);
    let log_filter = v
        .get("log_filter")
        .map_or_else(|| crate::cli::DEFAULT_LOG_FILTER.to_owned(), str::to_owned);
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&log_filter) {
        return Err(v.fail("log_filter", one_line(&e.to_string())));
    }
    let backend = v.parsed("backend", Backend::parse)?.unwrap_or(Backend::Aws);
    fits_dynamodb(&v, &input, backend, &worker)?;
    // Without the AWS backends (feature `aws`), nothing reads it.
    #[cfg(feature = "aws")]
    let table_setup = v
        .parsed("table_setup", parse::from_str)?
        .unwrap_or_default();
    let summary = summary(&v)?;
    let fault = v
        .parsed("inject_failure", crate::fault::Fault::parse)?
        .unwrap_or_default();

    Ok(Settings {
        input,
        application_name,
        worker_id,
        worker,
        window,
        top_keys,
        listen,
        otlp,
        log_format,
        log_filter,
        backend,
        #[cfg(feature = "aws")]
        table_setup,
        summary,
        fault,
        effective: v.0,
    })
}

/// A DynamoDB table's stream is read through AWS, by polling.
fn fits_dynamodb(
    v: &Values,
    input: &SourceSpec,
    backend: Backend,
    worker: &WorkerConfig,
) -> Result<(), SettingsError> {
    if !matches!(
        input,
        SourceSpec::DynamoDb { .. } | SourceSpec::DynamoDbStreams { .. }
    ) {
        return Ok(());
    }
    if backend == Backend::Memory {
        return Err(v.fail(
            "backend",
            "source dynamodb-streams needs backend aws (the memory backend has in-process \
             Kinesis-like streams only)"
                .into(),
        ));
    }
    if matches!(worker.retrieval, Retrieval::FanOut { .. }) {
        return Err(v.fail(
            "retrieval",
            "DynamoDB Streams has no enhanced fan-out: use polling".into(),
        ));
    }
    Ok(())
}

impl Settings {
    /// The effective settings as a config file (TOML), each line commented with its origin.
    pub(crate) fn to_toml(&self) -> String {
        let mut out = String::new();
        for (key, (value, origin)) in &self.effective {
            let from = match origin {
                Origin::Flag => format!("--{}", kebab(key)),
                Origin::Env => env_name(key),
                Origin::File(p) => p.display().to_string(),
                Origin::Default => "default".to_owned(),
            };
            let quoted = toml::Value::String(value.clone()).to_string();
            out.push_str(&format!("{} = {quoted}  # {from}\n", kebab(key)));
        }
        out
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag => f.write_str("flag"),
            Self::Env => f.write_str("environment"),
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Default => f.write_str("default"),
        }
    }
}

/// `$POD_NAME` (Kubernetes downward API), else `<hostname>-<pid>`.
pub(crate) fn default_worker_id() -> String {
    kcl_serve::default_worker_id(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests;
