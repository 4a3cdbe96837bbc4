//! What `run` consumes (`source`, `stream`, `streams`, `table`, `stream_removal_grace`), by
//! the rules every kcl binary shares ([`kcl_serve::source`]).

use kcl_serve::{SourceKeys, SourceKind, SourceSpec};

use super::parse::from_str;
use super::{SettingsError, Values};
use crate::cli::parse_duration;

/// The streams the settings name; one is required.
pub(super) fn input(v: &Values) -> Result<SourceSpec, SettingsError> {
    let removal_grace = v.parsed("stream_removal_grace", parse_duration)?;
    let keys = SourceKeys {
        source: v.parsed("source", from_str)?.unwrap_or_default(),
        stream: v.get("stream"),
        streams: v.get("streams"),
        table: v.get("table"),
        removal_grace,
    };
    match SourceSpec::from_keys(&keys) {
        Ok(Some(spec)) => Ok(spec),
        Err(e) => Err(v.fail(e.key.name(), e.reason)),
        Ok(None) if keys.source == SourceKind::DynamoDbStreams => Err(v.fail(
            "table",
            "required with source dynamodb-streams: pass --table (the table's current stream), \
             --stream with a DynamoDB stream ARN, or --streams with several"
                .into(),
        )),
        Ok(None) => Err(v.fail(
            "stream",
            "required: pass --stream (or --streams for several, in KCL Java's multi-stream \
             mode), set KCL_STREAM or add `stream` to the config file"
                .into(),
        )),
    }
}
