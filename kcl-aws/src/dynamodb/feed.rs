//! The lease table's change feed ([`kcl_core::lease::feed`]) from its DynamoDB stream.
//!
//! Under `Coordination::Leader` the leader and the standby follow every lease through the
//! table's stream instead of scanning the table every interval: stream reads are billed per
//! request (`GetRecords`, $0.02 per 100,000), not per row, so two observers cost a few
//! requests a second whatever the number of leases.
//!
//! - **Turning it on.** `table::ensure` enables a `NEW_IMAGE` stream on a table that has none
//!   (a table setting: KCL Java's rows and attributes are untouched, and KCL Java ignores the
//!   stream); [`StreamFeed::adopt`] then takes the stream's ARN from the table. A table that
//!   already streams `NEW_AND_OLD_IMAGES` is used as it is; one that streams keys or old
//!   images only cannot serve the feed, so its observers scan instead (said once, at start).
//! - **Small tables are read whole.** An eventually consistent read of a table of at most
//!   12 KB (3 × 4 KB, 1.5 read units, about 45 leases) costs $0.19 per million on demand,
//!   less than a `GetRecords` ($0.20 per million): while the last whole read of the table was
//!   that small, [`read`](StreamFeed::read) answers `Unavailable` and the observer reads the
//!   table instead. It follows the stream again once the table is over 12 KB, and goes back to
//!   whole reads only below 8 KB, so that a table near the line does not flap.
//! - **Position.** One cursor per stream shard: the shard iterator to read next (valid 15
//!   minutes; read every second), plus the stream's ARN under `stream`. A restart opens every
//!   open shard at `LATEST`; a shard that ends is dropped, and the shards that follow it are
//!   opened at `TRIM_HORIZON`, so no record in between is lost.
//! - **Failure.** An iterator that expired, trimmed records or a stream that is gone cannot be
//!   continued: the read restarts (and the observer reads the table once). Anything else is an
//!   error, after which the observer reads the table and restarts next time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::types::{AttributeValue, StreamViewType, TableDescription};
use aws_sdk_dynamodbstreams::types::{
    AttributeValue as StreamValue, OperationType, Record, ShardIteratorType,
};
use kcl_core::lease::feed::{Change, FeedPosition, FeedRead};
use kcl_core::lease::usage::{Operation, Usage};
use kcl_core::{BackendError, ErrorKind, ShardId};

use super::schema::{self, LEASE_KEY};
use super::unreadable::Unreadable;
use crate::error::backend_error;

const OPERATION: &str = "read_changes";
/// The position's entry holding the stream's ARN (stream shard ids start with `shardId-`).
const STREAM: &str = "stream";
/// `GetRecords` returns at most this many records; a full page is read again at once.
const PAGE: i32 = 1000;
/// At most this many pages per stream shard per read, so one read stays bounded.
const MAX_PAGES: usize = 10;
/// Above this size, a table is followed through its stream rather than read whole (see the
/// module docs)…
const FOLLOW_ABOVE: usize = 3 * 4096;
/// … and below this one, read whole again.
const READ_WHOLE_BELOW: usize = 2 * 4096;

/// Reads the stream of one lease table.
#[derive(Debug)]
pub(crate) struct StreamFeed {
    client: aws_sdk_dynamodbstreams::Client,
    table: String,
    /// The stream's ARN, once [`adopt`](Self::adopt) found a stream that shows new images.
    arn: Mutex<Option<String>>,
    /// The size of the table's rows at its last whole read.
    table_bytes: AtomicUsize,
    /// The store's unreadable rows, kept up to date between whole reads.
    unreadable: Arc<Unreadable>,
}

impl StreamFeed {
    pub(crate) fn new(
        client: aws_sdk_dynamodbstreams::Client,
        table: &str,
        unreadable: Arc<Unreadable>,
    ) -> Self {
        Self {
            client,
            table: table.to_owned(),
            arn: Mutex::new(None),
            table_bytes: AtomicUsize::new(0),
            unreadable,
        }
    }

    /// A whole read of the table found rows of `bytes` in all.
    pub(crate) fn table_read(&self, bytes: usize) {
        self.table_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Whether reading the table whole costs less than following its stream (see the module
    /// docs): `following` says whether the observer follows the stream now.
    fn read_whole(&self, following: bool) -> bool {
        let bytes = self.table_bytes.load(Ordering::Relaxed);
        if following {
            bytes < READ_WHOLE_BELOW
        } else {
            bytes <= FOLLOW_ABOVE
        }
    }

    fn arn(&self) -> Option<String> {
        self.arn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Remembers the stream of `table` if it can serve the feed (enabled, showing new images);
    /// returns whether it can. See the module docs.
    pub(crate) fn adopt(&self, table: &TableDescription) -> bool {
        let spec = table.stream_specification();
        let arn = table.latest_stream_arn();
        match (
            spec.map(|s| (s.stream_enabled(), s.stream_view_type())),
            arn,
        ) {
            (
                Some((true, Some(StreamViewType::NewImage | StreamViewType::NewAndOldImages))),
                Some(arn),
            ) => {
                *self.arn.lock().unwrap_or_else(PoisonError::into_inner) = Some(arn.to_owned());
                true
            }
            (Some((true, view)), _) => {
                tracing::warn!(
                    table = %self.table, view = ?view,
                    "the lease table's stream shows no new images; observers read the table instead"
                );
                false
            }
            _ => false,
        }
    }

    /// One read of the feed; see the module docs.
    pub(crate) async fn read(
        &self,
        from: Option<&FeedPosition>,
        usage: &Usage,
    ) -> Result<FeedRead, BackendError> {
        let Some(arn) = self.arn() else {
            return Ok(FeedRead::Unavailable);
        };
        if self.read_whole(from.is_some()) {
            return Ok(FeedRead::Unavailable);
        }
        let Some(from) = from.filter(|p| p.get(STREAM) == Some(arn.as_str())) else {
            return self.restart(&arn, usage).await;
        };
        let mut position = from.clone();
        let mut changes = Vec::new();
        let mut ended = false;
        for (shard, iterator) in from.iter().filter(|(p, _)| *p != STREAM) {
            match self.drain(iterator, &mut changes, usage).await {
                Ok(Some(next)) => position.set(shard, next),
                Ok(None) => {
                    position.remove(shard);
                    ended = true;
                }
                Err(e) if matches!(e.kind(), ErrorKind::ExpiredIterator | ErrorKind::NotFound) => {
                    tracing::debug!(error = %e, "the lease table's stream cannot go on; restarting");
                    return self.restart(&arn, usage).await;
                }
                Err(e) => return Err(e),
            }
        }
        if ended {
            // The shards that follow an ended one: from their start.
            for shard in self.open_shards(&arn, usage).await? {
                if position.get(&shard).is_none() {
                    let it = self.iterator(&arn, &shard, ShardIteratorType::TrimHorizon, usage);
                    let it = it.await?;
                    position.set(shard, it);
                }
            }
        }
        Ok(FeedRead::Changes(changes, position))
    }

    /// A new position: every open shard at `LATEST`.
    async fn restart(&self, arn: &str, usage: &Usage) -> Result<FeedRead, BackendError> {
        let mut position = FeedPosition::new();
        position.set(STREAM, arn);
        for shard in self.open_shards(arn, usage).await? {
            let it = self.iterator(arn, &shard, ShardIteratorType::Latest, usage);
            let it = it.await?;
            position.set(shard, it);
        }
        Ok(FeedRead::Restart(position))
    }

    /// Reads one stream shard from `iterator` into `changes`: the iterator to go on from, or
    /// `None` when the shard has ended.
    async fn drain(
        &self,
        iterator: &str,
        changes: &mut Vec<Change>,
        usage: &Usage,
    ) -> Result<Option<String>, BackendError> {
        let mut iterator = iterator.to_owned();
        for _ in 0..MAX_PAGES {
            let result = self
                .client
                .get_records()
                .shard_iterator(&iterator)
                .limit(PAGE)
                .send()
                .await;
            let rows = result.as_ref().map_or(0, |o| o.records().len());
            count(usage, &result, rows);
            let out = result.map_err(|e| backend_error(OPERATION, self.what(), e))?;
            changes.extend(out.records().iter().filter_map(|r| self.change(r)));
            match out.next_shard_iterator {
                Some(next) if rows == PAGE as usize => iterator = next,
                next => return Ok(next),
            }
        }
        Ok(Some(iterator))
    }

    /// The ids of the stream's open shards (no ending sequence number).
    async fn open_shards(&self, arn: &str, usage: &Usage) -> Result<Vec<String>, BackendError> {
        let mut open = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let result = self
                .client
                .describe_stream()
                .stream_arn(arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await;
            count(usage, &result, 0);
            let out = result.map_err(|e| backend_error(OPERATION, self.what(), e))?;
            let Some(description) = out.stream_description else {
                return Ok(open);
            };
            open.extend(description.shards().iter().filter_map(|s| {
                let ended = s
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_some();
                s.shard_id().filter(|_| !ended).map(str::to_owned)
            }));
            match description.last_evaluated_shard_id {
                Some(last) => start = Some(last),
                None => return Ok(open),
            }
        }
    }

    async fn iterator(
        &self,
        arn: &str,
        shard: &str,
        kind: ShardIteratorType,
        usage: &Usage,
    ) -> Result<String, BackendError> {
        let result = self
            .client
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard)
            .shard_iterator_type(kind)
            .send()
            .await;
        count(usage, &result, 0);
        let out = result.map_err(|e| backend_error(OPERATION, self.what(), e))?;
        out.shard_iterator.ok_or_else(|| {
            BackendError::new(
                ErrorKind::Retryable,
                OPERATION,
                format!("{}: no iterator for shard {shard}", self.what()),
            )
        })
    }

    /// A stream record as a change; a row that cannot be parsed is skipped and noted as
    /// unreadable, as in a scan.
    fn change(&self, record: &Record) -> Option<Change> {
        let data = record.dynamodb()?;
        if record.event_name() == Some(&OperationType::Remove) {
            let key = data.keys()?.get(LEASE_KEY)?;
            return match key {
                StreamValue::S(key) => {
                    self.unreadable.gone(key);
                    Some(Change::Deleted(ShardId::new(key.clone())))
                }
                _ => None,
            };
        }
        let item: HashMap<String, AttributeValue> = data
            .new_image()?
            .iter()
            .filter_map(|(name, value)| Some((name.clone(), convert(value)?)))
            .collect();
        if schema::is_foreign_entity(&item) {
            return None;
        }
        match schema::from_item(&item) {
            Ok(lease) => {
                self.unreadable.gone(lease.key.as_str());
                Some(Change::Written(lease))
            }
            Err(error) => {
                let key = schema::key_of(&item);
                tracing::debug!(table = %self.table, lease_key = key.unwrap_or("<none>"), %error, "lease row in the stream cannot be parsed; skipped");
                self.unreadable.found(key, error.to_string());
                None
            }
        }
    }

    fn what(&self) -> String {
        format!("stream of lease table {}", self.table)
    }
}

/// Counts a streams request that reached the service; billed per request, not in units.
fn count<T, E, R>(
    usage: &Usage,
    result: &Result<T, aws_sdk_dynamodbstreams::error::SdkError<E, R>>,
    rows: usize,
) {
    use aws_sdk_dynamodbstreams::error::SdkError;
    if matches!(result, Ok(_) | Err(SdkError::ServiceError(_))) {
        usage.record_read(Operation::ReadChanges, rows as u64, 0.0, 0.0);
    }
}

/// A stream image's value as the table's client types it (the two SDKs have one type each).
fn convert(value: &StreamValue) -> Option<AttributeValue> {
    Some(match value {
        StreamValue::S(s) => AttributeValue::S(s.clone()),
        StreamValue::N(n) => AttributeValue::N(n.clone()),
        StreamValue::B(b) => AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(b.as_ref())),
        StreamValue::Ss(v) => AttributeValue::Ss(v.clone()),
        StreamValue::Ns(v) => AttributeValue::Ns(v.clone()),
        StreamValue::Bs(v) => AttributeValue::Bs(
            v.iter()
                .map(|b| aws_sdk_dynamodb::primitives::Blob::new(b.as_ref()))
                .collect(),
        ),
        StreamValue::M(m) => AttributeValue::M(
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), convert(v)?)))
                .collect(),
        ),
        StreamValue::L(l) => AttributeValue::L(l.iter().filter_map(convert).collect()),
        StreamValue::Null(n) => AttributeValue::Null(*n),
        StreamValue::Bool(b) => AttributeValue::Bool(*b),
        _ => return None,
    })
}
