//! What `run` consumes: one stream (`stream`), or several in KCL Java's multi-stream mode
//! (`streams`); or, with `source` `dynamodb-streams`, a DynamoDB table's stream (`table`, or
//! `stream` with the stream's ARN).
//!
//! The two are separate keys, not one list, because they key the lease table differently:
//! `stream` keeps single-stream leases (the shard id), `streams` keys every lease
//! `account:stream:creationEpoch:shardId` as KCL Java's multi-stream mode does, even for a
//! single stream — so a KCL Java multi-stream fleet moves over with `streams`, whatever its
//! number of streams, and a single-stream one with `stream`. Guessing the mode from the
//! number of names would silently start every shard over when a list shrinks to one.

use std::fmt;
use std::time::Duration;

use super::{SettingsError, Values};
use crate::cli::parse_duration;

/// The streams `run` consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// One stream (name or ARN), with single-stream lease keys.
    Stream(String),
    /// Streams (names or ARNs) in KCL Java's multi-stream mode.
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

impl fmt::Display for Input {
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

/// `stream`, or `streams` and `stream_removal_grace`; with `source` `dynamodb-streams`,
/// `table` or `stream`.
pub(super) fn input(v: &Values) -> Result<Input, SettingsError> {
    let grace = v.parsed("stream_removal_grace", parse_duration)?;
    match v
        .get("source")
        .map(|s| s.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("kinesis") => {}
        Some("dynamodb-streams") => return dynamodb(v, grace),
        Some(_) => {
            return Err(v.fail(
                "source",
                format!(
                    "expected kinesis or dynamodb-streams, got {:?}",
                    v.get("source").unwrap_or_default()
                ),
            ));
        }
    }
    if v.get("table").is_some() {
        return Err(v.fail(
            "table",
            "only used with source dynamodb-streams (a Kinesis stream is named with stream)".into(),
        ));
    }
    match (v.get("stream"), v.get("streams")) {
        (Some(_), Some(_)) => Err(v.fail(
            "streams",
            "give stream (one stream) or streams (KCL Java's multi-stream mode), not both".into(),
        )),
        (None, Some(_)) => Ok(Input::Streams {
            names: v.parsed("streams", names)?.unwrap_or_default(),
            removal_grace: grace,
        }),
        (None, None) => Err(v.fail(
            "stream",
            "required: pass --stream (or --streams for several, in KCL Java's multi-stream mode), set KCL_STREAM or add `stream` to the config file".into(),
        )),
        (Some(_), None) => {
            if grace.is_some() {
                return Err(v.fail(
                    "stream_removal_grace",
                    "only used with streams (multi-stream mode)".into(),
                ));
            }
            let stream = v.required("stream")?;
            check_arn(&stream).map_err(|reason| v.fail("stream", reason))?;
            Ok(Input::Stream(stream))
        }
    }
}

/// A DynamoDB table's stream: `table`, `stream` (the stream's ARN), or both if they agree;
/// or `streams`, stream ARNs in multi-stream mode.
fn dynamodb(v: &Values, grace: Option<Duration>) -> Result<Input, SettingsError> {
    if v.get("streams").is_some() {
        if let Some(key) = ["stream", "table"].into_iter().find(|k| v.get(k).is_some()) {
            return Err(v.fail(
                key,
                "give stream ARNs with streams (multi-stream mode), or one table or stream ARN, \
                 not both"
                    .into(),
            ));
        }
        return Ok(Input::DynamoDbStreams {
            arns: v.parsed("streams", arns)?.unwrap_or_default(),
            removal_grace: grace,
        });
    }
    if grace.is_some() {
        return Err(v.fail(
            "stream_removal_grace",
            "only used with streams (multi-stream mode)".into(),
        ));
    }
    let table = v.get("table").map(|t| t.trim().to_owned());
    if let Some(t) = &table
        && !super::is_table_name(t)
    {
        return Err(v.fail(
            "table",
            format!("{t:?} is not a valid DynamoDB table name (3 to 255 of a-z A-Z 0-9 _ - .)"),
        ));
    }
    let arn = v.get("stream").map(|a| a.trim().to_owned());
    if let Some(arn) = &arn {
        let of = table_of(arn).map_err(|reason| v.fail("stream", reason))?;
        if let Some(t) = table.as_deref().filter(|t| *t != of) {
            return Err(v.fail(
                "stream",
                format!(
                    "{arn} is a stream of table {of}, not of table {t} (the table setting): \
                     give a stream of {t}, or the table alone for its current stream"
                ),
            ));
        }
    }
    if table.is_none() && arn.is_none() {
        return Err(v.fail(
            "table",
            "required with source dynamodb-streams: pass --table (the table's current stream), \
             --stream with a DynamoDB stream ARN, or --streams with several"
                .into(),
        ));
    }
    Ok(Input::DynamoDb { table, arn })
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

/// A comma-separated list (a TOML or YAML list in a config file arrives joined).
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
