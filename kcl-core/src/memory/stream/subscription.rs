//! `SubscribeToShard` in memory, with the rules of Kinesis that a consumer must live with:
//! a subscription ends by itself after its lifetime (5 minutes by default, see
//! [`MemoryStream::set_subscription_lifetime`]); a consumer may subscribe to a shard once
//! every 5 seconds (`Throttled` otherwise, Kinesis's `LimitExceededException`); records are
//! pushed as they arrive, and an empty event every 5 seconds while none do; at the end of a
//! closed shard the last event has no continuation and names the children, and the
//! subscription ends. Every event goes through the stream's [`Faults`](super::Faults), so
//! the simulation can fail, delay and freeze subscriptions as it does polls.

use futures_util::stream;
use tokio::time::{Duration, Instant, sleep_until};

use super::MemoryStream;
use crate::error::{BackendError, ErrorKind};
use crate::source::{Subscription, SubscriptionEvent};
use crate::types::{ConsumerId, ShardId, StartingPosition};

/// How often an idle subscription pushes an empty event.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How soon a consumer may subscribe to the same shard again.
const RESUBSCRIBE: Duration = Duration::from_secs(5);
/// The most records one event carries.
const MAX_RECORDS: usize = 10_000;

/// Opens a subscription of `consumer` to `shard` at `position`.
pub(super) fn open(
    source: &MemoryStream,
    consumer: &ConsumerId,
    shard: &ShardId,
    position: &StartingPosition,
) -> Result<Subscription, BackendError> {
    let (index, until) = {
        let mut s = source.lock();
        let now = Instant::now();
        let key = (consumer.clone(), shard.clone());
        if s.subscribed
            .get(&key)
            .is_some_and(|&at| now < at + RESUBSCRIBE)
        {
            return Err(BackendError::new(
                ErrorKind::Throttled,
                "subscribe",
                format!(
                    "{shard}: LimitExceeded: one subscription per shard and consumer every 5 s"
                ),
            ));
        }
        let index = s.start_index(shard, position, "subscribe")?;
        s.subscribed.insert(key, now);
        (index, now + s.subscription_lifetime)
    };
    let cursor = Cursor {
        source: source.clone(),
        shard: shard.clone(),
        index,
        until,
        done: false,
    };
    Ok(Box::pin(stream::unfold(cursor, |mut cursor| async move {
        let event = cursor.next().await?;
        Some((event, cursor))
    })))
}

/// Where a subscription stands.
struct Cursor {
    source: MemoryStream,
    shard: ShardId,
    /// The index of the next record to push.
    index: usize,
    /// When the subscription ends.
    until: Instant,
    /// Ended: by an error or at the end of the shard.
    done: bool,
}

impl Cursor {
    async fn next(&mut self) -> Option<Result<SubscriptionEvent, BackendError>> {
        if self.done {
            return None;
        }
        let beat = Instant::now() + HEARTBEAT;
        loop {
            let now = Instant::now();
            if now >= self.until {
                return None;
            }
            let arrivals = self.source.arrivals.clone();
            let arrived = arrivals.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let something = {
                let s = self.source.lock();
                s.shards
                    .get(&self.shard)
                    .is_none_or(|m| self.index < m.records.len() || m.shard.closed)
            };
            if something || now >= beat {
                return Some(self.push().await);
            }
            tokio::select! {
                biased;
                () = arrived => {}
                () = sleep_until(beat.min(self.until)) => {}
            }
        }
    }

    /// The next event: what arrived since the last one (perhaps nothing).
    async fn push(&mut self) -> Result<SubscriptionEvent, BackendError> {
        let read = match self
            .source
            .faults
            .enter(&self.source.client, "subscription", false)
            .await
        {
            Ok(_) => self
                .source
                .lock()
                .read(&self.shard, self.index, MAX_RECORDS, "subscription"),
            Err(e) => Err(e),
        };
        let read = read.inspect_err(|_| self.done = true)?;
        self.index = read.next;
        self.done = read.end.is_some();
        Ok(SubscriptionEvent {
            records: read.records,
            continuation: read.end.is_none().then_some(read.continuation),
            millis_behind_latest: read.millis_behind_latest,
            child_shards: read.end.unwrap_or_default(),
        })
    }
}
