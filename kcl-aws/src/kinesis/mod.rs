//! [`KinesisShardSource`]: the Kinesis API the worker reads with: ListShards, GetShardIterator
//! and GetRecords, or RegisterStreamConsumer and SubscribeToShard for enhanced fan-out.
//!
//! Why it is written the way it is:
//! - `ListShards` pages with `NextToken` **alone**: AWS rejects a request that carries both a
//!   token and a stream name or ARN.
//! - Every SDK failure goes through the crate's `error` module, so the worker sees an expired iterator as
//!   [`kcl_core::ErrorKind::ExpiredIterator`] (its fetch loop
//!   reopens after the last delivered record), throttling (`ProvisionedThroughputExceeded`,
//!   KMS throttling) as `Throttled` (it backs off), and a missing stream as a fatal error
//!   that names the stream.
//! - Shard end is what Kinesis says it is: a null `NextShardIterator`, with `ChildShards`.
//! - Records are not de-aggregated here: KPL aggregated records arrive as one record with
//!   sub-sequence number 0, and the worker splits them (`kcl_core::aggregation`).
//! - Enhanced fan-out (`register_consumer`, `subscribe`) lives in `fan_out`.

use std::fmt;

use aws_config::SdkConfig;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::DateTime as SdkDateTime;
use aws_sdk_kinesis::types::{self as sdk, ShardIteratorType};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use kcl_core::{
    BackendError, ConsumerId, ErrorKind, HashKeyRange, Record, RecordBatch, SequenceNumber, Shard,
    ShardId, ShardIterator, ShardSource, StartingPosition, Subscription,
};

use crate::error::{ParseError, backend_error};
use kcl_core::multi_stream::StreamId;

/// A stream, by name or by ARN. `From<&str>`/`From<String>` pick ARN for strings starting
/// with `arn:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StreamRef {
    /// The stream name (in the region of the SDK config).
    Name(String),
    /// The stream ARN (any region or account the credentials may read).
    Arn(String),
}

impl From<&str> for StreamRef {
    fn from(s: &str) -> Self {
        Self::from(s.to_owned())
    }
}

impl From<String> for StreamRef {
    fn from(s: String) -> Self {
        if s.starts_with("arn:") {
            Self::Arn(s)
        } else {
            Self::Name(s)
        }
    }
}

impl fmt::Display for StreamRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => write!(f, "stream {name}"),
            Self::Arn(arn) => write!(f, "stream {arn}"),
        }
    }
}

/// A [`ShardSource`] on one Kinesis stream. See the module docs.
#[derive(Debug, Clone)]
pub struct KinesisShardSource {
    client: Client,
    stream: StreamRef,
}

impl KinesisShardSource {
    /// A source on `stream` (name or ARN), with the credentials, region, endpoint
    /// (`AWS_ENDPOINT_URL_KINESIS`), retry and timeout settings of `config`, and an attempt
    /// timeout of 5 s and an operation timeout of 10 s where `config` sets none.
    pub fn new(config: &SdkConfig, stream: impl Into<StreamRef>) -> Self {
        let conf = aws_sdk_kinesis::config::Builder::from(config)
            .timeout_config(crate::timeouts::with_defaults(
                config,
                crate::timeouts::KINESIS,
            ))
            .build();
        Self::from_client(Client::from_conf(conf), stream)
    }

    /// A source using an already built client (custom configuration, tests).
    pub fn from_client(client: Client, stream: impl Into<StreamRef>) -> Self {
        Self {
            client,
            stream: stream.into(),
        }
    }

    /// The stream read.
    pub fn stream(&self) -> &StreamRef {
        &self.stream
    }

    /// The Kinesis client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The stream's id in multi-stream mode (account, name, creation time), from
    /// `DescribeStreamSummary`: for a [`MultiStreamSource`](kcl_core::multi_stream::MultiStreamSource)'s
    /// tracker.
    pub async fn stream_id(&self) -> Result<StreamId, BackendError> {
        let request = self.client.describe_stream_summary();
        let request = match &self.stream {
            StreamRef::Name(name) => request.stream_name(name),
            StreamRef::Arn(arn) => request.stream_arn(arn),
        };
        let out = request
            .send()
            .await
            .map_err(|e| backend_error("describe_stream_summary", &self.stream, e))?;
        let invalid = |what: &str| {
            BackendError::new(
                ErrorKind::Fatal,
                "describe_stream_summary",
                format!("{}: the answer has no valid {what}", self.stream),
            )
        };
        let summary = out
            .stream_description_summary
            .ok_or_else(|| invalid("summary"))?;
        // arn:aws:kinesis:REGION:ACCOUNT:stream/NAME
        let account = summary
            .stream_arn
            .split(':')
            .nth(4)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid("stream ARN"))?;
        let created = u64::try_from(summary.stream_creation_timestamp.secs())
            .map_err(|_| invalid("creation time"))?;
        Ok(StreamId::new(account, summary.stream_name, created))
    }

    fn shard_what(&self, shard: &ShardId) -> String {
        format!("shard {shard} of {}", self.stream)
    }
}

impl ShardSource for KinesisShardSource {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let request = self.client.list_shards();
            let request = match (&token, &self.stream) {
                (Some(token), _) => request.next_token(token),
                (None, StreamRef::Name(name)) => request.stream_name(name),
                (None, StreamRef::Arn(arn)) => request.stream_arn(arn),
            };
            let out = request
                .send()
                .await
                .map_err(|e| backend_error("list_shards", &self.stream, e))?;
            for shard in out.shards.unwrap_or_default() {
                shards.push(convert_shard(&shard).map_err(|e| {
                    invalid_answer("list_shards", &self.stream, &shard.shard_id, &e)
                })?);
            }
            match out.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => break,
            }
        }
        Ok(shards)
    }

    async fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        let request = self.client.get_shard_iterator().shard_id(shard.as_str());
        let request = match &self.stream {
            StreamRef::Name(name) => request.stream_name(name),
            StreamRef::Arn(arn) => request.stream_arn(arn),
        };
        let request = match position {
            StartingPosition::TrimHorizon => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            StartingPosition::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            StartingPosition::AtTimestamp(at) => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(to_sdk_time(*at)),
            StartingPosition::AtSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .starting_sequence_number(seq.as_str()),
            StartingPosition::AfterSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq.as_str()),
        };
        let out = request
            .send()
            .await
            .map_err(|e| backend_error("shard_iterator", self.shard_what(shard), e))?;
        out.shard_iterator.map(ShardIterator).ok_or_else(|| {
            BackendError::new(
                ErrorKind::Retryable,
                "shard_iterator",
                format!("{}: the answer carried no iterator", self.shard_what(shard)),
            )
        })
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        let limit = i32::try_from(limit.clamp(1, 10_000)).unwrap_or(10_000);
        let request = self
            .client
            .get_records()
            .shard_iterator(&iterator.0)
            .limit(limit);
        let request = match &self.stream {
            StreamRef::Arn(arn) => request.stream_arn(arn),
            StreamRef::Name(_) => request,
        };
        let out = request
            .send()
            .await
            .map_err(|e| backend_error("get_records", &self.stream, e))?;
        let records = out
            .records
            .into_iter()
            .map(|r| convert_record(r, "get_records", &self.stream))
            .collect::<Result<_, _>>()?;
        let child_shards = convert_children(
            out.child_shards.as_deref().unwrap_or_default(),
            "get_records",
            &self.stream,
        )?;
        Ok(RecordBatch {
            records,
            next_iterator: out.next_shard_iterator.map(ShardIterator),
            millis_behind_latest: out.millis_behind_latest.and_then(|m| u64::try_from(m).ok()),
            child_shards,
        })
    }

    async fn register_consumer(&self, name: &str) -> Result<ConsumerId, BackendError> {
        fan_out::register(self, name).await
    }

    async fn subscribe(
        &self,
        consumer: &ConsumerId,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<Subscription, BackendError> {
        fan_out::subscribe(self, consumer, shard, position).await
    }
}

/// A record of a `GetRecords` answer or a subscription event.
fn convert_record(
    record: sdk::Record,
    operation: &'static str,
    stream: &StreamRef,
) -> Result<Record, BackendError> {
    let sequence_number =
        SequenceNumber::parse(record.sequence_number.as_str()).ok_or_else(|| {
            BackendError::new(
                ErrorKind::Fatal,
                operation,
                format!(
                    "{stream}: invalid sequence number `{}`",
                    record.sequence_number
                ),
            )
        })?;
    let arrival = record
        .approximate_arrival_timestamp
        .as_ref()
        .and_then(from_sdk_time)
        .unwrap_or_else(Utc::now);
    Ok(Record::new(
        sequence_number,
        record.partition_key.unwrap_or_default(),
        Bytes::from(record.data.into_inner()),
    )
    .with_approximate_arrival(arrival))
}

/// The shards that continue a closed shard, from its last answer or event.
fn convert_children(
    children: &[sdk::ChildShard],
    operation: &'static str,
    stream: &StreamRef,
) -> Result<Vec<Shard>, BackendError> {
    children
        .iter()
        .map(|child| {
            convert_child(child).map_err(|e| invalid_answer(operation, stream, &child.shard_id, &e))
        })
        .collect()
}

fn invalid_answer(
    operation: &'static str,
    stream: &StreamRef,
    shard: &str,
    error: &ParseError,
) -> BackendError {
    BackendError::new(
        ErrorKind::Fatal,
        operation,
        format!("{stream}: shard {shard} in the answer is invalid: {error}"),
    )
}

fn convert_range(range: Option<&sdk::HashKeyRange>) -> Result<HashKeyRange, ParseError> {
    let range = range.ok_or(ParseError::Missing("HashKeyRange"))?;
    let parse = |name: &'static str, value: &str| {
        value.parse::<u128>().map_err(|_| ParseError::Invalid {
            name,
            value: value.to_owned(),
        })
    };
    Ok(HashKeyRange {
        start: parse("StartingHashKey", range.starting_hash_key())?,
        end: parse("EndingHashKey", range.ending_hash_key())?,
    })
}

fn convert_shard(shard: &sdk::Shard) -> Result<Shard, ParseError> {
    let parent_shard_ids = [shard.parent_shard_id(), shard.adjacent_parent_shard_id()]
        .into_iter()
        .flatten()
        .map(ShardId::from)
        .collect();
    Ok(Shard {
        id: ShardId::from(shard.shard_id()),
        parent_shard_ids,
        hash_key_range: convert_range(shard.hash_key_range())?,
        closed: shard
            .sequence_number_range()
            .is_some_and(|r| r.ending_sequence_number().is_some()),
    })
}

fn convert_child(child: &sdk::ChildShard) -> Result<Shard, ParseError> {
    Ok(Shard {
        id: ShardId::from(child.shard_id()),
        parent_shard_ids: child
            .parent_shards()
            .iter()
            .map(|p| ShardId::from(p.as_str()))
            .collect(),
        hash_key_range: convert_range(child.hash_key_range())?,
        closed: false,
    })
}

fn to_sdk_time(at: DateTime<Utc>) -> SdkDateTime {
    SdkDateTime::from_secs_and_nanos(at.timestamp(), at.timestamp_subsec_nanos())
}

fn from_sdk_time(at: &SdkDateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(at.secs(), at.subsec_nanos())
}

mod fan_out;
#[cfg(test)]
mod tests;
