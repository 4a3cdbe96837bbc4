//! Where records come from: the [`ShardSource`] trait.
//!
//! It is the Kinesis API reduced to what a shard consumer needs: polling (`GetShardIterator`,
//! `GetRecords`) and, for [`Retrieval::FanOut`](crate::Retrieval::FanOut), enhanced fan-out
//! (`RegisterStreamConsumer`, `SubscribeToShard`). The worker never sees SDK types: `kcl-aws`
//! implements this trait on aws-sdk-kinesis and the [`memory`](crate::memory) module
//! implements it in process for tests and the simulation.
//!
//! A subscription is a stream of events that the source ends by itself (Kinesis ends each
//! after 5 minutes); the worker then subscribes again after the last event's continuation
//! sequence number, so a renewal neither skips nor repeats a record. It pulls the next event
//! only when the last one found room in its prefetch buffer: a slow processor slows the
//! subscription down (HTTP/2 flow control on Kinesis) instead of growing memory.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;

use crate::error::{BackendError, ErrorKind};
use crate::types::{
    ConsumerId, HashKeyRange, InitialPosition, Record, SequenceNumber, ShardId, StartingPosition,
};

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

/// One event of a [`Subscription`], as `SubscribeToShard` pushes it.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionEvent {
    /// The records, in sequence order; empty in a heartbeat event.
    pub records: Vec<Record>,
    /// A new subscription continues after this sequence number. `None` once a closed shard
    /// has been read to its end; `child_shards` then says which shards continue it.
    pub continuation: Option<SequenceNumber>,
    /// How far the shard's newest record is ahead of this event, if the source knows.
    pub millis_behind_latest: Option<u64>,
    /// At shard end: the shards that continue this one.
    pub child_shards: Vec<Shard>,
}

/// The events of one subscription to a shard, in order. It ends (`None`) when the source
/// ends it, which Kinesis does every 5 minutes; an error ends it too.
pub type Subscription = BoxStream<'static, Result<SubscriptionEvent, BackendError>>;

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

    /// Registers the enhanced fan-out consumer `name` on the stream, or finds it if it is
    /// registered already, and returns once it can subscribe (ACTIVE on Kinesis). Called once
    /// when a worker in [`Retrieval::FanOut`](crate::Retrieval::FanOut) mode starts; a
    /// transient error is retried. The default: the source cannot do fan-out (`Fatal`).
    fn register_consumer(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<ConsumerId, BackendError>> + Send {
        let error = no_fan_out("register_consumer", name);
        async move { Err(error) }
    }

    /// Subscribes `consumer` to `shard` from `position`. Throttling (Kinesis allows one
    /// subscription per shard and consumer every 5 seconds) is `Throttled`, like any read's.
    /// The default: the source cannot do fan-out (`Fatal`).
    fn subscribe(
        &self,
        consumer: &ConsumerId,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> impl Future<Output = Result<Subscription, BackendError>> + Send {
        let _ = (shard, position);
        let error = no_fan_out("subscribe", consumer.as_str());
        async move { Err(error) }
    }

    /// Where a new lease for `shard` starts, when it is not the worker's
    /// [`initial_position`](crate::WorkerConfig::initial_position): a
    /// [`MultiStreamSource`](crate::multi_stream::MultiStreamSource) says each stream's.
    /// Default: `None`.
    fn initial_position(&self, shard: &ShardId) -> Option<InitialPosition> {
        let _ = shard;
        None
    }

    /// True once `shard`'s lease is to be deleted although the shard was not processed to
    /// its end: a [`MultiStreamSource`](crate::multi_stream::MultiStreamSource) says so of
    /// the shards of a stream removed from its tracker longer than the grace period. The
    /// shard sync deletes such leases (their holders then lose them). Default: false.
    fn is_retired(&self, shard: &ShardId) -> bool {
        let _ = shard;
        false
    }

    /// The time on the clock that stamps the `approximate_arrival` of `shard`'s records, as
    /// near as this host can tell. The worker pins `LATEST` starts with it (see
    /// [`WorkerConfig::max_clock_skew`](crate::WorkerConfig::max_clock_skew)). Default: this
    /// host's clock, which is right for Kinesis on an NTP-synchronised host.
    fn now(&self, shard: &ShardId) -> DateTime<Utc> {
        let _ = shard;
        Utc::now()
    }
}

fn no_fan_out(operation: &'static str, consumer: &str) -> BackendError {
    BackendError::new(
        ErrorKind::Fatal,
        operation,
        format!("consumer {consumer}: this source does not support enhanced fan-out"),
    )
}
