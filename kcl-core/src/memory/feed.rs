//! The in-memory store's change feed: its journal, each write visible once it is the
//! feed's lag old. One partition, `journal`, whose cursor is the number of events read.

use std::time::Duration;

use tokio::time::Instant;

use super::StoreEvent;
use crate::lease::feed::{Change, FeedPosition, FeedRead};

const PARTITION: &str = "journal";

/// The writes in `journal` after `from` that are visible at `now`; a restart (at the first
/// write not visible yet) without a position, or with one this journal did not make.
pub(super) fn read(
    journal: &[StoreEvent],
    from: Option<&FeedPosition>,
    lag: Duration,
    now: Instant,
) -> FeedRead {
    let visible = journal.partition_point(|e| e.at + lag <= now);
    let cursor = from
        .and_then(|p| p.get(PARTITION))
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c <= visible);
    let mut position = FeedPosition::new();
    position.set(PARTITION, visible.to_string());
    let Some(cursor) = cursor else {
        return FeedRead::Restart(position);
    };
    let changes = journal[cursor..visible]
        .iter()
        .map(|e| match e.operation {
            "delete" => Change::Deleted(e.lease.key.clone()),
            _ => Change::Written(e.lease.clone()),
        })
        .collect();
    FeedRead::Changes(changes, position)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease::feed::FeedRead;
    use crate::lease::{Lease, LeaseStore, LeaseStoreExtras, TableFeatures};
    use crate::memory::MemoryLeaseStore;
    use crate::types::{Checkpoint, ShardId, WorkerId};

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[tokio::test(start_paused = true)]
    async fn the_feed_shows_each_write_once_after_its_lag() -> Result {
        let store = MemoryLeaseStore::new();
        store.ensure_table(TableFeatures::ALL).await?;
        store.set_feed(Some(Duration::from_secs(1)));
        let FeedRead::Restart(start) = store.changes(None).await? else {
            return Err("a first read restarts".into());
        };
        let lease = Lease::new(ShardId::new("s"), Checkpoint::TrimHorizon);
        store.create(&lease).await?;
        let taken = store.take(&lease, &WorkerId::new("w")).await?;
        let FeedRead::Changes(none, at) = store.changes(Some(&start)).await? else {
            return Err("the position is good".into());
        };
        assert!(none.is_empty(), "not visible before the lag: {none:?}");
        tokio::time::advance(Duration::from_secs(1)).await;
        store.delete(&taken).await?;
        let FeedRead::Changes(two, next) = store.changes(Some(&at)).await? else {
            return Err("the position is good".into());
        };
        assert_eq!(two, vec![Change::Written(lease), Change::Written(taken)]);
        tokio::time::advance(Duration::from_secs(1)).await;
        let FeedRead::Changes(deleted, _) = store.changes(Some(&next)).await? else {
            return Err("the position is good".into());
        };
        assert_eq!(deleted, vec![Change::Deleted(ShardId::new("s"))]);
        store.set_feed(None);
        assert_eq!(store.changes(Some(&next)).await?, FeedRead::Unavailable);
        Ok(())
    }
}
