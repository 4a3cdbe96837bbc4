//! [`DynamoDbStreamsSource`]: a DynamoDB table's stream as a [`ShardSource`], for the same
//! fleet, leases and checkpoints as a Kinesis stream. What it matches and why:
//! [`docs/design/dynamodb-streams.md`](https://github.com/kcl-rs/kcl/blob/main/docs/design/dynamodb-streams.md).
//!
//! - Lease keys are the stream's shard ids and checkpoints its sequence numbers, as the Java
//!   DynamoDB Streams Kinesis Adapter writes them; shards have one parent at most and the
//!   adapter's fixed 0–1 hash-key range.
//! - A record's `data` is the stream record as the adapter's JSON (`eventID`, `eventName`,
//!   `dynamodb { Keys, NewImage, OldImage, SequenceNumber, … }`, attribute values in DynamoDB
//!   JSON through `serde_dynamo`, `ApproximateCreationDateTime` in epoch milliseconds). Its
//!   partition key is the item's key, in canonical JSON, so that `kcl_core::Parallel` orders
//!   records per item (the adapter uses the sequence number).
//! - `DescribeStream` pages until `LastEvaluatedShardId` comes back empty; `GetRecords` asks
//!   for at most 1,000 records.

use std::collections::{BTreeMap, HashMap};

use aws_config::SdkConfig;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{self as sdk, ShardIteratorType};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use kcl_core::{
    BackendError, ErrorKind, HashKeyRange, Record, RecordBatch, SequenceNumber, Shard, ShardId,
    ShardIterator, ShardSource, StartingPosition,
};
use serde_json::{Map, Value, json};

use crate::error::backend_error;

/// The most records one `GetRecords` returns on DynamoDB Streams.
const MAX_RECORDS: u32 = 1000;

/// A [`ShardSource`] on one DynamoDB stream. See the module docs.
#[derive(Debug, Clone)]
pub struct DynamoDbStreamsSource {
    client: Client,
    arn: String,
}

impl DynamoDbStreamsSource {
    /// The current stream of `table` (`DescribeTable`'s `LatestStreamArn`). Fails, naming the
    /// table and what to do, when the table has no stream enabled.
    pub async fn for_table(config: &SdkConfig, table: &str) -> Result<Self, BackendError> {
        let conf = aws_sdk_dynamodb::config::Builder::from(config)
            .timeout_config(crate::timeouts::with_defaults(
                config,
                crate::timeouts::DYNAMODB,
            ))
            .build();
        let dynamodb = aws_sdk_dynamodb::Client::from_conf(conf);
        let out = dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| backend_error("describe_table", format!("table {table}"), e))?;
        let description = out.table;
        let enabled = description
            .as_ref()
            .and_then(|d| d.stream_specification.as_ref())
            .is_some_and(|s| s.stream_enabled);
        match description.and_then(|d| d.latest_stream_arn) {
            Some(arn) if enabled => Ok(Self::for_stream(config, arn)),
            _ => Err(BackendError::new(
                ErrorKind::Fatal,
                "describe_table",
                format!(
                    "table {table} has no DynamoDB stream enabled: enable one (StreamSpecification \
                     with StreamEnabled, e.g. view type NEW_AND_OLD_IMAGES) and start again"
                ),
            )),
        }
    }

    /// The stream `arn`, with the credentials, region and endpoint
    /// (`AWS_ENDPOINT_URL_DYNAMODB_STREAMS`) of `config`.
    pub fn for_stream(config: &SdkConfig, arn: impl Into<String>) -> Self {
        let conf = aws_sdk_dynamodbstreams::config::Builder::from(config)
            .timeout_config(crate::timeouts::with_defaults(
                config,
                crate::timeouts::DYNAMODB,
            ))
            .build();
        Self {
            client: Client::from_conf(conf),
            arn: arn.into(),
        }
    }

    /// The stream read.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    fn what(&self) -> String {
        format!("stream {}", self.arn)
    }
}

impl ShardSource for DynamoDbStreamsSource {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        let mut shards = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_stream()
                .stream_arn(&self.arn)
                .set_exclusive_start_shard_id(start.take())
                .limit(100)
                .send()
                .await
                .map_err(|e| backend_error("describe_stream", self.what(), e))?;
            let Some(description) = out.stream_description else {
                return Ok(shards);
            };
            if description.stream_status == Some(sdk::StreamStatus::Disabled) {
                tracing::warn!(stream = %self.arn, "the stream is disabled: its shards end; a re-enabled stream has a new ARN");
            }
            shards.extend(
                description
                    .shards
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(shard),
            );
            match description.last_evaluated_shard_id {
                Some(id) if !id.is_empty() => start = Some(id),
                _ => return Ok(shards),
            }
        }
    }

    async fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        let request = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.arn)
            .shard_id(shard.as_str());
        let request = match position {
            StartingPosition::TrimHorizon => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            StartingPosition::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            StartingPosition::AtSequence(s) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(s.as_str()),
            StartingPosition::AfterSequence(s) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(s.as_str()),
            StartingPosition::AtTimestamp(t) => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(aws_smithy_types::DateTime::from_millis(
                    t.timestamp_millis(),
                )),
        };
        let out = request.send().await.map_err(|e| {
            backend_error("get_shard_iterator", format!("{shard} of {}", self.arn), e)
        })?;
        out.shard_iterator.map(ShardIterator).ok_or_else(|| {
            BackendError::new(
                ErrorKind::NotFound,
                "get_shard_iterator",
                format!("no iterator for {shard}"),
            )
        })
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        let out = self
            .client
            .get_records()
            .shard_iterator(&iterator.0)
            .limit(i32::try_from(limit.min(MAX_RECORDS)).unwrap_or(1000))
            .send()
            .await
            .map_err(|e| backend_error("get_records", self.what(), e))?;
        let records: Vec<Record> = out
            .records
            .unwrap_or_default()
            .iter()
            .filter_map(record)
            .collect();
        let behind = records.last().map(|r| {
            let millis = (Utc::now() - r.approximate_arrival).num_milliseconds();
            u64::try_from(millis).unwrap_or(0)
        });
        Ok(RecordBatch {
            records,
            next_iterator: out.next_shard_iterator.map(ShardIterator),
            millis_behind_latest: behind,
            child_shards: Vec::new(),
        })
    }
}

/// A shard as the lease table knows it; `None` without an id.
fn shard(s: sdk::Shard) -> Option<Shard> {
    let closed = s
        .sequence_number_range
        .as_ref()
        .is_some_and(|r| r.ending_sequence_number.is_some());
    Some(Shard {
        id: ShardId::new(s.shard_id?),
        parent_shard_ids: s.parent_shard_id.into_iter().map(ShardId::new).collect(),
        hash_key_range: HashKeyRange { start: 0, end: 1 },
        closed,
    })
}

/// A stream record as a kcl record (see the module docs); `None` without a sequence number.
fn record(r: &sdk::Record) -> Option<Record> {
    let change = r.dynamodb.as_ref()?;
    let sequence = SequenceNumber::parse(change.sequence_number.as_deref()?)?;
    let created = change
        .approximate_creation_date_time
        .and_then(|t| DateTime::from_timestamp_millis(t.to_millis().ok()?))
        .unwrap_or_else(Utc::now);
    let keys = change.keys.as_ref().map(item);
    let partition_key = keys.as_ref().map(Value::to_string).unwrap_or_default();
    let data = adapter_json(r, change, created);
    Some(
        Record::new(sequence, partition_key, Bytes::from(data.to_string()))
            .with_approximate_arrival(created),
    )
}

/// The record as the Java adapter's JSON.
fn adapter_json(r: &sdk::Record, change: &sdk::StreamRecord, created: DateTime<Utc>) -> Value {
    let mut dynamodb = Map::new();
    dynamodb.insert(
        "ApproximateCreationDateTime".into(),
        json!(created.timestamp_millis()),
    );
    for (name, image) in [
        ("Keys", &change.keys),
        ("NewImage", &change.new_image),
        ("OldImage", &change.old_image),
    ] {
        if let Some(image) = image {
            dynamodb.insert(name.into(), item(image));
        }
    }
    dynamodb.insert("SequenceNumber".into(), json!(change.sequence_number));
    if let Some(size) = change.size_bytes {
        dynamodb.insert("SizeBytes".into(), json!(size));
    }
    if let Some(view) = &change.stream_view_type {
        dynamodb.insert("StreamViewType".into(), json!(view.as_str()));
    }
    let mut out = Map::new();
    let mut put = |k: &str, v: Option<&str>| {
        if let Some(v) = v {
            out.insert(k.into(), json!(v));
        }
    };
    put("eventID", r.event_id.as_deref());
    put(
        "eventName",
        r.event_name.as_ref().map(sdk::OperationType::as_str),
    );
    put("eventVersion", r.event_version.as_deref());
    put("eventSource", r.event_source.as_deref());
    put("awsRegion", r.aws_region.as_deref());
    out.insert("dynamodb".into(), Value::Object(dynamodb));
    if let Some(identity) = &r.user_identity {
        out.insert(
            "userIdentity".into(),
            json!({"principalId": identity.principal_id, "type": identity.r#type}),
        );
    }
    Value::Object(out)
}

/// An item (keys or an image) in DynamoDB JSON, its attributes sorted by name.
fn item(attributes: &HashMap<String, sdk::AttributeValue>) -> Value {
    let sorted: BTreeMap<&String, Value> = attributes
        .iter()
        .filter(|(_, v)| known(v))
        .map(|(k, v)| {
            let value = serde_dynamo::AttributeValue::from(v.clone());
            (k, serde_json::to_value(value).unwrap_or(Value::Null))
        })
        .collect();
    serde_json::to_value(sorted).unwrap_or(Value::Null)
}

/// Whether `value` holds no variant this SDK does not know (`serde_dynamo` panics on one).
fn known(value: &sdk::AttributeValue) -> bool {
    match value {
        sdk::AttributeValue::M(map) => map.values().all(known),
        sdk::AttributeValue::L(list) => list.iter().all(known),
        other => !other.is_unknown(),
    }
}
