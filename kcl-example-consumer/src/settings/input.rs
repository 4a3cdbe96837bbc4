//! What `run` consumes: one stream (`stream`), or several in KCL Java's multi-stream mode
//! (`streams`).
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
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stream(name) => f.write_str(name),
            Self::Streams { names, .. } => f.write_str(&names.join(",")),
        }
    }
}

/// `stream`, or `streams` and `stream_removal_grace`.
pub(super) fn input(v: &Values) -> Result<Input, SettingsError> {
    let grace = v.parsed("stream_removal_grace", parse_duration)?;
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

/// A comma-separated list (a TOML or YAML list in a config file arrives joined).
fn names(list: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!(
                "expected stream names or ARNs separated by commas, got {list:?}"
            ));
        }
        check_arn(name)?;
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
