//! Which stream a program reads, with the same keys and rules in every binary: one Kinesis
//! stream (`stream`), several in KCL Java's multi-stream mode (`streams`), or, with `source`
//! `dynamodb-streams`, a DynamoDB table's stream (`table`, or `stream` with the stream's ARN)
//! or several (`streams`, stream ARNs).
//!
//! `stream` and `streams` are separate keys, not one list, because they key the lease table
//! differently: `stream` keeps single-stream leases (the shard id), `streams` keys every lease
//! `account:stream:creationEpoch:shardId` as KCL Java's multi-stream mode does, even for a
//! single stream — so a KCL Java multi-stream fleet moves over with `streams`, whatever its
//! number of streams, and a single-stream one with `stream`. Guessing the mode from the
//! number of names would silently start every shard over when a list shrinks to one.
//!
//! DynamoDB stream ARNs are checked with kcl-aws (feature `aws`); without it a DynamoDB
//! stream is refused, naming the feature.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use kcl_core::ParseModeError;

/// What kind of stream is read (`source`): `kinesis` or `dynamodb-streams`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// Kinesis streams. The default.
    #[default]
    Kinesis,
    /// DynamoDB tables' streams, with the Java DynamoDB Streams Kinesis Adapter's leases.
    DynamoDbStreams,
}

impl FromStr for SourceKind {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "kinesis" => Ok(Self::Kinesis),
            "dynamodb-streams" => Ok(Self::DynamoDbStreams),
            _ => Err(ParseModeError {
                given: s.to_owned(),
                expected: "kinesis or dynamodb-streams",
            }),
        }
    }
}

/// The streams a program reads, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// One Kinesis stream (name or ARN), with single-stream lease keys.
    Stream(String),
    /// Kinesis streams (names or ARNs) in KCL Java's multi-stream mode.
    Streams {
        /// As given, in order, without duplicates.
        names: Vec<String>,
        /// How long a stream's leases outlive its leaving the list (across a restart too);
        /// `None`: [`MultiStreamSource`](kcl_core::multi_stream::MultiStreamSource)'s default.
        removal_grace: Option<Duration>,
    },
    /// DynamoDB streams (ARNs), in multi-stream mode with the Java adapter's lease keys.
    DynamoDbStreams {
        /// As given, in order, without duplicates.
        arns: Vec<String>,
        /// As for `Streams`.
        removal_grace: Option<Duration>,
    },
    /// A DynamoDB table's stream: the table's current one, or the stream ARN given (checked
    /// at start to be the table's, when both are given).
    DynamoDb {
        /// The table.
        table: Option<String>,
        /// The stream's ARN.
        arn: Option<String>,
    },
}

/// The source keys as given: `streams` a comma-separated list.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceKeys<'a> {
    /// `source`.
    pub source: SourceKind,
    /// `stream`: a name or an ARN.
    pub stream: Option<&'a str>,
    /// `streams`: names or ARNs separated by commas.
    pub streams: Option<&'a str>,
    /// `table`.
    pub table: Option<&'a str>,
    /// `stream_removal_grace`.
    pub removal_grace: Option<Duration>,
}

/// A source key, for the error naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKey {
    /// `stream`.
    Stream,
    /// `streams`.
    Streams,
    /// `table`.
    Table,
    /// `stream_removal_grace`.
    StreamRemovalGrace,
}

impl SourceKey {
    /// The key's name, in snake case (`stream_removal_grace`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Streams => "streams",
            Self::Table => "table",
            Self::StreamRemovalGrace => "stream_removal_grace",
        }
    }
}

/// A source key that is wrong, or keys that do not go together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{}`: {reason}", key.name())]
pub struct SourceError {
    /// The key to fix.
    pub key: SourceKey,
    /// Why.
    pub reason: String,
}

fn fail(key: SourceKey, reason: impl Into<String>) -> SourceError {
    SourceError {
        key,
        reason: reason.into(),
    }
}

impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stream(name) => f.write_str(name),
            Self::Streams { names, .. } => f.write_str(&names.join(",")),
            Self::DynamoDbStreams { arns, .. } => f.write_str(&arns.join(",")),
            Self::DynamoDb { arn: Some(arn), .. } => f.write_str(arn),
            Self::DynamoDb { table, .. } => write!(f, "table {}", table.as_deref().unwrap_or("?")),
        }
    }
}

impl SourceSpec {
    /// The streams `keys` name, checked; `None` if they name none (`stream`, `streams` and
    /// `table` all missing).
    pub fn from_keys(keys: &SourceKeys<'_>) -> Result<Option<Self>, SourceError> {
        if keys.source == SourceKind::DynamoDbStreams {
            return dynamodb(keys);
        }
        if keys.table.is_some() {
            return Err(fail(
                SourceKey::Table,
                "only used with source dynamodb-streams (a Kinesis stream is named with stream)",
            ));
        }
        match (keys.stream, keys.streams) {
            (Some(_), Some(_)) => Err(fail(
                SourceKey::Streams,
                "give stream (one stream) or streams (KCL Java's multi-stream mode), not both",
            )),
            (None, Some(list)) => Ok(Some(Self::Streams {
                names: names(list).map_err(|r| fail(SourceKey::Streams, r))?,
                removal_grace: keys.removal_grace,
            })),
            (None, None) => Ok(None),
            (Some(stream), None) => {
                only_with_streams(keys)?;
                let stream = non_empty(SourceKey::Stream, stream)?;
                check_arn(stream).map_err(|r| fail(SourceKey::Stream, r))?;
                Ok(Some(Self::Stream(stream.to_owned())))
            }
        }
    }

    /// Whether `name` (a multi-stream lease key's stream name) is a Kinesis stream read: its
    /// name, or the name in its ARN (`arn:…:stream/NAME`). A DynamoDB stream's multi-stream
    /// id is not matched.
    pub fn names(&self, name: &str) -> bool {
        let named = |s: &String| s.rsplit_once(":stream/").map_or(s.as_str(), |(_, n)| n) == name;
        match self {
            Self::Stream(stream) => named(stream),
            Self::Streams { names, .. } => names.iter().any(named),
            Self::DynamoDbStreams { .. } | Self::DynamoDb { .. } => false,
        }
    }
}

/// `stream_removal_grace` is for `streams` only.
fn only_with_streams(keys: &SourceKeys<'_>) -> Result<(), SourceError> {
    match keys.removal_grace {
        Some(_) => Err(fail(
            SourceKey::StreamRemovalGrace,
            "only used with streams (multi-stream mode)",
        )),
        None => Ok(()),
    }
}

fn non_empty(key: SourceKey, value: &str) -> Result<&str, SourceError> {
    match value.trim() {
        "" => Err(fail(key, "must not be empty")),
        value => Ok(value),
    }
}

/// A DynamoDB table's stream: `table`, `stream` (the stream's ARN), or both if they agree;
/// or `streams`, stream ARNs in multi-stream mode.
fn dynamodb(keys: &SourceKeys<'_>) -> Result<Option<SourceSpec>, SourceError> {
    if let Some(list) = keys.streams {
        if keys.stream.is_some() || keys.table.is_some() {
            let key = if keys.stream.is_some() {
                SourceKey::Stream
            } else {
                SourceKey::Table
            };
            return Err(fail(
                key,
                "give stream ARNs with streams (multi-stream mode), or one table or stream ARN, \
                 not both",
            ));
        }
        return Ok(Some(SourceSpec::DynamoDbStreams {
            arns: arns(list).map_err(|r| fail(SourceKey::Streams, r))?,
            removal_grace: keys.removal_grace,
        }));
    }
    only_with_streams(keys)?;
    let table = keys.table.map(str::trim);
    if let Some(t) = table.filter(|t| !is_table_name(t)) {
        return Err(fail(
            SourceKey::Table,
            format!("{t:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"),
        ));
    }
    let arn = keys.stream.map(str::trim);
    if let Some(arn) = arn {
        let of = table_of(arn).map_err(|r| fail(SourceKey::Stream, r))?;
        if let Some(t) = table.filter(|t| *t != of) {
            return Err(fail(
                SourceKey::Stream,
                format!(
                    "{arn} is a stream of table {of}, not of table {t} (the table setting): \
                     give a stream of {t}, or the table alone for its current stream"
                ),
            ));
        }
    }
    if table.is_none() && arn.is_none() {
        return Ok(None);
    }
    Ok(Some(SourceSpec::DynamoDb {
        table: table.map(str::to_owned),
        arn: arn.map(str::to_owned),
    }))
}

/// Whether `s` is a valid DynamoDB table name: 3 to 255 of `a-z A-Z 0-9 _ - .`.
pub fn is_table_name(s: &str) -> bool {
    (3..=255).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Why a build without feature `aws` refuses a DynamoDB stream.
#[cfg(not(feature = "aws"))]
const NO_AWS: &str = "this build has no AWS backends: build with `--features aws`";

/// The table of a DynamoDB stream ARN, or why `arn` is not one.
#[cfg(not(feature = "aws"))]
fn table_of(_arn: &str) -> Result<&str, String> {
    Err(NO_AWS.into())
}

/// A comma-separated list of DynamoDB stream ARNs.
#[cfg(not(feature = "aws"))]
fn arns(_list: &str) -> Result<Vec<String>, String> {
    Err(NO_AWS.into())
}

/// The table of a DynamoDB stream ARN, or why `arn` is not one.
#[cfg(feature = "aws")]
fn table_of(arn: &str) -> Result<&str, String> {
    kcl_aws::streams::table_of(arn).ok_or_else(|| {
        format!(
            "{arn:?} is not a DynamoDB stream ARN (arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE/\
             stream/LABEL); with source dynamodb-streams, give the table instead, or its \
             stream's ARN"
        )
    })
}

/// A comma-separated list of DynamoDB stream ARNs.
#[cfg(feature = "aws")]
fn arns(list: &str) -> Result<Vec<String>, String> {
    let arns = split(list)?;
    for arn in &arns {
        table_of(arn)?;
        if kcl_aws::streams::stream_id(arn).is_none() {
            return Err(format!(
                "{arn:?}: its partition does not match its region, so it has no multi-stream id"
            ));
        }
    }
    Ok(arns)
}

/// A comma-separated list of Kinesis stream names or ARNs.
fn names(list: &str) -> Result<Vec<String>, String> {
    let names = split(list)?;
    for name in &names {
        check_arn(name)?;
    }
    Ok(names)
}

/// A comma-separated list, without empty entries or duplicates.
fn split(list: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!(
                "expected stream names or ARNs separated by commas, got {list:?}"
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(format!("{name:?} is listed twice"));
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

fn check_arn(stream: &str) -> Result<(), String> {
    if stream.starts_with("arn:") && !stream.contains(":stream/") {
        return Err(format!(
            "{stream:?} is an ARN but not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)"
        ));
    }
    Ok(())
}

#[cfg(feature = "aws")]
impl SourceSpec {
    /// The one stream this names, opened as the fleet reads it (a DynamoDB table's current
    /// stream looked up, a stream ARN checked to be the table's); `None` for several streams,
    /// which a program reads through a
    /// [`MultiStreamSource`](kcl_core::multi_stream::MultiStreamSource).
    pub async fn open_one(
        &self,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Option<kcl_aws::AnySource>, kcl_core::BackendError> {
        use kcl_aws::{AnySource, DynamoDbStreamsSource, KinesisShardSource};
        match self {
            Self::Stream(stream) => Ok(Some(AnySource::Kinesis(KinesisShardSource::new(
                sdk,
                stream.clone(),
            )))),
            Self::DynamoDb { table, arn } => Ok(Some(AnySource::DynamoDb(
                DynamoDbStreamsSource::find(sdk, table.as_deref(), arn.as_deref()).await?,
            ))),
            Self::Streams { .. } | Self::DynamoDbStreams { .. } => Ok(None),
        }
    }

    /// The key that names the one stream: `stream` (a Kinesis stream, or a DynamoDB stream
    /// ARN), else `table`; for naming it in an error.
    pub fn key(&self) -> SourceKey {
        match self {
            Self::DynamoDb { arn: None, .. } => SourceKey::Table,
            Self::Streams { .. } | Self::DynamoDbStreams { .. } => SourceKey::Streams,
            Self::Stream(_) | Self::DynamoDb { .. } => SourceKey::Stream,
        }
    }
}
