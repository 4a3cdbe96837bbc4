//! Where records come from: the [`ShardSource`] trait.
//!
//! It is the polling half of the Kinesis API, reduced to what a shard consumer needs. The
//! worker never sees SDK types: `kcl-aws` implements this trait on aws-sdk-kinesis and the
//! [`memory`](crate::memory) module implements it in process for tests.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::error::BackendError;
use crate::types::{HashKeyRange, Record, ShardId, StartingPosition};

/// A shard as listed by the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The shard id.
    pub id: ShardId,
    /// Parent shard (split) or parents (merge); empty for an original shard.
    pub parent_shard_ids: Vec<ShardId>,
    /// Hash keys this shard serves.
    pub hash_key_range: HashKeyRange,
    /// True once the shard was closed by a split or merge (it has an ending sequence number).
    pub closed: bool,
}

/// An opaque position for [`ShardSource::get_records`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIterator(pub String);

/// One `GetRecords` answer.
#[derive(Debug, Clone, Default)]
pub struct RecordBatch {
    /// The records, in sequence order.
    pub records: Vec<Record>,
    /// Where to read next; `None` once a closed shard has been read to its end.
    pub next_iterator: Option<ShardIterator>,
    /// How far the shard's newest record is ahead of this batch, if the source knows.
    pub millis_behind_latest: Option<u64>,
    /// At shard end: the shards that continue this one.
    pub child_shards: Vec<Shard>,
}

/// Lists shards and reads their records.
///
/// Implementations classify failures with [`ErrorKind`](crate::ErrorKind): throttling as
/// `Throttled`, an expired iterator as `ExpiredIterator`, a stream or shard that does not
/// exist as `NotFound`, and what retrying cannot fix as `Fatal`.
pub trait ShardSource: Send + Sync + 'static {
    /// Every shard of the stream, open and closed, with parents and hash-key ranges.
    fn list_shards(&self) -> impl Future<Output = Result<Vec<Shard>, BackendError>> + Send;

    /// An iterator on `shard` at `position`.
    fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> impl Future<Output = Result<ShardIterator, BackendError>> + Send;

    /// Up to `limit` records from `iterator`.
    fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> impl Future<Output = Result<RecordBatch, BackendError>> + Send;

    /// The time on the clock that stamps records' `approximate_arrival`, as near as this host
    /// can tell. The worker pins `LATEST` starts with it (see
    /// [`WorkerConfig::max_clock_skew`](crate::WorkerConfig::max_clock_skew)). Default: this
    /// host's clock, which is right for Kinesis on an NTP-synchronised host.
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}
