//! What `run` consumes (`source`, `stream`, `streams`, `table`, `stream_removal_grace`), by
//! the rules every kcl binary shares ([`kcl_serve::source`]).

use kcl_serve::{SourceKeys, SourceKind, SourceSpec};

use super::RunArgs;
use super::{SettingsError, Values};

/// The streams the settings name; one is required.
pub(super) fn input(a: &RunArgs, v: &Values<'_>) -> Result<SourceSpec, SettingsError> {
    let keys = SourceKeys {
        source: a.source,
        stream: a.stream.as_deref(),
        streams: a.streams.as_deref(),
        table: a.table.as_deref(),
        removal_grace: a.stream_removal_grace,
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
