//! The messages of the protocol, as JSON lines (see the crate docs for the exchange).
//!
//! What the daemon writes is serialized field by field in the order KCL Java 3.x's daemon
//! writes it (its Jackson mapper includes `null` fields), so that a client sees the same
//! bytes; the golden lines in the tests were captured from that daemon. What the child writes
//! is read leniently: unknown fields are ignored, and a line that is not a message of the
//! protocol is skipped with a warning, as the Java daemon skips it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kcl_core::{Checkpoint, Record};
use serde::{Deserialize, Serialize};

/// A message to the child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action")]
pub enum ToChild {
    /// Before anything else: the shard and the checkpoint it resumes after.
    #[serde(rename = "initialize", rename_all = "camelCase")]
    Initialize {
        /// The shard.
        shard_id: String,
        /// The checkpoint: a sequence number or a sentinel (`TRIM_HORIZON`, `LATEST`,
        /// `AT_TIMESTAMP`, `SHARD_END`).
        sequence_number: Option<String>,
        /// Its sub-sequence number.
        sub_sequence_number: Option<u64>,
    },
    /// A batch of records.
    #[serde(rename = "processRecords", rename_all = "camelCase")]
    ProcessRecords {
        /// The records, in order.
        records: Vec<JsonRecord>,
        /// How far behind the newest record of the shard the batch is, if known.
        millis_behind_latest: Option<u64>,
    },
    /// The lease is gone: no checkpoint is possible.
    #[serde(rename = "leaseLost")]
    LeaseLost,
    /// Every record of the shard was delivered: checkpoint to end it.
    #[serde(rename = "shardEnded")]
    ShardEnded,
    /// The daemon is stopping or handing the shard over: the last chance to checkpoint.
    #[serde(rename = "shutdownRequested")]
    ShutdownRequested,
    /// The answer to the child's checkpoint: what it asked for, and the error if it failed.
    #[serde(rename = "checkpoint", rename_all = "camelCase")]
    Checkpoint {
        /// The sequence number asked for.
        sequence_number: Option<String>,
        /// The sub-sequence number asked for.
        sub_sequence_number: Option<i64>,
        /// `None` on success, else the name of the Java exception KCL Java would throw.
        error: Option<CheckpointFailure>,
    },
}

impl ToChild {
    /// The `initialize` message for a shard resuming after `checkpoint`.
    pub fn initialize(shard_id: &str, checkpoint: &Checkpoint) -> Self {
        Self::Initialize {
            shard_id: shard_id.to_owned(),
            sequence_number: Some(checkpoint.as_str().to_owned()),
            sub_sequence_number: Some(checkpoint.sub_sequence()),
        }
    }

    /// The action a child's `status` must name when it is done with this message.
    pub fn action(&self) -> &'static str {
        match self {
            Self::Initialize { .. } => "initialize",
            Self::ProcessRecords { .. } => "processRecords",
            Self::LeaseLost => "leaseLost",
            Self::ShardEnded => "shardEnded",
            Self::ShutdownRequested => "shutdownRequested",
            Self::Checkpoint { .. } => "checkpoint",
        }
    }

    /// The message as one line, without the line end.
    pub fn to_line(&self) -> String {
        // Serializing these types cannot fail: no maps with non-string keys, no foreign types.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A record as the child sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonRecord {
    /// The payload, base64 (standard alphabet, padded).
    pub data: String,
    /// The partition key.
    pub partition_key: String,
    /// The sequence number.
    pub sequence_number: String,
    /// When Kinesis accepted the record, in milliseconds since the Unix epoch.
    pub approximate_arrival_timestamp: i64,
    /// The sub-sequence number inside a KPL aggregate (0 otherwise).
    pub sub_sequence_number: u64,
    /// Always `record`.
    pub action: &'static str,
}

impl From<&Record> for JsonRecord {
    fn from(record: &Record) -> Self {
        Self {
            data: STANDARD.encode(&record.data),
            partition_key: record.partition_key.clone(),
            sequence_number: record.sequence_number.to_string(),
            approximate_arrival_timestamp: record.approximate_arrival.timestamp_millis(),
            sub_sequence_number: record.sub_sequence_number,
            action: "record",
        }
    }
}

/// Why a checkpoint failed, by the name of the exception KCL Java's checkpointer throws,
/// which is what the client libraries raise to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CheckpointFailure {
    /// The lease is gone (taken, expired or released): stop processing the shard.
    ShutdownException,
    /// The lease table throttled the write; retry later.
    ThrottlingException,
    /// No checkpoint is possible now (in `initialize` or `leaseLost`).
    InvalidStateException,
    /// The position is not a number, was not delivered yet, or is behind the checkpoint.
    IllegalArgumentException,
    /// The lease table could not be written for another reason; retry later.
    KinesisClientLibDependencyException,
}

impl CheckpointFailure {
    /// The name, as it appears in the message.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ShutdownException => "ShutdownException",
            Self::ThrottlingException => "ThrottlingException",
            Self::InvalidStateException => "InvalidStateException",
            Self::IllegalArgumentException => "IllegalArgumentException",
            Self::KinesisClientLibDependencyException => "KinesisClientLibDependencyException",
        }
    }
}

/// A message from the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FromChild {
    /// The child is done with the message named.
    Status {
        /// The action it answers (`None` if the field was missing or null).
        response_for: Option<String>,
    },
    /// The child asks to checkpoint; without a sequence number, at the last record delivered
    /// (in `shardEnded`, at the shard's end).
    Checkpoint {
        /// The sequence number, if given.
        sequence_number: Option<String>,
        /// The sub-sequence number, if given.
        sub_sequence_number: Option<i64>,
    },
    /// A well-formed message of another kind (the Java daemon ignores those too).
    Other {
        /// Its action.
        action: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Incoming {
    action: String,
    #[serde(default)]
    response_for: Option<String>,
    #[serde(default)]
    sequence_number: Option<String>,
    #[serde(default)]
    sub_sequence_number: Option<i64>,
}

impl FromChild {
    /// Parses one line of the child's stdout: `None` for an empty line or one that is not a
    /// JSON object with an `action`.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            return None;
        }
        let incoming: Incoming = serde_json::from_str(line).ok()?;
        Some(match incoming.action.as_str() {
            "status" => Self::Status {
                response_for: incoming.response_for,
            },
            "checkpoint" => Self::Checkpoint {
                sequence_number: incoming.sequence_number,
                sub_sequence_number: incoming.sub_sequence_number,
            },
            _ => Self::Other {
                action: incoming.action,
            },
        })
    }
}
