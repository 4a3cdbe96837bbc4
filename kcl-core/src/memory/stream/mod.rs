//! An in-memory Kinesis stream: shards with hash-key ranges, splits and merges, and shard
//! iterators that end a closed shard with its children, as Kinesis does; and enhanced
//! fan-out subscriptions ([`subscription`]) with Kinesis's lifetime and throttling rules.

mod subscription;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use super::faults::Faults;
use crate::error::{BackendError, ErrorKind};
use crate::source::{RecordBatch, Shard, ShardIterator, ShardSource, Subscription};
use crate::types::{ConsumerId, HashKeyRange, Record, SequenceNumber, ShardId, StartingPosition};

#[derive(Debug)]
struct MemShard {
    shard: Shard,
    records: Vec<Record>,
    children: Vec<ShardId>,
    /// Below every record's sequence number: the continuation of a subscription that has
    /// seen none.
    starting: SequenceNumber,
}

/// What one read from a shard found.
#[derive(Debug)]
struct Read {
    records: Vec<Record>,
    /// The index after the last record read.
    next: usize,
    /// The sequence number before `next` (or the shard's starting one).
    continuation: SequenceNumber,
    millis_behind_latest: Option<u64>,
    /// At the end of a closed shard: its children.
    end: Option<Vec<Shard>>,
}

#[derive(Debug)]
struct State {
    shards: BTreeMap<ShardId, MemShard>,
    next_shard: u32,
    next_sequence: u128,
    wall: DateTime<Utc>,
    start: Instant,
    /// Per shard, the index of the first record the first iterator opened on it pointed at.
    first_open: BTreeMap<ShardId, usize>,
    /// When each consumer last subscribed to each shard.
    subscribed: BTreeMap<(ConsumerId, ShardId), Instant>,
    /// How long a subscription lasts.
    subscription_lifetime: Duration,
}

impl State {
    fn add_shard(&mut self, parents: Vec<ShardId>, range: HashKeyRange) -> ShardId {
        let id = ShardId::new(format!("shardId-{:012}", self.next_shard));
        self.next_shard += 1;
        let shard = Shard {
            id: id.clone(),
            parent_shard_ids: parents,
            hash_key_range: range,
            closed: false,
        };
        let starting = sequence(self.next_sequence - 1);
        self.shards.insert(
            id.clone(),
            MemShard {
                shard,
                records: Vec::new(),
                children: Vec::new(),
                starting,
            },
        );
        id
    }

    /// The shard, or `NotFound` as Kinesis says it.
    fn shard(&self, id: &ShardId, operation: &'static str) -> Result<&MemShard, BackendError> {
        self.shards.get(id).ok_or_else(|| {
            BackendError::new(ErrorKind::NotFound, operation, format!("no shard {id}"))
        })
    }

    /// Where an iterator or subscription at `position` starts in `shard`, and notes the first.
    fn start_index(
        &mut self,
        shard: &ShardId,
        position: &StartingPosition,
        operation: &'static str,
    ) -> Result<usize, BackendError> {
        let m = self.shard(shard, operation)?;
        let index = match position {
            StartingPosition::TrimHorizon => 0,
            StartingPosition::Latest => m.records.len(),
            StartingPosition::AtTimestamp(t) => {
                m.records.partition_point(|r| r.approximate_arrival < *t)
            }
            StartingPosition::AtSequence(q) => {
                m.records.partition_point(|r| r.sequence_number < *q)
            }
            StartingPosition::AfterSequence(q) => {
                m.records.partition_point(|r| r.sequence_number <= *q)
            }
        };
        self.first_open.entry(shard.clone()).or_insert(index);
        Ok(index)
    }

    /// Up to `limit` records of `shard` from `index`.
    fn read(
        &self,
        shard: &ShardId,
        index: usize,
        limit: usize,
        operation: &'static str,
    ) -> Result<Read, BackendError> {
        let m = self.shard(shard, operation)?;
        let start = index.min(m.records.len());
        let end = start.saturating_add(limit).min(m.records.len());
        let records = m.records[start..end].to_vec();
        let at_end = end == m.records.len();
        let millis_behind_latest = match (records.last(), m.records.last()) {
            (Some(last), Some(newest)) if !at_end => u64::try_from(
                (newest.approximate_arrival - last.approximate_arrival).num_milliseconds(),
            )
            .ok(),
            _ => Some(0),
        };
        let end_of_shard = (m.shard.closed && at_end).then(|| {
            m.children
                .iter()
                .filter_map(|c| self.shards.get(c))
                .map(|c| c.shard.clone())
                .collect()
        });
        let continuation = match end.checked_sub(1) {
            Some(last) => m.records[last].sequence_number.clone(),
            None => m.starting.clone(),
        };
        Ok(Read {
            records,
            next: end,
            continuation,
            millis_behind_latest,
            end: end_of_shard,
        })
    }

    fn now(&self) -> DateTime<Utc> {
        self.wall + Instant::now().saturating_duration_since(self.start)
    }

    fn open(&mut self, id: &ShardId) -> Result<&mut MemShard, String> {
        match self.shards.get_mut(id) {
            Some(s) if !s.shard.closed => Ok(s),
            Some(_) => Err(format!("{id} is closed")),
            None => Err(format!("{id} does not exist")),
        }
    }

    fn close(&mut self, id: &ShardId, children: &[ShardId]) {
        if let Some(s) = self.shards.get_mut(id) {
            s.shard.closed = true;
            s.children = children.to_vec();
        }
    }
}

/// An in-memory [`ShardSource`]. Clones share the stream; see [`client`](Self::client).
#[derive(Debug, Clone)]
pub struct MemoryStream {
    state: Arc<Mutex<State>>,
    faults: Faults,
    client: Arc<str>,
    /// Woken by every put and reshard: subscriptions push what arrived.
    arrivals: Arc<Notify>,
}

impl MemoryStream {
    /// A stream of `shards` open shards splitting the key space evenly, without faults.
    pub fn new(shards: u32) -> Self {
        Self::with_faults(shards, Faults::default())
    }

    /// A stream whose calls go through `faults`.
    pub fn with_faults(shards: u32, faults: Faults) -> Self {
        let mut state = State {
            shards: BTreeMap::new(),
            next_shard: 0,
            next_sequence: 1_000,
            wall: Utc::now(),
            start: Instant::now(),
            first_open: BTreeMap::new(),
            subscribed: BTreeMap::new(),
            subscription_lifetime: Duration::from_secs(300),
        };
        let n = u128::from(shards.max(1));
        let width = u128::MAX / n;
        for i in 0..n {
            let start = i * width;
            let end = if i + 1 == n {
                u128::MAX
            } else {
                (i + 1) * width - 1
            };
            state.add_shard(Vec::new(), HashKeyRange { start, end });
        }
        Self {
            state: Arc::new(Mutex::new(state)),
            faults,
            client: Arc::from("default"),
            arrivals: Arc::new(Notify::new()),
        }
    }

    /// A handle on the same stream whose calls are made as `client`.
    #[must_use]
    pub fn client(&self, client: &str) -> Self {
        Self {
            state: self.state.clone(),
            faults: self.faults.clone(),
            client: Arc::from(client),
            arrivals: self.arrivals.clone(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a record to the open shard serving `partition_key`'s hash (never faulted).
    pub fn put(&self, partition_key: &str, data: impl Into<Bytes>) -> Record {
        let key = hash_key(partition_key);
        let mut s = self.lock();
        let now = s.now();
        let sequence = s.next_sequence;
        s.next_sequence += 1;
        let record = Record {
            data: data.into(),
            partition_key: partition_key.to_owned(),
            sequence_number: self::sequence(sequence),
            sub_sequence_number: 0,
            approximate_arrival: now,
            explicit_hash_key: None,
        };
        let shard = s
            .shards
            .values_mut()
            .find(|m| !m.shard.closed && m.shard.hash_key_range.contains(key));
        // The open shards always cover the whole key space.
        if let Some(shard) = shard {
            shard.records.push(record.clone());
        }
        drop(s);
        self.arrivals.notify_waiters();
        record
    }

    /// The shard a record with this partition key goes to now.
    pub fn shard_for(&self, partition_key: &str) -> Option<ShardId> {
        let key = hash_key(partition_key);
        self.lock()
            .shards
            .values()
            .find(|m| !m.shard.closed && m.shard.hash_key_range.contains(key))
            .map(|m| m.shard.id.clone())
    }

    /// Splits an open shard at the middle of its range into two children.
    pub fn split(&self, id: &ShardId) -> Result<[ShardId; 2], String> {
        let mut s = self.lock();
        let range = s.open(id)?.shard.hash_key_range;
        if range.start == range.end {
            return Err(format!("{id} serves one hash key and cannot be split"));
        }
        let mid = range.start + (range.end - range.start) / 2;
        let a = s.add_shard(
            vec![id.clone()],
            HashKeyRange {
                start: range.start,
                end: mid,
            },
        );
        let b = s.add_shard(
            vec![id.clone()],
            HashKeyRange {
                start: mid + 1,
                end: range.end,
            },
        );
        s.close(id, &[a.clone(), b.clone()]);
        drop(s);
        self.arrivals.notify_waiters();
        Ok([a, b])
    }

    /// Closes an open shard and opens one child over the same range, as DynamoDB Streams
    /// rolls its shards over every few hours (a shard with one parent and one child).
    pub fn roll_over(&self, id: &ShardId) -> Result<ShardId, String> {
        let mut s = self.lock();
        let range = s.open(id)?.shard.hash_key_range;
        let child = s.add_shard(vec![id.clone()], range);
        s.close(id, std::slice::from_ref(&child));
        drop(s);
        self.arrivals.notify_waiters();
        Ok(child)
    }

    /// Merges two open shards with adjacent ranges into one child.
    pub fn merge(&self, a: &ShardId, b: &ShardId) -> Result<ShardId, String> {
        let mut s = self.lock();
        let ra = s.open(a)?.shard.hash_key_range;
        let rb = s.open(b)?.shard.hash_key_range;
        let adjacent =
            ra.end.checked_add(1) == Some(rb.start) || rb.end.checked_add(1) == Some(ra.start);
        if !adjacent {
            return Err(format!("{a} and {b} are not adjacent"));
        }
        let range = HashKeyRange {
            start: ra.start.min(rb.start),
            end: ra.end.max(rb.end),
        };
        let child = s.add_shard(vec![a.clone(), b.clone()], range);
        s.close(a, std::slice::from_ref(&child));
        s.close(b, std::slice::from_ref(&child));
        drop(s);
        self.arrivals.notify_waiters();
        Ok(child)
    }

    /// Removes a closed shard and its records from the stream, as Kinesis does once a closed
    /// shard's records have all aged out of the retention period.
    pub fn age_out(&self, id: &ShardId) -> Result<(), String> {
        let mut s = self.lock();
        match s.shards.get(id) {
            Some(m) if m.shard.closed => {
                s.shards.remove(id);
                Ok(())
            }
            Some(_) => Err(format!("{id} is open: only closed shards age out")),
            None => Err(format!("{id} does not exist")),
        }
    }

    /// Every shard, as `ListShards` would return it.
    pub fn shards(&self) -> Vec<Shard> {
        self.lock()
            .shards
            .values()
            .map(|m| m.shard.clone())
            .collect()
    }

    /// The open shards.
    pub fn open_shards(&self) -> Vec<ShardId> {
        self.lock()
            .shards
            .values()
            .filter(|m| !m.shard.closed)
            .map(|m| m.shard.id.clone())
            .collect()
    }

    /// Where the first iterator ever opened on `shard` pointed: the index (into
    /// [`records`](Self::records)) of the first record it would return. `None` if no iterator
    /// was opened on it yet. Every record from there on must be delivered.
    pub fn first_open(&self, shard: &ShardId) -> Option<usize> {
        self.lock().first_open.get(shard).copied()
    }

    /// Sets how long a subscription lasts before the stream ends it (default 5 minutes, as
    /// Kinesis). Subscriptions opened before keep their lifetime.
    pub fn set_subscription_lifetime(&self, lifetime: Duration) {
        self.lock().subscription_lifetime = lifetime;
    }

    /// The stream's own clock: what stamps `approximate_arrival` (see
    /// [`set_wall_clock`](Self::set_wall_clock)).
    pub fn now(&self) -> DateTime<Utc> {
        self.lock().now()
    }

    /// Sets the stream's wall clock to read `now` at this instant (by default it starts at
    /// the system's time): a simulation that numbers periods or dates records on it then
    /// replays the same way whenever it runs.
    pub fn set_wall_clock(&self, now: DateTime<Utc>) {
        let mut state = self.lock();
        state.wall = now;
        state.start = Instant::now();
    }

    /// Every record written to `shard`.
    pub fn records(&self, shard: &ShardId) -> Vec<Record> {
        self.lock()
            .shards
            .get(shard)
            .map(|m| m.records.clone())
            .unwrap_or_default()
    }
}

/// A sequence number of the stream's format.
fn sequence(n: u128) -> SequenceNumber {
    SequenceNumber::parse(format!("{n:025}")).unwrap_or_else(|| unreachable!("digits"))
}

/// The hash key of a partition key: its MD5 digest as a 128-bit number, as in Kinesis.
fn hash_key(partition_key: &str) -> u128 {
    use md5::{Digest, Md5};
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

fn parse_iterator(it: &ShardIterator) -> Option<(ShardId, usize)> {
    let (shard, index) = it.0.rsplit_once('/')?;
    Some((ShardId::new(shard), index.parse().ok()?))
}

impl ShardSource for MemoryStream {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        self.faults
            .enter(&self.client, "list_shards", false)
            .await?;
        Ok(self.shards())
    }

    async fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        self.faults
            .enter(&self.client, "shard_iterator", false)
            .await?;
        let index = self.lock().start_index(shard, position, "shard_iterator")?;
        Ok(ShardIterator(format!("{shard}/{index}")))
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        self.faults
            .enter(&self.client, "get_records", false)
            .await?;
        if self.faults.iterator_expires() {
            return Err(BackendError::new(
                ErrorKind::ExpiredIterator,
                "get_records",
                "injected: iterator expired",
            ));
        }
        let Some((shard, index)) = parse_iterator(iterator) else {
            return Err(BackendError::new(
                ErrorKind::Fatal,
                "get_records",
                "malformed iterator",
            ));
        };
        let read = self
            .lock()
            .read(&shard, index, limit as usize, "get_records")?;
        let (next_iterator, child_shards) = match read.end {
            Some(children) => (None, children),
            None => (
                Some(ShardIterator(format!("{shard}/{}", read.next))),
                Vec::new(),
            ),
        };
        Ok(RecordBatch {
            records: read.records,
            next_iterator,
            millis_behind_latest: read.millis_behind_latest,
            child_shards,
        })
    }

    async fn register_consumer(&self, name: &str) -> Result<ConsumerId, BackendError> {
        self.faults
            .enter(&self.client, "register_consumer", true)
            .await?;
        Ok(ConsumerId::new(format!("memory/consumer/{name}")))
    }

    async fn subscribe(
        &self,
        consumer: &ConsumerId,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<Subscription, BackendError> {
        self.faults.enter(&self.client, "subscribe", false).await?;
        subscription::open(self, consumer, shard, position)
    }

    /// The stream's own clock (it stamps `approximate_arrival`): tokio time, so that it
    /// follows paused time in tests.
    fn now(&self, _shard: &ShardId) -> DateTime<Utc> {
        self.lock().now()
    }
}
