//! One worker over several streams, as KCL Java's multi-stream mode.
//!
//! Three pieces turn a single-stream worker into a multi-stream one, without the worker
//! knowing:
//! - [`MultiStreamSource`] is a [`ShardSource`](crate::ShardSource) over every stream a
//!   [`StreamTracker`] names. The "shards" it lists are keyed `account:stream:creationEpoch:
//!   shardId` — KCL Java's multi-stream lease keys — so the lease table, balancing, lineage,
//!   failover and the simulation's invariants treat all streams' leases as one pool, and a
//!   KCL Java multi-stream table is picked up with its checkpoints.
//! - [`StreamFactories`] picks a processor factory by the stream in the key; each stream's
//!   processors may be of their own type.
//! - The tracker is asked for its streams at every shard sync. A stream that appears gets
//!   leases at its own [`StreamConfig::initial_position`]; a stream that disappears keeps
//!   being read for [`MultiStreamSource::removal_grace`] (it may come back: a deploy that
//!   briefly lists fewer streams must not lose their place), then its leases are deleted, so
//!   that their holders stop (`lease_lost`) and nobody takes them again. The same goes for a
//!   stream whose leases are in the table when this worker first runs the shard sync (at
//!   start-up, or when it becomes the leader) but which its tracker does not name: left out
//!   of the configuration across a restart, as KCL Java's deferred deletion finds former
//!   streams at start-up. A stream that shows up in the table later was added by a worker
//!   with a newer tracker and is left alone. During a deploy that changes the list, workers
//!   disagree: keep the grace longer than the deploy.
//!
//! A stream is named by [`StreamId`]: account, name and creation time, as KCL Java's
//! `StreamIdentifier`, so that a stream deleted and created again under the same name is a
//! new stream with new leases, not the old one's checkpoints applied to new sequence numbers.
//!
//! ```
//! use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
//! use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId, Streams};
//! use kcl_core::{InitialPosition, Worker};
//!
//! let orders = StreamId::new("123456789012", "orders", 1_700_000_000);
//! let clicks = StreamId::new("123456789012", "clicks", 1_700_000_100);
//! let streams = Streams::default();
//! streams.add(orders.clone(), InitialPosition::TrimHorizon);
//! streams.add(clicks.clone(), InitialPosition::Latest);
//! // One source per stream (kcl-aws: a `KinesisShardSource` on the stream's name).
//! let source = MultiStreamSource::new(streams.clone(), |_: &StreamId| MemoryStream::new(2));
//! let factories = StreamFactories::new()
//!     .stream(orders, |_shard: &kcl_core::ShardId| IdleProcessor)
//!     .stream(clicks, |_shard: &kcl_core::ShardId| IdleProcessor);
//! let worker = Worker::builder(source, MemoryLeaseStore::new())
//!     .build_with(factories)
//!     .expect("valid config");
//! // `streams.add(…)` and `streams.remove(…)` while it runs.
//! # drop(worker);
//! ```

mod factory;
mod source;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

pub use factory::{BoxProcessor, StreamFactories};
pub use source::MultiStreamSource;

use crate::error::BackendError;
use crate::types::{InitialPosition, ShardId};

/// A stream as KCL Java identifies it in multi-stream mode: `account:name:creationEpoch`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId {
    /// The AWS account that owns the stream.
    pub account: String,
    /// The stream name.
    pub name: String,
    /// When the stream was created, in seconds since the Unix epoch.
    pub creation_epoch: u64,
}

impl StreamId {
    /// A stream id from its parts.
    pub fn new(account: impl Into<String>, name: impl Into<String>, creation_epoch: u64) -> Self {
        Self {
            account: account.into(),
            name: name.into(),
            creation_epoch,
        }
    }

    /// Parses `account:name:creationEpoch`, as KCL Java serialises it.
    ///
    /// ```
    /// let id = kcl_core::multi_stream::StreamId::parse("123456789012:orders:1700000000");
    /// assert_eq!(id.map(|i| i.name), Some("orders".to_owned()));
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split(':');
        let (account, name, epoch) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || account.is_empty() || name.is_empty() {
            return None;
        }
        Some(Self::new(account, name, epoch.parse().ok()?))
    }

    /// The lease key of `shard` of this stream: `account:name:creationEpoch:shardId`.
    pub fn lease_key(&self, shard: &ShardId) -> ShardId {
        ShardId::new(format!("{self}:{shard}"))
    }

    /// The stream and shard of a multi-stream lease key; `None` for any other key.
    pub fn split_key(key: &ShardId) -> Option<(Self, ShardId)> {
        let (stream, shard) = key.as_str().rsplit_once(':')?;
        if shard.is_empty() {
            return None;
        }
        Some((Self::parse(stream)?, ShardId::new(shard)))
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.account, self.name, self.creation_epoch)
    }
}

/// A stream to consume and where its shards without a checkpoint start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// The stream.
    pub id: StreamId,
    /// Where its new leases start.
    pub initial_position: InitialPosition,
}

/// Says which streams to consume, as KCL Java's `MultiStreamTracker`. Asked at every shard
/// sync; a failure is retried at the next one, with the streams consumed as they were.
pub trait StreamTracker: Send + Sync + 'static {
    /// The streams to consume now.
    fn streams(&self) -> impl Future<Output = Result<Vec<StreamConfig>, BackendError>> + Send;
}

/// A tracker the application changes while the worker runs: clones share the list.
#[derive(Debug, Clone, Default)]
pub struct Streams(Arc<Mutex<BTreeMap<StreamId, InitialPosition>>>);

impl Streams {
    /// Consumes `id` from the next shard sync on (or changes where its new leases start).
    pub fn add(&self, id: StreamId, initial_position: InitialPosition) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, initial_position);
    }

    /// Stops consuming `id` (after the source's removal grace); false if it was not there.
    pub fn remove(&self, id: &StreamId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
            .is_some()
    }

    /// The streams, in id order.
    pub fn list(&self) -> Vec<StreamConfig> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, p)| StreamConfig {
                id: id.clone(),
                initial_position: *p,
            })
            .collect()
    }
}

impl StreamTracker for Streams {
    async fn streams(&self) -> Result<Vec<StreamConfig>, BackendError> {
        Ok(self.list())
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_kcl_javas() {
        let id = StreamId::new("123456789012", "orders", 1_700_000_000);
        let key = id.lease_key(&ShardId::new("shardId-000000000007"));
        assert_eq!(
            key.as_str(),
            "123456789012:orders:1700000000:shardId-000000000007"
        );
        let (stream, shard) = StreamId::split_key(&key).expect("a multi-stream key");
        assert_eq!((stream, shard.as_str()), (id, "shardId-000000000007"));
        for bad in [
            "shardId-000000000007",
            "a:b:shardId-1",
            "a:b:x:shardId-1",
            ":b:1:s",
            "a:b:1:",
        ] {
            assert_eq!(StreamId::split_key(&ShardId::new(bad)), None, "{bad}");
        }
    }
}
