//! The Java daemon's properties, mapped onto kcl.
//!
//! Every key KCL Java 3.x's MultiLangDaemon reads is in `KEYS`: either mapped (to the
//! [`WorkerConfig`], the lease store, the AWS clients or the child processes) or known to have
//! no equivalent here, said once at start with the reason. A key nobody knows gets a warning
//! naming it, and the known key it resembles (the Java daemon ignores such a key silently).
//! Keys are case-sensitive, as the Java daemon's are, but for `AwsCredentialsProvider`. A
//! required key missing, or a value that does not parse, is an error naming the key; the
//! binary exits with status 2 for it. Unlike the Java daemon, `AwsCredentialsProvider` may be
//! left out: the standard AWS chain is then used.
//!
//! Defaults are the Java daemon's, not kcl's, wherever the two differ and the key exists:
//! `initialPositionInStream` is `LATEST` and `retrievalMode` is `FANOUT`, as in KCL Java 3.x.
//! kcl's own settings have keys of their own (`coordination`, `liveness`, `tableSetup`,
//! `stalledAfterSeconds`, `restartGraceSeconds`, the failure policy's `failure…`, `deadLetterSink`,
//! `deadLetterOverflowS3`, `childErrorsFailBatch`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use kcl_aws::{TableBilling, TableSetup};
use kcl_core::{
    BalanceBy, InitialPosition, InitialPositionKind, Retrieval, RetrievalMode, WorkerConfig,
};

use crate::child::ChildCommand;
use crate::properties::Properties;
pub use failure::DeadLetterSettings;

mod describe;
mod failure;
mod keys;
mod reader;

#[cfg(test)]
use keys::KEYS;
pub(crate) use keys::Use;
use keys::{POLLING_KEYS, canonical, near};
use reader::Reader;

/// A key of the properties file that is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid property `{key}`: {reason}")]
pub struct KeyError {
    /// The key, as the Java daemon spells it.
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// Every key of a properties file that is missing or wrong, in the order the keys are read:
/// a file with several mistakes is reported whole, not one mistake per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyErrors(pub Vec<KeyError>);

impl std::fmt::Display for KeyErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for KeyErrors {}

fn key_error(key: &'static str, reason: impl Into<String>) -> KeyError {
    KeyError {
        key,
        reason: reason.into(),
    }
}

/// How the daemon finds AWS credentials (`AwsCredentialsProvider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The standard chain: environment, profile, web identity, container, instance profile.
    DefaultChain,
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN` only.
    Environment,
    /// A named profile of the shared config files (`None`: the default profile).
    Profile(Option<String>),
}

/// One AWS client's overrides (`kinesisEndpoint`, `kinesisClient.region`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// Its region, if not the daemon's.
    pub region: Option<String>,
    /// Its endpoint, if not AWS's.
    pub endpoint: Option<String>,
}

/// Everything the daemon runs with.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The application's child processes.
    pub command: ChildCommand,
    /// The stream: a name or an ARN.
    pub stream: String,
    /// The application (the fan-out consumer's name, and the lease table's by default).
    pub application_name: String,
    /// The lease table.
    pub table_name: String,
    /// The AWS region, if given (else from the stream ARN, else the standard chain).
    pub region: Option<String>,
    /// The Kinesis client's own region and endpoint.
    pub kinesis: ClientSettings,
    /// The DynamoDB client's own region and endpoint.
    pub dynamodb: ClientSettings,
    /// Where credentials come from.
    pub credentials: Credentials,
    /// This worker's id.
    pub worker_id: String,
    /// Who looks after the lease table.
    pub table_setup: TableSetup,
    /// How a lease table the daemon creates is billed.
    pub billing: TableBilling,
    /// The worker's settings.
    pub worker: WorkerConfig,
    /// Where dead letters go (`deadLetterSink`), if anywhere.
    pub dead_letters: Option<DeadLetterSettings>,
    /// Keys given that have no effect with the rest of the file (`deadLetterSink` without
    /// `failureExhausted = dead-letter`, …), each with why: logged once at start.
    pub unused: Vec<(&'static str, &'static str)>,
    /// Keys given that have no effect here, each with why: logged once at start.
    pub ignored: Vec<(String, &'static str)>,
    /// Keys given that nobody knows, each with the known key it resembles (other capitals):
    /// logged once at start.
    pub unknown: Vec<(String, Option<&'static str>)>,
}

impl DaemonConfig {
    /// Reads `properties`; `default_worker_id` stands in for a missing `workerId` (the binary
    /// derives it from its environment; a library reads none).
    pub fn from_properties(
        properties: &Properties,
        default_worker_id: &str,
    ) -> Result<Self, KeyErrors> {
        let r = Reader::new(properties);
        let command = r.keep(child_command(&r));
        let stream = r.keep(stream(&r));
        let application_name = r.keep(r.required("applicationName").map(str::to_owned));
        let worker = worker_config(&r, application_name.as_deref().unwrap_or_default());
        let credentials = r.keep(credentials(r.get("AwsCredentialsProvider")));
        let table_setup = r.keep(r.parsed("tableSetup").map(Option::unwrap_or_default));
        let billing = r.keep(billing(&r));
        let exhausted = worker.as_ref().map(|w| w.failure.exhausted);
        let (dead_letters, unused) = failure::dead_letters(&r, exhausted);
        let errors = r.errors.take();
        let (
            Some(command),
            Some(stream),
            Some(application_name),
            Some(worker),
            Some(credentials),
            Some(table_setup),
            Some(billing),
            true,
        ) = (
            command,
            stream,
            application_name,
            worker,
            credentials,
            table_setup,
            billing,
            errors.is_empty(),
        )
        else {
            return Err(KeyErrors(errors));
        };
        let (ignored, unknown) = notes(properties);
        Ok(Self {
            command,
            table_name: r.get("tableName").unwrap_or(&application_name).to_owned(),
            region: r
                .get("regionName")
                .map(str::to_owned)
                .or_else(|| arn_region(&stream)),
            stream,
            application_name,
            kinesis: ClientSettings {
                region: r.get("kinesisClient.region").map(str::to_owned),
                endpoint: r.get("kinesisEndpoint").map(str::to_owned),
            },
            dynamodb: ClientSettings {
                region: r.get("dynamoDbClient.region").map(str::to_owned),
                endpoint: r.get("dynamoDBEndpoint").map(str::to_owned),
            },
            credentials,
            worker_id: r.get("workerId").unwrap_or(default_worker_id).to_owned(),
            table_setup,
            billing,
            worker,
            dead_letters,
            unused,
            ignored,
            unknown,
        })
    }

    /// The property that sets a [`WorkerConfig`] field, for an error kcl's worker names by
    /// its field ([`ConfigError::key`](kcl_core::ConfigError)); a field no property sets by
    /// its own name.
    pub fn property(field: &'static str) -> &'static str {
        java_key(field)
    }
}

/// The child (`executableName`), its hooks' deadline (`timeoutInSeconds`) and whether the
/// exceptions it reports fail a batch (`childErrorsFailBatch`).
fn child_command(r: &Reader<'_>) -> Result<ChildCommand, KeyError> {
    let timeout = r.optional(r.number::<u64>("timeoutInSeconds"));
    let errors_fail_batch = r.optional(r.boolean("childErrorsFailBatch"));
    let executable = r.required("executableName")?;
    let mut command =
        ChildCommand::parse(executable).ok_or_else(|| key_error("executableName", "empty"))?;
    command.timeout = timeout.filter(|s| *s > 0).map(Duration::from_secs);
    command.errors_fail_batch = errors_fail_batch.unwrap_or(true);
    Ok(command)
}

/// The stream: `streamArn`, else `streamName`.
fn stream(r: &Reader<'_>) -> Result<String, KeyError> {
    match (r.get("streamArn"), r.get("streamName")) {
        (Some(arn), _) if !arn.starts_with("arn:") => {
            Err(key_error("streamArn", format!("`{arn}` is not an ARN")))
        }
        (Some(arn), _) => Ok(arn.to_owned()),
        (None, Some(name)) => Ok(name.to_owned()),
        (None, None) => Err(key_error(
            "streamName",
            "missing (give streamName or streamArn)",
        )),
    }
}

/// The worker settings the properties give, on kcl's defaults where they give none; `None`
/// if a key is wrong (each error kept in `r`).
fn worker_config(r: &Reader<'_>, application_name: &str) -> Option<WorkerConfig> {
    let before = r.errors.borrow().len();
    let mut worker = WorkerConfig::default();
    if let Some(failover) = r.optional(r.millis("failoverTimeMillis")) {
        worker = worker.failover_time(failover);
    }
    if let Some(position) = r.keep(initial_position(r)) {
        worker.initial_position = position;
    }
    reading(r, &mut worker);
    leases(r, &mut worker);
    if let Some(retrieval) = r.keep(retrieval(r, application_name)) {
        worker.retrieval = retrieval;
    }
    kcl_own(r, &mut worker);
    failure::failure(r, &mut worker.failure);
    if r.errors.borrow().len() > before {
        return None;
    }
    // The worker's own checks, once every key parsed (so that they judge what was given).
    r.keep(
        worker
            .validate()
            .map_err(|e| key_error(java_key(e.key), e.reason)),
    )?;
    Some(worker)
}

/// How shards are read by polling (errors kept in `r`).
fn reading(r: &Reader<'_>, worker: &mut WorkerConfig) {
    if let Some(n) = r.optional(r.number("maxRecords")) {
        worker.max_records = n;
    }
    // The Java daemon's polling default is 1.5 s (kcl's own: 1 s).
    worker.idle_time_between_reads = r
        .optional(r.millis("idleTimeBetweenReadsInMillis"))
        .unwrap_or(Duration::from_millis(1500));
    if r.optional(r.boolean("callProcessRecordsEvenForEmptyRecordList")) == Some(true) {
        worker.empty_batch_interval = Some(worker.idle_time_between_reads);
    }
    if let Some(poll) = r.optional(r.millis("parentShardPollIntervalMillis")) {
        worker.parent_poll_interval = poll;
    }
}

/// How leases are synced, taken, retried and handed back (errors kept in `r`).
fn leases(r: &Reader<'_>, worker: &mut WorkerConfig) {
    if let Some(sync) = r.optional(r.millis("shardSyncIntervalMillis")) {
        worker.shard_sync_interval = sync;
    }
    if let Some(n) = r.optional(r.number("maxLeasesForWorker")) {
        worker.max_leases = n;
    }
    if let Some(n) = r.optional(r.number("maxLeasesToStealAtOneTime")) {
        worker.max_leases_to_steal = n;
    }
    if let Some(backoff) = r.optional(r.millis("taskBackoffTimeMillis")) {
        worker.min_backoff = backoff;
    }
    if let Some(grace) = r
        .optional(r.millis("shutdownGraceMillis"))
        .filter(|g| !g.is_zero())
    {
        worker.shutdown_timeout = grace;
    }
}

/// How records are read (`retrievalMode`): as in the Java daemon, `DEFAULT` (or no key) is
/// fan-out unless a polling key is given.
fn retrieval(r: &Reader<'_>, application_name: &str) -> Result<Retrieval, KeyError> {
    let key = "retrievalMode";
    // Java's FANOUT and POLLING are kcl's spellings in capitals; DEFAULT is Java's alone.
    let mode = match r.get(key) {
        Some(given) if !given.eq_ignore_ascii_case("DEFAULT") => {
            given.parse().map_err(|e: kcl_core::ParseModeError| {
                let expected = "FANOUT, POLLING or DEFAULT";
                key_error(key, kcl_core::ParseModeError { expected, ..e }.to_string())
            })?
        }
        _ if POLLING_KEYS.iter().any(|k| r.get(k).is_some()) => RetrievalMode::Polling,
        _ => RetrievalMode::FanOut,
    };
    match mode {
        RetrievalMode::Polling => Ok(Retrieval::Polling),
        fan_out => Ok(fan_out.with_consumer(consumer_name(r)?.unwrap_or(application_name))),
    }
}

/// kcl's own settings, which KCL Java does not have: `coordination`, `liveness`,
/// `stalledAfterSeconds`, `restartGraceSeconds` (errors kept in `r`).
fn kcl_own(r: &Reader<'_>, worker: &mut WorkerConfig) {
    if let Some(coordination) = r.optional(r.parsed("coordination")) {
        worker.coordination = coordination;
    }
    if let Some(liveness) = r.optional(r.parsed("liveness")) {
        *worker = std::mem::take(worker).liveness(liveness);
    }
    if let Some(by) = r.optional(balance_by(r)) {
        worker.balancing = std::mem::take(&mut worker.balancing).by(by);
    }
    if let Some(capacity) = r.optional(capacity(r)) {
        worker.balancing = std::mem::take(&mut worker.balancing).capacity(capacity);
    }
    if let Some(stalled_after) = seconds_or_off(r, "stalledAfterSeconds") {
        *worker = std::mem::take(worker).stalled_after(stalled_after);
    }
    if let Some(grace) = seconds_or_off(r, "restartGraceSeconds") {
        *worker = std::mem::take(worker).restart_grace(grace);
    }
}

/// A property that is a number of seconds or `off` (`None`); `None` if it is absent or does
/// not parse (the error kept in `r`).
fn seconds_or_off(r: &Reader<'_>, key: &'static str) -> Option<Option<Duration>> {
    match r.get(key)? {
        off if off.eq_ignore_ascii_case("off") => Some(None),
        _ => {
            let seconds = r
                .number::<u64>(key)
                .map_err(|e| key_error(key, format!("{}; or off", e.reason)));
            r.optional(seconds).map(|s| Some(Duration::from_secs(s)))
        }
    }
}

/// What the leader balances (`balanceBy`): `load` or `count`.
fn balance_by(r: &Reader<'_>) -> Result<Option<BalanceBy>, KeyError> {
    let key = "balanceBy";
    r.get(key)
        .map(|v| match v.to_ascii_lowercase().as_str() {
            "load" => Ok(BalanceBy::Load),
            "count" => Ok(BalanceBy::Count),
            _ => Err(key_error(key, format!("`{v}` is neither load nor count"))),
        })
        .transpose()
}

/// This worker's capacity (`workerCapacity`): a number; its range is kcl-core's to check
/// (`balancing.capacity`, named by this key through [`FIELDS`]).
fn capacity(r: &Reader<'_>) -> Result<Option<f64>, KeyError> {
    let key = "workerCapacity";
    r.get(key)
        .map(|v| {
            v.parse::<f64>()
                .ok()
                .filter(|c| c.is_finite())
                .ok_or_else(|| key_error(key, format!("`{v}` is not a number such as 1 or 2.5")))
        })
        .transpose()
}

/// The fan-out consumer's name, if given: from `fanoutConfig.consumerArn`
/// (`arn:aws:kinesis:<region>:<account>:stream/<stream>/consumer/<name>:<created>`, which wins
/// in Java too), else `fanoutConfig.consumerName`.
fn consumer_name<'a>(r: &'a Reader<'_>) -> Result<Option<&'a str>, KeyError> {
    let key = "fanoutConfig.consumerArn";
    let Some(arn) = r.get(key) else {
        return Ok(r.get("fanoutConfig.consumerName"));
    };
    arn.split_once("/consumer/")
        .filter(|(stream, _)| stream.starts_with("arn:") && stream.contains(":stream/"))
        .and_then(|(_, rest)| rest.split(':').next())
        .filter(|name| !name.is_empty())
        .map(Some)
        .ok_or_else(|| {
            key_error(
                key,
                format!(
                    "`{arn}` is not a stream consumer's ARN \
                     (arn:aws:kinesis:<region>:<account>:stream/<stream>/consumer/<name>:<created>)"
                ),
            )
        })
}

/// Each property that sets a [`WorkerConfig`] field, with that field as kcl-core's
/// validation names it ([`ConfigError::key`](kcl_core::ConfigError)): the one table from
/// which the worker's own errors are named by their property. A unit test holds every field
/// to kcl-core's and every key to [`KEYS`], so that renaming either fails a test instead of
/// an error naming a key that is gone.
pub(crate) const FIELDS: &[(&str, &str)] = &[
    ("failoverTimeMillis", "failover_time"),
    // Derived from the failover time.
    ("failoverTimeMillis", "renew_interval"),
    ("maxRecords", "max_records"),
    ("idleTimeBetweenReadsInMillis", "idle_time_between_reads"),
    (
        "callProcessRecordsEvenForEmptyRecordList",
        "empty_batch_interval",
    ),
    ("parentShardPollIntervalMillis", "parent_poll_interval"),
    ("shardSyncIntervalMillis", "shard_sync_interval"),
    ("maxLeasesForWorker", "max_leases"),
    ("maxLeasesToStealAtOneTime", "max_leases_to_steal"),
    ("taskBackoffTimeMillis", "min_backoff"),
    ("shutdownGraceMillis", "shutdown_timeout"),
    ("retrievalMode", "retrieval"),
    ("fanoutConfig.consumerName", "retrieval.consumer_name"),
    ("stalledAfterSeconds", "stalled_after"),
    ("restartGraceSeconds", "restart_grace"),
    ("coordination", "coordination"),
    ("liveness", "liveness"),
    ("failureAttempts", "failure.attempts"),
    ("failureExhausted", "failure.exhausted"),
    ("failureOutageAfter", "failure.outage_after"),
    ("workerCapacity", "balancing.capacity"),
];

/// The property that sets `field`, for errors the worker's own validation finds; a field no
/// property sets (one kcl derives) by its own name.
fn java_key(field: &'static str) -> &'static str {
    FIELDS
        .iter()
        .find(|(_, f)| *f == field)
        .map_or(field, |&(key, _)| key)
}

/// Where a shard without a checkpoint starts (`initialPositionInStream`, default `LATEST`
/// as in Java), with `AT_TIMESTAMP`'s time (`initialPositionInStreamExtended`).
fn initial_position(r: &Reader<'_>) -> Result<InitialPosition, KeyError> {
    match r.parsed("initialPositionInStream")? {
        None | Some(InitialPositionKind::Latest) => Ok(InitialPosition::Latest),
        Some(InitialPositionKind::AtTimestamp) => {
            let extended = "initialPositionInStreamExtended";
            let given = r
                .get(extended)
                .ok_or_else(|| key_error(extended, "needed with AT_TIMESTAMP"))?;
            Ok(InitialPosition::AtTimestamp(timestamp(extended, given)?))
        }
        Some(InitialPositionKind::TrimHorizon) => Ok(InitialPosition::TrimHorizon),
    }
}

/// A timestamp in epoch seconds (as the Java daemon reads it) or RFC 3339.
fn timestamp(key: &'static str, given: &str) -> Result<DateTime<Utc>, KeyError> {
    if let Ok(seconds) = given.parse::<i64>() {
        return DateTime::from_timestamp(seconds, 0)
            .ok_or_else(|| key_error(key, format!("`{given}` is out of range")));
    }
    DateTime::parse_from_rfc3339(given)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            key_error(
                key,
                format!("`{given}` is neither epoch seconds nor RFC 3339: {e}"),
            )
        })
}

/// How a table the daemon creates is billed (`billingMode`), with the capacities of
/// `PROVISIONED`.
fn billing(r: &Reader<'_>) -> Result<TableBilling, KeyError> {
    match r.parsed("billingMode")?.unwrap_or_default() {
        TableBilling::Provisioned {
            read_capacity_units,
            write_capacity_units,
        } => {
            let read = r.number("initialLeaseTableReadCapacity");
            let write = r.optional(r.number("initialLeaseTableWriteCapacity"));
            Ok(TableBilling::Provisioned {
                read_capacity_units: read?.unwrap_or(read_capacity_units),
                write_capacity_units: write.unwrap_or(write_capacity_units),
            })
        }
        on_demand => Ok(on_demand),
    }
}

/// `AwsCredentialsProvider`: one provider, or several separated by `|` or `,` (the first that
/// kcl knows is used; all are tried in turn by KCL Java).
fn credentials(given: Option<&str>) -> Result<Credentials, KeyError> {
    let key = "AwsCredentialsProvider";
    let Some(given) = given else {
        return Ok(Credentials::DefaultChain);
    };
    // A chain is comma-separated (each tried in turn by KCL Java); kcl uses the first.
    let first_provider = given.split(',').next().unwrap_or_default();
    let mut parts = first_provider.split('|').map(str::trim);
    let first = parts.next().unwrap_or_default();
    // The class, by its simple name (with or without a package).
    let class = first.rsplit('.').next().unwrap_or(first);
    match class {
        "DefaultCredentialsProvider"
        | "DefaultAWSCredentialsProviderChain"
        | "InstanceProfileCredentialsProvider"
        | "ContainerCredentialsProvider"
        | "EC2ContainerCredentialsProviderWrapper"
        | "WebIdentityTokenFileCredentialsProvider" => Ok(Credentials::DefaultChain),
        "EnvironmentVariableCredentialsProvider" => Ok(Credentials::Environment),
        "ProfileCredentialsProvider" => Ok(Credentials::Profile(
            parts.next().filter(|p| !p.is_empty()).map(str::to_owned),
        )),
        other => Err(key_error(
            key,
            format!(
                "`{other}` is not a provider kcl-multilang knows: use DefaultCredentialsProvider \
                 (environment, profile, web identity, container, instance profile), \
                 EnvironmentVariableCredentialsProvider or ProfileCredentialsProvider|<profile>; \
                 for an assumed role, set role_arn in a profile"
            ),
        )),
    }
}

/// The region of a stream ARN (`arn:aws:kinesis:<region>:…`).
fn arn_region(stream: &str) -> Option<String> {
    stream
        .strip_prefix("arn:")
        .and_then(|rest| rest.split(':').nth(2))
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
}

/// The keys given that have no effect (with why), and those nobody knows (with the known key
/// they resemble).
type Notes = (
    Vec<(String, &'static str)>,
    Vec<(String, Option<&'static str>)>,
);

/// The keys given that have no effect, and those nobody knows.
fn notes(properties: &Properties) -> Notes {
    let mut ignored = Vec::new();
    let mut unknown = Vec::new();
    for entry in properties.entries() {
        match canonical(&entry.key) {
            Some((_, Use::Mapped(_))) => {}
            Some((_, Use::Ignored(why))) => ignored.push((entry.key.clone(), why)),
            None => unknown.push((entry.key.clone(), near(&entry.key))),
        }
    }
    (ignored, unknown)
}

#[cfg(test)]
mod tests;
