//! The lease table's change feed, and a copy of the table kept current from it.
//!
//! Under [`Coordination::Leader`](crate::Coordination::Leader) two workers observe every
//! lease: the leader and the standby. Reading the whole table every interval would make
//! their reads grow with shards × intervals; reading what *changed* makes them grow with the
//! writes, which the fleet pays for anyway. DynamoDB offers that as a table stream (DynamoDB
//! Streams, `NEW_IMAGE`), whose reads are billed per request, not per row; the in-memory
//! store serves its journal.
//!
//! A feed is read from a [`FeedPosition`] the store hands out. When there is no position yet,
//! or the store cannot continue from it (records trimmed, a new stream), it starts a new one
//! ([`FeedRead::Restart`]) and the reader reads the whole table once, *after* the restart, so
//! that every change is either in that read or later in the feed. A `Mirror` applies what
//! the feed returns; a change older than the row it holds (a lower counter, from a feed that
//! lags the read) is ignored.
//!
//! Why a copy built this way is safe to take leases from: a value of a counter is always
//! written before it is read, from the table or the feed, so a counter seen standing still
//! for the failover time was last written at least that long ago, and every take stays
//! conditional on the counter seen. A feed that lags or stalls only delays a take or makes
//! it fail; a periodic full read ([`RESYNC_INTERVAL`]) repairs anything it missed.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::types::ShardId;

/// How often an observer reads the whole table again although its feed works: the bound on
/// how long a change the feed missed can go unseen. Five minutes: an eventually consistent
/// read of 1,000 leases every five minutes costs less than one read unit per shard-hour.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(300);

/// Where a reader of the change feed is, as the store wrote it: for each partition of the
/// feed (a DynamoDB stream shard; the in-memory journal), the store's cursor. Opaque to the
/// worker, which only hands it back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedPosition {
    cursors: BTreeMap<String, String>,
}

impl FeedPosition {
    /// A position with no partitions.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cursor of `partition`, if the position has one.
    pub fn get(&self, partition: &str) -> Option<&str> {
        self.cursors.get(partition).map(String::as_str)
    }

    /// Sets the cursor of `partition`.
    pub fn set(&mut self, partition: impl Into<String>, cursor: impl Into<String>) {
        self.cursors.insert(partition.into(), cursor.into());
    }

    /// Forgets `partition` (it has ended and was read to its end).
    pub fn remove(&mut self, partition: &str) {
        self.cursors.remove(partition);
    }

    /// Every partition and its cursor, ordered by partition.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.cursors.iter().map(|(p, c)| (p.as_str(), c.as_str()))
    }
}

/// One change to the table, as the feed reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "almost every change is a write: boxing would cost an allocation per change"
)]
pub enum Change {
    /// A row written (created or updated): the row after the write.
    Written(Lease),
    /// A row deleted.
    Deleted(ShardId),
}

/// What one read of the feed returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedRead {
    /// The table has no feed: read the whole table instead.
    Unavailable,
    /// A new position, starting now: read the whole table once, then read the feed from here.
    Restart(FeedPosition),
    /// The changes after the position given, oldest first (per row), and where to go on.
    Changes(Vec<Change>, FeedPosition),
}

/// A copy of the lease table, kept current from the feed. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    rows: BTreeMap<ShardId, Lease>,
    position: Option<FeedPosition>,
    resync_at: Option<Instant>,
    /// Whether the last read of the feed failed (so that a lasting failure is said once).
    failed: bool,
}

impl Mirror {
    /// The position to read the feed from, if the copy is current enough to go on from it
    /// (else read from `None`: a restart).
    pub(crate) fn position(&self, now: Instant) -> Option<&FeedPosition> {
        match self.resync_at {
            Some(at) if now < at => self.position.as_ref(),
            _ => None,
        }
    }

    /// Starts over from `position` with `leases`, a whole-table read made after the restart.
    pub(crate) fn reset(&mut self, position: FeedPosition, leases: Vec<Lease>, now: Instant) {
        self.rows = leases.into_iter().map(|l| (l.key.clone(), l)).collect();
        self.position = Some(position);
        self.resync_at = Some(now + RESYNC_INTERVAL);
        self.failed = false;
    }

    /// Notes that reading the feed failed (kept until the next restart).
    pub(crate) fn set_feed_failed(&mut self) {
        self.failed = true;
    }

    /// Whether reading the feed failed since the last restart.
    pub(crate) fn feed_failed(&self) -> bool {
        self.failed
    }

    /// Applies changes read from the feed and moves to `position`.
    pub(crate) fn apply(&mut self, changes: Vec<Change>, position: FeedPosition) {
        for change in changes {
            match change {
                Change::Written(lease) => match self.rows.get(&lease.key) {
                    Some(held) if held.counter > lease.counter => {}
                    _ => {
                        self.rows.insert(lease.key.clone(), lease);
                    }
                },
                Change::Deleted(key) => {
                    self.rows.remove(&key);
                }
            }
        }
        self.position = Some(position);
    }

    /// Forgets the rows and the position: the next read restarts (the feed failed, or this
    /// worker stopped observing).
    pub(crate) fn clear(&mut self) {
        let failed = self.failed;
        *self = Self {
            failed,
            ..Self::default()
        };
    }

    /// Every row, by key.
    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.rows.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Checkpoint;

    fn lease(key: &str, counter: u64) -> Lease {
        let mut l = Lease::new(ShardId::new(key), Checkpoint::TrimHorizon);
        l.counter = counter;
        l
    }

    #[tokio::test(start_paused = true)]
    async fn a_mirror_applies_changes_and_ignores_older_ones() {
        let mut m = Mirror::default();
        assert!(m.position(Instant::now()).is_none(), "nothing read yet");
        let mut p = FeedPosition::new();
        p.set("journal", "7");
        m.reset(
            p.clone(),
            vec![lease("a", 5), lease("b", 1)],
            Instant::now(),
        );
        assert_eq!(m.position(Instant::now()), Some(&p));
        m.apply(
            vec![
                Change::Written(lease("a", 4)), // older than the read: a lagging feed
                Change::Written(lease("b", 2)),
                Change::Written(lease("c", 0)),
                Change::Deleted(ShardId::new("b")),
            ],
            p.clone(),
        );
        let counters: Vec<_> = m
            .leases()
            .iter()
            .map(|l| (l.key.clone(), l.counter))
            .collect();
        assert_eq!(
            counters,
            vec![(ShardId::new("a"), 5), (ShardId::new("c"), 0)]
        );
        tokio::time::advance(RESYNC_INTERVAL).await;
        assert!(m.position(Instant::now()).is_none(), "due for a resync");
    }
}
