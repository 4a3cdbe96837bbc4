//! [`MultiStreamSource`]: many streams as one source of shards keyed by stream.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt as _;
use tokio::time::Instant;

use super::{StreamConfig, StreamId, StreamTracker};
use crate::error::{BackendError, ErrorKind};
use crate::source::{RecordBatch, Shard, ShardIterator, ShardSource, Subscription};
use crate::types::{ConsumerId, InitialPosition, ShardId, StartingPosition};

/// Separates the stream from the inner iterator in the iterators this source hands out; a
/// [`StreamId`] never contains it.
const ITERATOR_SEPARATOR: char = '|';

/// A [`ShardSource`] over every stream a tracker names, each read through its own source;
/// see the [module docs](super).
pub struct MultiStreamSource<S, T, M> {
    tracker: T,
    make: M,
    grace: Duration,
    state: Mutex<State<S>>,
}

impl<S, T, M> std::fmt::Debug for MultiStreamSource<S, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiStreamSource")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

struct State<S> {
    /// Every stream seen, with its source: kept after removal, to read until the grace ends.
    sources: BTreeMap<StreamId, Arc<S>>,
    /// Where the tracked streams' new leases start.
    positions: BTreeMap<StreamId, InitialPosition>,
    /// Streams the tracker stopped naming, since when (this process's monotonic clock).
    removed: BTreeMap<StreamId, Instant>,
    /// Each stream's fan-out consumer, registered at its first subscription.
    consumers: BTreeMap<StreamId, ConsumerId>,
    /// Where this source is in its start-up scan of the lease table.
    scan: Scan,
}

/// The start-up scan: streams with leases in the table that the tracker does not name are
/// taken for former streams only in the first pass over the table after the first listing,
/// as KCL Java looks for them at start-up only. A stream showing up in the table later was
/// added by a worker whose tracker is newer than ours (a deploy under way): not ours to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// The tracker not asked yet: every stream looks untracked.
    NotListed,
    /// Listed; the table not looked at since.
    Listed,
    /// The first pass over the table.
    Scanning,
    /// Over: listed again after the first pass.
    Done,
}

impl<S, T, M> MultiStreamSource<S, T, M>
where
    S: ShardSource,
    T: super::StreamTracker,
    M: Fn(&StreamId) -> S + Send + Sync + 'static,
{
    /// A source over `tracker`'s streams; `make` builds each stream's own source.
    pub fn new(tracker: T, make: M) -> Self {
        Self {
            tracker,
            make,
            grace: Duration::from_secs(300),
            state: Mutex::new(State {
                sources: BTreeMap::new(),
                positions: BTreeMap::new(),
                removed: BTreeMap::new(),
                consumers: BTreeMap::new(),
                scan: Scan::NotListed,
            }),
        }
    }

    /// How long a stream the tracker no longer names is still read before its leases are
    /// deleted. Default 5 minutes (KCL Java's deferred deletion has no default: it is the
    /// wait period of `AutoDetectionAndDeferredDeletionStrategy`).
    #[must_use]
    pub fn removal_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The source of `stream`, made at its first use.
    fn source(&self, stream: &StreamId) -> Arc<S> {
        self.lock()
            .sources
            .entry(stream.clone())
            .or_insert_with(|| Arc::new((self.make)(stream)))
            .clone()
    }

    /// The stream of a key, and the source and shard id to read it with.
    fn route(&self, key: &ShardId, operation: &'static str) -> Result<Route<S>, BackendError> {
        let (stream, shard) = StreamId::split_key(key).ok_or_else(|| {
            BackendError::new(
                ErrorKind::Fatal,
                operation,
                format!(
                    "{key} is not a multi-stream lease key (account:stream:creationEpoch:shardId)"
                ),
            )
        })?;
        Ok(Route {
            source: self.source(&stream),
            stream,
            shard,
        })
    }

    /// Notes which streams the tracker names now.
    fn track(&self, configs: &[StreamConfig]) {
        let now = Instant::now();
        let mut s = self.lock();
        s.scan = match s.scan {
            Scan::NotListed | Scan::Listed => Scan::Listed,
            Scan::Scanning | Scan::Done => Scan::Done,
        };
        let named: BTreeMap<&StreamId, InitialPosition> = configs
            .iter()
            .map(|c| (&c.id, c.initial_position))
            .collect();
        for (id, position) in &named {
            if s.removed.remove(*id).is_some() {
                tracing::info!(stream = %id, "stream tracked again");
            } else if !s.positions.contains_key(*id) {
                tracing::info!(stream = %id, "stream tracked");
            }
            s.positions.insert((*id).clone(), *position);
        }
        let gone: Vec<StreamId> = s
            .positions
            .keys()
            .filter(|id| !named.contains_key(id))
            .cloned()
            .collect();
        for id in gone {
            s.positions.remove(&id);
            tracing::info!(stream = %id, grace = ?self.grace, "stream no longer tracked: its leases go after the grace period");
            s.removed.insert(id, now);
        }
    }
}

struct Route<S> {
    source: Arc<S>,
    stream: StreamId,
    shard: ShardId,
}

/// A shard of `stream` as this source lists it: keyed, parents and all.
fn keyed(stream: &StreamId, shard: &Shard) -> Shard {
    Shard {
        id: stream.lease_key(&shard.id),
        parent_shard_ids: shard
            .parent_shard_ids
            .iter()
            .map(|p| stream.lease_key(p))
            .collect(),
        hash_key_range: shard.hash_key_range,
        closed: shard.closed,
    }
}

impl<S, T, M> ShardSource for MultiStreamSource<S, T, M>
where
    S: ShardSource,
    T: StreamTracker,
    M: Fn(&StreamId) -> S + Send + Sync + 'static,
{
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        let configs = self.tracker.streams().await?;
        self.track(&configs);
        let mut all = Vec::new();
        for config in &configs {
            match self.source(&config.id).list_shards().await {
                Ok(shards) => all.extend(shards.iter().map(|s| keyed(&config.id, s))),
                // Deleted, or not created yet: the others go on.
                Err(error) if error.kind() == ErrorKind::NotFound => {
                    tracing::warn!(stream = %config.id, %error, "a tracked stream cannot be listed");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(all)
    }

    async fn shard_iterator(
        &self,
        key: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        let route = self.route(key, "shard_iterator")?;
        let inner = route.source.shard_iterator(&route.shard, position).await?;
        Ok(ShardIterator(format!(
            "{}{ITERATOR_SEPARATOR}{}",
            route.stream, inner.0
        )))
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        let stream = iterator
            .0
            .split_once(ITERATOR_SEPARATOR)
            .and_then(|(stream, inner)| Some((StreamId::parse(stream)?, inner)));
        let Some((stream, inner)) = stream else {
            return Err(BackendError::new(
                ErrorKind::Fatal,
                "get_records",
                "an iterator this source did not hand out",
            ));
        };
        let mut batch = self
            .source(&stream)
            .get_records(&ShardIterator(inner.to_owned()), limit)
            .await?;
        batch.next_iterator = batch
            .next_iterator
            .map(|it| ShardIterator(format!("{stream}{ITERATOR_SEPARATOR}{}", it.0)));
        batch.child_shards = batch
            .child_shards
            .iter()
            .map(|c| keyed(&stream, c))
            .collect();
        Ok(batch)
    }

    /// Registers the consumer on every tracked stream (each stream has its own).
    async fn register_consumer(&self, name: &str) -> Result<ConsumerId, BackendError> {
        let streams: Vec<StreamId> = self
            .tracker
            .streams()
            .await?
            .into_iter()
            .map(|c| c.id)
            .collect();
        for stream in streams {
            let id = self.source(&stream).register_consumer(name).await?;
            self.lock().consumers.insert(stream, id);
        }
        Ok(ConsumerId::new(name))
    }

    /// Subscribes with the stream's own consumer, registering it first on a stream added
    /// since the worker started.
    async fn subscribe(
        &self,
        consumer: &ConsumerId,
        key: &ShardId,
        position: &StartingPosition,
    ) -> Result<Subscription, BackendError> {
        let route = self.route(key, "subscribe")?;
        let known = self.lock().consumers.get(&route.stream).cloned();
        let inner_consumer = match known {
            Some(id) => id,
            None => {
                let id = route.source.register_consumer(consumer.as_str()).await?;
                self.lock()
                    .consumers
                    .insert(route.stream.clone(), id.clone());
                id
            }
        };
        let events = route
            .source
            .subscribe(&inner_consumer, &route.shard, position)
            .await?;
        let stream = route.stream;
        Ok(Box::pin(events.map(move |event| {
            event.map(|mut e| {
                e.child_shards = e.child_shards.iter().map(|c| keyed(&stream, c)).collect();
                e
            })
        })))
    }

    fn initial_position(&self, key: &ShardId) -> Option<InitialPosition> {
        let (stream, _) = StreamId::split_key(key)?;
        self.lock().positions.get(&stream).copied()
    }

    /// A lease of a stream the tracker stopped naming, or did not name when this source
    /// first looked at the table (left out of the configuration across a restart: KCL Java
    /// finds those at start-up too), once the grace period has passed since.
    fn is_retired(&self, key: &ShardId) -> bool {
        let Some((stream, _)) = StreamId::split_key(key) else {
            return false;
        };
        let mut s = self.lock();
        if s.scan == Scan::Listed {
            s.scan = Scan::Scanning;
        }
        if s.scan == Scan::Scanning
            && !s.positions.contains_key(&stream)
            && !s.removed.contains_key(&stream)
        {
            tracing::info!(stream = %stream, grace = ?self.grace, "stream in the lease table but not tracked: its leases go after the grace period");
            s.removed.insert(stream.clone(), Instant::now());
        }
        s.removed
            .get(&stream)
            .is_some_and(|since| since.elapsed() >= self.grace)
    }

    /// The clock of `key`'s stream. (It used to be any stream's, or this host's before one
    /// was read: a worker that had read none pinned its first `LATEST` start on its own
    /// clock, which the simulation's stream clock showed wrong.)
    fn now(&self, key: &ShardId) -> DateTime<Utc> {
        match self.route(key, "now") {
            Ok(route) => route.source.now(&route.shard),
            Err(_) => Utc::now(),
        }
    }
}
