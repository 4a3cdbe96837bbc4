//! [`DynamoDbStreamsSource`]: a DynamoDB table's stream as a [`ShardSource`], for the same
//! fleet, leases and checkpoints as a Kinesis stream. What it matches and why:
//! [`docs/dynamodb-streams.md`](https://github.com/kcl-rs/kcl/blob/main/docs/dynamodb-streams.md).
//!
//! - Lease keys are the stream's shard ids and checkpoints its sequence numbers, as the Java
//!   DynamoDB Streams Kinesis Adapter writes them; shards have one parent at most and the
//!   adapter's fixed 0–1 hash-key range.
//! - A record's `data` is the stream record as the adapter's JSON; [`Change::parse`] reads it
//!   back typed. Its partition key is the item's key, so that `kcl_core::Parallel` orders
//!   records per item (the adapter uses the sequence number).
//! - `DescribeStream` pages until `LastEvaluatedShardId` comes back empty; `GetRecords` asks
//!   for at most 1,000 records. At a shard's end the source asks for its children, as the
//!   adapter does (see `shards`).
//! - A position older than the stream's 24-hour retention (`TrimmedDataAccessException`) is
//!   logged as an error, counted (`kcl_trimmed_positions_total`) and read on from
//!   `TRIM_HORIZON`, the oldest record kept, as the adapter does by default: what was trimmed
//!   is gone, and waiting would let more of it go.
//! - Built for a table, the source checks at every shard sync that the table's latest stream
//!   is still the one it reads, and says so (a warning, `kcl_dynamodb_stream_superseded`)
//!   when the stream was disabled or replaced.

use std::sync::{Arc, Mutex, PoisonError};

use aws_config::SdkConfig;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::operation::get_shard_iterator::builders::GetShardIteratorFluentBuilder;
use aws_sdk_dynamodbstreams::types::{self as sdk, ShardIteratorType};
use chrono::Utc;
use kcl_core::{
    BackendError, ErrorKind, Record, RecordBatch, Shard, ShardId, ShardIterator, ShardSource,
    StartingPosition,
};

use crate::error::backend_error;

mod change;
mod multi;
mod shards;
#[cfg(test)]
mod tests;

pub use change::{Change, ChangeError, Item, to_json};
pub use multi::{stream_arn, stream_id, table_of};

/// The most records one `GetRecords` returns on DynamoDB Streams.
const MAX_RECORDS: u32 = 1000;

/// A [`ShardSource`] on one DynamoDB stream. See the module docs.
#[derive(Debug, Clone)]
pub struct DynamoDbStreamsSource {
    client: Client,
    arn: String,
    /// The table the stream belongs to (`DescribeStream`'s `TableName`).
    table: String,
    /// Built for a table: how the source learns that the table's stream changed.
    latest: Option<Arc<Latest>>,
}

/// The table's current stream, checked at every shard sync.
#[derive(Debug)]
struct Latest {
    dynamodb: aws_sdk_dynamodb::Client,
    /// Why the stream is no longer the table's current one, as last reported.
    reported: Mutex<Option<Superseded>>,
}

impl DynamoDbStreamsSource {
    /// The current stream of `table` (`DescribeTable`'s `LatestStreamArn`). Fails, naming the
    /// table and what to do, when the table has no stream or its stream is disabled.
    pub async fn for_table(config: &SdkConfig, table: &str) -> Result<Self, BackendError> {
        let dynamodb = dynamodb_client(config);
        let out = dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| backend_error("describe_table", format!("table {table}"), e))?;
        let arn = current_stream(table, out.table)
            .map_err(|why| BackendError::new(ErrorKind::Fatal, "describe_table", why))?;
        let mut source = Self::for_stream(config, arn).await?;
        source.latest = Some(Arc::new(Latest {
            dynamodb,
            reported: Mutex::new(None),
        }));
        Ok(source)
    }

    /// The stream `arn`, with the credentials, region and endpoint
    /// (`AWS_ENDPOINT_URL_DYNAMODB_STREAMS`) of `config`. Fails, naming the ARN, when there
    /// is no such stream. A disabled stream is read (what it kept, for 24 hours, until its
    /// shards end), with a warning: that is how a fleet finishes a stream it replaced.
    pub async fn for_stream(
        config: &SdkConfig,
        arn: impl Into<String>,
    ) -> Result<Self, BackendError> {
        Self::open(streams_client(config), arn.into()).await
    }

    /// The stream `arn` of `table`, not looked up.
    fn unchecked(config: &SdkConfig, arn: String, table: String) -> Self {
        Self {
            client: streams_client(config),
            arn,
            table,
            latest: None,
        }
    }

    /// Looks the stream up through `client`.
    async fn open(client: Client, arn: String) -> Result<Self, BackendError> {
        let out = client
            .describe_stream()
            .stream_arn(&arn)
            .limit(1)
            .send()
            .await
            .map_err(|e| {
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception())
                {
                    BackendError::new(
                        ErrorKind::Fatal,
                        "describe_stream",
                        format!(
                            "no DynamoDB stream {arn}: check the ARN, its region and account, or \
                             give the table instead, whose current stream is its LatestStreamArn \
                             (streams are kept 24 hours after they are disabled)"
                        ),
                    )
                } else {
                    backend_error("describe_stream", format!("stream {arn}"), e)
                }
            })?;
        let description = out
            .stream_description
            .unwrap_or_else(|| sdk::StreamDescription::builder().build());
        if description.stream_status == Some(sdk::StreamStatus::Disabled) {
            tracing::warn!(stream = %arn, "the stream is disabled: reading what it kept (24 hours) until its shards end");
        }
        Ok(Self {
            client,
            table: description.table_name.unwrap_or_default(),
            arn,
            latest: None,
        })
    }

    /// The stream a program's settings name: `arn` if given (refused, naming both, unless it
    /// is `table`'s when both are given), else `table`'s current stream (see
    /// [`for_table`](Self::for_table)).
    pub async fn find(
        config: &SdkConfig,
        table: Option<&str>,
        arn: Option<&str>,
    ) -> Result<Self, BackendError> {
        match (table, arn) {
            (Some(table), None) => Self::for_table(config, table).await,
            (None, Some(arn)) => Self::for_stream(config, arn).await,
            (Some(table), Some(arn)) => Self::for_stream(config, arn).await?.expect_table(table),
            (None, None) => Err(BackendError::new(
                ErrorKind::Fatal,
                "describe_table",
                "no table and no stream ARN: give one",
            )),
        }
    }

    /// Fails unless the stream is `table`'s, naming both.
    fn expect_table(self, table: &str) -> Result<Self, BackendError> {
        if self.table == table {
            return Ok(self);
        }
        Err(BackendError::new(
            ErrorKind::Fatal,
            "describe_stream",
            format!(
                "stream {} is table {}'s, not table {table}'s: give a stream of table {table} \
                 (or the table alone, for its current stream), or name table {}",
                self.arn, self.table, self.table
            ),
        ))
    }

    /// The stream read.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// The table whose stream it is.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn what(&self) -> String {
        format!("stream {}", self.arn)
    }

    /// A `GetShardIterator` request for `shard` at `position`.
    fn iterator_request(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> GetShardIteratorFluentBuilder {
        let request = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.arn)
            .shard_id(shard.as_str());
        match position {
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
        }
    }

    /// Compares the table's current stream with this one; a change is logged once, and
    /// returned.
    async fn watch_latest(&self) -> Option<Superseded> {
        let latest = self.latest.as_ref()?;
        let answer = latest
            .dynamodb
            .describe_table()
            .table_name(&self.table)
            .send()
            .await;
        let now = match answer {
            Ok(out) => match current_stream(&self.table, out.table) {
                Ok(arn) if arn == self.arn => None,
                Ok(arn) => Some(Superseded::By(arn)),
                Err(_) => Some(Superseded::Disabled),
            },
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Some(Superseded::TableGone)
            }
            Err(e) => {
                tracing::debug!(table = %self.table, error = %e, "cannot check the table's current stream");
                return None;
            }
        };
        metrics::gauge!("kcl_dynamodb_stream_superseded", "stream" => self.arn.clone())
            .set(if now.is_some() { 1.0 } else { 0.0 });
        let mut reported = latest
            .reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if now.is_none() || *reported == now {
            return None;
        }
        *reported = now.clone();
        let (table, stream) = (&self.table, &self.arn);
        match now.as_ref()? {
            Superseded::By(new) => tracing::warn!(
                %table, %stream, new_stream = %new,
                "the table has a new stream (its stream was disabled and enabled again, or the \
                 table made again): this fleet reads the old one until its shards end; restart \
                 it to read the new one, with initial position TRIM_HORIZON to miss none of its \
                 changes"
            ),
            Superseded::Disabled => tracing::warn!(
                %table, %stream,
                "the table's stream is disabled: its shards end and no new changes arrive"
            ),
            Superseded::TableGone => tracing::warn!(
                %table, %stream,
                "the table is gone: its stream stays readable for 24 hours and its shards end"
            ),
        }
        now
    }
}

/// Why the stream read is no longer its table's current one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Superseded {
    /// The table has another stream, this ARN.
    By(String),
    /// The table's stream is disabled.
    Disabled,
    /// The table was deleted.
    TableGone,
}

/// A DynamoDB Streams client with the crate's timeouts.
fn streams_client(config: &SdkConfig) -> Client {
    let conf = aws_sdk_dynamodbstreams::config::Builder::from(config)
        .timeout_config(crate::timeouts::with_defaults(
            config,
            crate::timeouts::DYNAMODB,
        ))
        .build();
    Client::from_conf(conf)
}

/// A DynamoDB client with the crate's timeouts.
fn dynamodb_client(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    let conf = aws_sdk_dynamodb::config::Builder::from(config)
        .timeout_config(crate::timeouts::with_defaults(
            config,
            crate::timeouts::DYNAMODB,
        ))
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

/// The table's current, enabled stream, or why there is none (naming what to do).
fn current_stream(
    table: &str,
    description: Option<aws_sdk_dynamodb::types::TableDescription>,
) -> Result<String, String> {
    let description =
        description.unwrap_or_else(|| aws_sdk_dynamodb::types::TableDescription::builder().build());
    let enabled = description
        .stream_specification
        .as_ref()
        .is_some_and(|s| s.stream_enabled);
    match (description.latest_stream_arn, enabled) {
        (Some(arn), true) => Ok(arn),
        (Some(arn), false) => Err(format!(
            "the stream of table {table} ({arn}) is disabled: enable the table's stream again \
             (UpdateTable with StreamSpecification StreamEnabled=true; that makes a new stream, \
             with a new ARN) and start again. The disabled stream stays readable for 24 hours: \
             to finish reading it, give its ARN instead of the table"
        )),
        (None, _) => Err(format!(
            "table {table} has no DynamoDB stream: enable one (UpdateTable with \
             StreamSpecification StreamEnabled=true and a view type, e.g. NEW_AND_OLD_IMAGES) \
             and start again"
        )),
    }
}

impl ShardSource for DynamoDbStreamsSource {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        self.watch_latest().await;
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
            shards.extend(
                description
                    .shards
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(shards::shard),
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
        let what = || format!("{shard} of {}", self.arn);
        let out = match self.iterator_request(shard, position).send().await {
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_trimmed_data_access_exception()) =>
            {
                tracing::error!(
                    shard.id = %shard, %position,
                    "the position is older than the stream's 24-hour retention: the records \
                     between it and the oldest one kept were trimmed and cannot be read; \
                     reading on from TRIM_HORIZON"
                );
                metrics::counter!("kcl_trimmed_positions_total", "shard" => shard.to_string())
                    .increment(1);
                self.iterator_request(shard, &StartingPosition::TrimHorizon)
                    .send()
                    .await
            }
            other => other,
        }
        .map_err(|e| backend_error("get_shard_iterator", what(), e))?;
        let raw = out.shard_iterator.ok_or_else(|| {
            BackendError::new(
                ErrorKind::NotFound,
                "get_shard_iterator",
                format!("no iterator for {}", what()),
            )
        })?;
        Ok(shards::tag(shard.as_str(), &raw))
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        let (shard, raw) = shards::untag(iterator)?;
        let out = self
            .client
            .get_records()
            .shard_iterator(raw)
            .limit(i32::try_from(limit.min(MAX_RECORDS)).unwrap_or(1000))
            .send()
            .await
            .map_err(|e| backend_error("get_records", self.what(), e))?;
        let records: Vec<Record> = out
            .records
            .unwrap_or_default()
            .iter()
            .filter_map(change::record)
            .collect();
        let behind = records.last().map(|r| {
            let millis = (Utc::now() - r.approximate_arrival).num_milliseconds();
            u64::try_from(millis).unwrap_or(0)
        });
        let child_shards = match &out.next_shard_iterator {
            Some(_) => Vec::new(),
            None => self.children(shard).await,
        };
        Ok(RecordBatch {
            records,
            next_iterator: out
                .next_shard_iterator
                .as_deref()
                .map(|raw| shards::tag(shard, raw)),
            millis_behind_latest: behind,
            child_shards,
        })
    }
}
