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

use chrono::{DateTime, Utc};
use clap::ArgMatches;
use clap::parser::ValueSource;
use kcl_core::{Coordination, InitialPosition, Liveness, WorkerConfig};

use crate::cli::parse_duration;

/// Every setting key, as the clap argument id (snake case). Flags and file keys are the
/// kebab-case form; file keys may also be written in snake case.
pub(crate) const KEYS: &[&str] = &[
    "stream",
    "application_name",
    "initial_position",
    "initial_timestamp",
    "worker_id",
    "max_leases",
    "max_leases_to_steal",
    "max_concurrent_reads",
    "coordination",
    "liveness",
    "failover_time",
    "shutdown_timeout",
    "max_records",
    "idle_time_between_reads",
    "shard_sync_interval",
    "window",
    "top_keys",
    "listen",
    "log_format",
    "log_filter",
    "backend",
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

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable, colored on a terminal.
    Pretty,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pretty" | "text" => Ok(Self::Pretty),
            "json" => Ok(Self::Json),
            _ => Err(format!("expected pretty or json, got {s:?}")),
        }
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
    /// Stream name or ARN.
    pub(crate) stream: String,
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
    /// Log format.
    pub(crate) log_format: LogFormat,
    /// Log filter.
    pub(crate) log_filter: String,
    /// Backends.
    pub(crate) backend: Backend,
    /// Each key's effective value (as text) and origin, for `--print-config`.
    pub(crate) effective: BTreeMap<&'static str, (String, Origin)>,
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

/// A file value as text: strings as they are, numbers and booleans printed, a TOML datetime
/// (which serde sees as a one-entry map) as its string.
fn scalar(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
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

fn build(
    mut effective: BTreeMap<&'static str, (String, Origin)>,
) -> Result<Settings, SettingsError> {
    if !effective.contains_key("worker_id") {
        effective.insert("worker_id", (default_worker_id(), Origin::Default));
    }
    let get = |key: &'static str| effective.get(key);
    let fail = |key: &str, reason: String| SettingsError {
        key: key.to_owned(),
        origin: effective.get(key).map(|(_, o)| o.clone()),
        reason,
    };
    // Parses a key's value with `parse`; `None` if the key has no value.
    macro_rules! parsed {
        ($key:literal, $parse:expr) => {
            match get($key) {
                Some((v, _)) => Some(($parse)(v.as_str()).map_err(|r: String| fail($key, r))?),
                None => None,
            }
        };
    }
    let required = |key: &'static str| -> Result<String, SettingsError> {
        match get(key) {
            Some((v, _)) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
            Some(_) => Err(fail(key, "must not be empty".into())),
            None => Err(fail(
                key,
                format!(
                    "required: pass --{}, set {} or add `{}` to the config file",
                    kebab(key),
                    env_name(key),
                    kebab(key)
                ),
            )),
        }
    };

    let stream = required("stream")?;
    if stream.starts_with("arn:") && !stream.contains(":stream/") {
        return Err(fail(
            "stream",
            format!(
                "{stream:?} is an ARN but not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)"
            ),
        ));
    }
    let application_name = required("application_name")?;
    if !is_table_name(&application_name) {
        return Err(fail(
            "application_name",
            format!(
                "{application_name:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"
            ),
        ));
    }
    let worker_id = required("worker_id")?;

    let timestamp = parsed!("initial_timestamp", parse_timestamp);
    let position = parsed!("initial_position", parse_position).unwrap_or_default();
    let initial_position = match (position, timestamp) {
        (Position::AtTimestamp, Some(t)) => InitialPosition::AtTimestamp(t),
        (Position::AtTimestamp, None) => {
            return Err(fail(
                "initial_timestamp",
                "required when initial-position is AT_TIMESTAMP".into(),
            ));
        }
        (_, Some(_)) => {
            return Err(fail(
                "initial_timestamp",
                "only used with initial-position AT_TIMESTAMP".into(),
            ));
        }
        (Position::TrimHorizon, None) => InitialPosition::TrimHorizon,
        (Position::Latest, None) => InitialPosition::Latest,
    };

    let defaults = WorkerConfig::default();
    let failover_time = parsed!("failover_time", parse_duration).unwrap_or(defaults.failover_time);
    let mut worker = defaults
        .failover_time(failover_time)
        .initial_position(initial_position);
    if let Some(v) = parsed!("max_leases", parse_max_leases) {
        worker = worker.max_leases(v);
    }
    if let Some(v) = parsed!("max_leases_to_steal", parse_count) {
        worker = worker.max_leases_to_steal(v);
    }
    if let Some(v) = parsed!("max_concurrent_reads", parse_count) {
        worker = worker.max_concurrent_reads(v);
    }
    if let Some(v) = parsed!("coordination", parse_coordination) {
        worker = worker.coordination(v);
    }
    if let Some(v) = parsed!("liveness", parse_liveness) {
        worker = worker.liveness(v);
    }
    if let Some(v) = parsed!("shutdown_timeout", parse_duration) {
        worker = worker.shutdown_timeout(v);
    }
    if let Some(v) = parsed!("max_records", parse_u32) {
        worker = worker.max_records(v);
    }
    if let Some(v) = parsed!("idle_time_between_reads", parse_duration) {
        worker = worker.idle_time_between_reads(v);
    }
    if let Some(v) = parsed!("shard_sync_interval", parse_duration) {
        worker = worker.shard_sync_interval(v);
    }
    if let Err(e) = worker.validate() {
        // kcl-core names its field; ours is the same name (renew_interval follows failover_time).
        let key = if e.key == "renew_interval" {
            "failover_time"
        } else {
            e.key
        };
        return Err(fail(key, e.reason));
    }

    let window = parsed!("window", parse_duration).unwrap_or(Duration::from_secs(60));
    if window < Duration::from_secs(1) {
        return Err(fail("window", "must be at least 1s".into()));
    }
    let top_keys = parsed!("top_keys", parse_count).unwrap_or(20);
    let listen = parsed!("listen", |s: &str| s.trim().parse::<SocketAddr>().map_err(
        |e| format!("expected an address such as 0.0.0.0:8080, got {s:?} ({e})")
    ))
    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080)));
    let log_format = parsed!("log_format", LogFormat::parse).unwrap_or(LogFormat::Pretty);
    let log_filter = get("log_filter")
        .map(|(v, _)| v.clone())
        .unwrap_or_else(|| crate::cli::DEFAULT_LOG_FILTER.to_owned());
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&log_filter) {
        return Err(fail("log_filter", one_line(&e.to_string())));
    }

    let backend = parsed!("backend", Backend::parse).unwrap_or(Backend::Aws);

    Ok(Settings {
        stream,
        application_name,
        worker_id,
        worker,
        window,
        top_keys,
        listen,
        log_format,
        log_filter,
        backend,
        effective,
    })
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

#[derive(Debug, Clone, Copy, Default)]
enum Position {
    #[default]
    TrimHorizon,
    Latest,
    AtTimestamp,
}

fn parse_position(s: &str) -> Result<Position, String> {
    match s.trim().to_ascii_uppercase().replace('-', "_").as_str() {
        "TRIM_HORIZON" => Ok(Position::TrimHorizon),
        "LATEST" => Ok(Position::Latest),
        "AT_TIMESTAMP" => Ok(Position::AtTimestamp),
        _ => Err(format!(
            "expected TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {s:?}"
        )),
    }
}

fn parse_coordination(s: &str) -> Result<Coordination, String> {
    match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
        "every-worker" => Ok(Coordination::EveryWorker),
        "leader" => Ok(Coordination::Leader),
        _ => Err(format!("expected every-worker or leader, got {s:?}")),
    }
}

fn parse_liveness(s: &str) -> Result<Liveness, String> {
    match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
        "per-lease" => Ok(Liveness::PerLease),
        "heartbeat" => Ok(Liveness::Heartbeat),
        _ => Err(format!("expected per-lease or heartbeat, got {s:?}")),
    }
}

fn parse_timestamp(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("expected an RFC 3339 time such as 2024-05-01T12:00:00Z, got {s:?} ({e})")
        })
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

fn parse_max_leases(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        Ok(usize::MAX)
    } else {
        parse_count(s).map_err(|_| format!("expected a whole number or `unlimited`, got {s:?}"))
    }
}

fn is_table_name(s: &str) -> bool {
    (3..=255).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `$POD_NAME` (Kubernetes downward API), else `<hostname>-<pid>`.
pub(crate) fn default_worker_id() -> String {
    if let Some(pod) = std::env::var("POD_NAME")
        .ok()
        .filter(|p| !p.trim().is_empty())
    {
        return pod.trim().to_owned();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use clap::FromArgMatches;

    use super::*;
    use crate::cli::Cli;

    fn matches(args: &[&str]) -> ArgMatches {
        let mut argv = vec!["kcl-example-consumer"];
        argv.extend_from_slice(args);
        let m = crate::cli::command()
            .try_get_matches_from(argv)
            .unwrap_or_else(|e| panic!("{e}"));
        // The derive must accept what the command parsed.
        assert!(Cli::from_arg_matches(&m).is_ok());
        m
    }

    fn toml_file(text: &str) -> FileValues {
        FileValues::parse(Path::new("kcl.toml"), text, false).unwrap_or_else(|e| panic!("{e}"))
    }

    fn resolve_ok(args: &[&str], file: Option<&FileValues>) -> Settings {
        resolve(&matches(args), file).unwrap_or_else(|e| panic!("{e}"))
    }

    fn resolve_err(args: &[&str], file: Option<&FileValues>) -> SettingsError {
        match resolve(&matches(args), file) {
            Ok(s) => panic!("expected an error, got {s:?}"),
            Err(e) => e,
        }
    }

    const REQUIRED: &[&str] = &["--stream", "orders", "--application-name", "orders-app"];

    #[test]
    fn defaults_apply_without_flags_or_file() {
        let s = resolve_ok(REQUIRED, None);
        let core = WorkerConfig::default();
        assert_eq!(s.worker.failover_time, core.failover_time);
        assert_eq!(s.worker.shutdown_timeout, core.shutdown_timeout);
        assert_eq!(s.worker.max_leases, core.max_leases);
        assert_eq!(s.worker.max_leases_to_steal, core.max_leases_to_steal);
        assert_eq!(s.worker.max_concurrent_reads, core.max_concurrent_reads);
        assert_eq!(s.worker.max_records, core.max_records);
        assert_eq!(
            s.worker.idle_time_between_reads,
            core.idle_time_between_reads
        );
        assert_eq!(s.worker.shard_sync_interval, core.shard_sync_interval);
        assert_eq!(s.worker.initial_position, InitialPosition::TrimHorizon);
        assert_eq!(s.window, Duration::from_secs(60));
        assert_eq!(s.listen, SocketAddr::from(([0, 0, 0, 0], 8080)));
        assert_eq!(s.log_format, LogFormat::Pretty);
        assert_eq!(s.effective["failover_time"].1, Origin::Default);
        assert!(!s.worker_id.is_empty());
    }

    #[test]
    fn file_overrides_defaults_and_flags_override_file() {
        let file = toml_file(
            "stream = \"from-file\"\napplication-name = \"file-app\"\nfailover-time = \"5s\"\n\
             max_leases = 7\nwindow = \"10s\"\nlog-format = \"json\"\n",
        );
        let s = resolve_ok(
            &["--failover-time", "2s", "--stream", "from-flag"],
            Some(&file),
        );
        assert_eq!(s.stream, "from-flag");
        assert_eq!(s.effective["stream"].1, Origin::Flag);
        assert_eq!(s.application_name, "file-app");
        assert_eq!(
            s.effective["application_name"].1,
            Origin::File("kcl.toml".into())
        );
        assert_eq!(s.worker.failover_time, Duration::from_secs(2));
        assert_eq!(s.worker.renew_interval, Duration::from_secs(2) / 3);
        assert_eq!(s.worker.max_leases, 7);
        assert_eq!(s.window, Duration::from_secs(10));
        assert_eq!(s.log_format, LogFormat::Json);
        // Untouched by both: the default.
        assert_eq!(s.worker.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(s.effective["shutdown_timeout"].1, Origin::Default);
    }

    #[test]
    fn the_run_subcommand_resolves_like_the_default_command() {
        let file = toml_file("max-records = 500\n");
        let m = matches(&[
            "run",
            "--stream",
            "s",
            "--application-name",
            "app",
            "--max-records",
            "100",
        ]);
        let sub = m.subcommand_matches("run").unwrap_or_else(|| panic!("run"));
        let s = resolve(sub, Some(&file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.worker.max_records, 100);
    }

    #[test]
    fn yaml_files_work_too() {
        let file = FileValues::parse(
            Path::new("kcl.yaml"),
            "stream: arn:aws:kinesis:eu-west-1:123456789012:stream/orders\napplication_name: app\n\
             initial-position: AT_TIMESTAMP\ninitial-timestamp: 2024-05-01T12:00:00Z\nmax-leases: unlimited\n",
            true,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let s = resolve_ok(&[], Some(&file));
        assert_eq!(
            s.stream,
            "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
        );
        let expected = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.worker.initial_position,
            InitialPosition::AtTimestamp(expected)
        );
        assert_eq!(s.worker.max_leases, usize::MAX);
    }

    #[test]
    fn toml_datetimes_are_accepted_for_the_timestamp() {
        let file = toml_file(
            "stream = \"s\"\napplication-name = \"app\"\ninitial-position = \"AT_TIMESTAMP\"\n\
             initial-timestamp = 2024-05-01T12:00:00Z\n",
        );
        let s = resolve_ok(&[], Some(&file));
        assert!(matches!(
            s.worker.initial_position,
            InitialPosition::AtTimestamp(_)
        ));
    }

    #[test]
    fn coordination_is_leader_unless_every_worker_is_asked_for() {
        let s = resolve_ok(REQUIRED, None);
        assert_eq!(s.worker.coordination, Coordination::Leader);
        let s = resolve_ok(
            &[REQUIRED, &["--coordination", "every-worker"]].concat(),
            None,
        );
        assert_eq!(s.worker.coordination, Coordination::EveryWorker);
        let e = resolve_err(&[REQUIRED, &["--coordination", "raft"]].concat(), None);
        assert_eq!(e.key, "coordination");
        assert!(e.to_string().contains("every-worker or leader"), "{e}");
    }

    #[test]
    fn liveness_is_per_lease_unless_heartbeats_are_asked_for() {
        let s = resolve_ok(REQUIRED, None);
        assert_eq!(s.worker.liveness, Liveness::PerLease);
        assert_eq!(s.worker.renew_interval, s.worker.failover_time / 3);
        let s = resolve_ok(&[REQUIRED, &["--liveness", "heartbeat"]].concat(), None);
        assert_eq!(s.worker.liveness, Liveness::Heartbeat);
        assert_eq!(s.worker.renew_interval, s.worker.failover_time / 2);
        let e = resolve_err(&[REQUIRED, &["--liveness", "gossip"]].concat(), None);
        assert_eq!(e.key, "liveness");
        assert!(e.to_string().contains("per-lease or heartbeat"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_key_and_the_source() {
        let e = resolve_err(&[REQUIRED, &["--failover-time", "ten"]].concat(), None);
        assert_eq!(e.key, "failover_time");
        let line = e.to_string();
        assert!(line.contains("`failover-time`"), "{line}");
        assert!(line.contains("--failover-time"), "{line}");
        assert!(line.contains("\"ten\""), "{line}");
        assert!(!line.contains('\n'), "{line}");

        let file = toml_file("max-leases = \"lots\"\n");
        let e = resolve_err(REQUIRED, Some(&file));
        assert_eq!(e.key, "max_leases");
        assert!(e.to_string().contains("kcl.toml"), "{e}");

        let e = resolve_err(&[REQUIRED, &["--max-records", "20000"]].concat(), None);
        assert_eq!(e.key, "max_records");
        assert!(e.to_string().contains("10000"), "{e}");

        let e = resolve_err(&[REQUIRED, &["--failover-time", "10ms"]].concat(), None);
        assert_eq!(e.key, "failover_time");

        let e = resolve_err(
            &[REQUIRED, &["--initial-position", "EARLIEST"]].concat(),
            None,
        );
        assert_eq!(e.key, "initial_position");

        let e = resolve_err(
            &[REQUIRED, &["--initial-position", "AT_TIMESTAMP"]].concat(),
            None,
        );
        assert_eq!(e.key, "initial_timestamp");

        let e = resolve_err(&[REQUIRED, &["--listen", "8080"]].concat(), None);
        assert_eq!(e.key, "listen");

        let e = resolve_err(&[REQUIRED, &["--log-format", "xml"]].concat(), None);
        assert_eq!(e.key, "log_format");

        let e = resolve_err(&["--stream", "s"], None);
        assert_eq!(e.key, "application_name");
        assert!(e.to_string().contains("KCL_APPLICATION_NAME"), "{e}");

        let e = resolve_err(&["--stream", "s", "--application-name", "a b"], None);
        assert_eq!(e.key, "application_name");
    }

    #[test]
    fn file_errors_name_the_key() {
        let e = FileValues::parse(Path::new("kcl.toml"), "failover = \"1s\"\n", false)
            .err()
            .unwrap_or_else(|| panic!("unknown key accepted"));
        assert_eq!(e.key, "failover");
        assert!(e.to_string().contains("unknown key"), "{e}");

        let e = FileValues::parse(Path::new("kcl.toml"), "window = [1, 2]\n", false)
            .err()
            .unwrap_or_else(|| panic!("array accepted"));
        assert_eq!(e.key, "window");

        let e = FileValues::parse(Path::new("kcl.toml"), "window = \n", false)
            .err()
            .unwrap_or_else(|| panic!("bad syntax accepted"));
        assert_eq!(e.key, "config");
        assert!(!e.to_string().contains('\n'), "{e}");
    }

    #[test]
    fn print_config_lists_every_key_with_its_origin() {
        let file = toml_file("window = \"5s\"\n");
        let s = resolve_ok(REQUIRED, Some(&file));
        let text = s.to_toml();
        assert!(text.contains("stream = \"orders\"  # --stream"), "{text}");
        assert!(text.contains("window = \"5s\"  # kcl.toml"), "{text}");
        assert!(
            text.contains("failover-time = \"10s\"  # default"),
            "{text}"
        );
        // The output is itself a valid config file.
        assert!(text.parse::<toml::Table>().is_ok(), "{text}");
    }
}
