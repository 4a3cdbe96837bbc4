//! What a lease store may offer beyond its operations: a change feed, request accounting,
//! and the rows it could not parse. Each has a default that is true of a store without it,
//! so a store that has none of them implements [`LeaseStoreExtras`] empty and still works:
//! its observers read the whole table, its bill is not counted and no row is reported
//! unreadable. The stores of this workspace (in memory, DynamoDB) implement all three.
//!
//! The owner index is an operation with a default instead
//! ([`LeaseStore::owned_by`]): its honest default reads the whole table, which only a
//! method of [`LeaseStore`] can.

use std::future::Future;

use super::feed::{FeedPosition, FeedRead};
use super::usage::Usage;
use super::{LeaseStore, UnreadableRow};
use crate::error::{BackendError, ErrorKind};
use crate::types::ShardId;

/// What a [`LeaseStore`] may offer beyond its operations: a change feed, request accounting,
/// and the rows it could not parse. Each method's default is true of a store without it, so a
/// store that has none of them implements this trait empty and still works: its observers
/// (the leader and the standby) read the whole table, its bill is not counted and no row is
/// reported unreadable. The stores of this workspace (in memory, DynamoDB) implement all
/// three. (The owner index is [`LeaseStore::owned_by`], an operation with a default: its
/// honest default reads the whole table, which only a method of `LeaseStore` can.)
///
/// ```
/// # use kcl_core::LeaseStoreExtras;
/// # struct MyStore;
/// // A store with no feed and no accounting: every default holds.
/// impl LeaseStoreExtras for MyStore {}
/// ```
///
/// A wrapper of another store delegates every method, or it hides the inner store's feed,
/// bill and unreadable rows (the leader would read the whole table every interval).
pub trait LeaseStoreExtras: Send + Sync + 'static {
    /// The table's changes after `from` (see [`feed`](super::feed)): with `None`, a new
    /// position ([`FeedRead::Restart`]). By default [`FeedRead::Unavailable`]: no feed, so
    /// observers (the leader and the standby) read the whole table every interval.
    fn changes(
        &self,
        from: Option<&FeedPosition>,
    ) -> impl Future<Output = Result<FeedRead, BackendError>> + Send {
        let _ = from;
        std::future::ready(Ok(FeedRead::Unavailable))
    }

    /// Whether the store can keep a feed of its table's changes at all (DynamoDB: the
    /// table's stream), whether or not this table has one. By default false: a worker whose
    /// table lacks the feed then says once, at INFO, that its leader reads the table whole,
    /// rather than warning of a feed nobody can enable (Postgres).
    fn offers_change_feed(&self) -> bool {
        false
    }

    /// The requests and capacity units this handle has spent so far, if it counts them. See
    /// [`usage`](super::usage). By default `None`: the worker's request metrics stay at zero.
    fn usage(&self) -> Option<Usage> {
        None
    }

    /// The rows the last whole-table read ([`list`](LeaseStore::list),
    /// [`snapshot`](LeaseStore::snapshot), or the change feed since) found but could not
    /// parse. The worker reports them as problems: a shard whose row nobody can read is a
    /// shard nobody processes. By default none: a store that parses every row it returns.
    fn unreadable(&self) -> Vec<UnreadableRow> {
        Vec::new()
    }

    /// Removes `entries` from the row `key`'s [`parked_keys`](super::Lease::parked_keys),
    /// whoever holds it, without touching anything else (the owner's writes stay valid; it
    /// sees the change in its next renewal and runs the key's records again). For a redrive
    /// ([`admin::unpark`](crate::admin::unpark)). By default an error: a store that keeps no
    /// parked keys.
    fn unpark(
        &self,
        key: &ShardId,
        entries: &[String],
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = entries;
        std::future::ready(Err(BackendError::new(
            ErrorKind::Fatal,
            "unpark",
            format!("this lease store cannot unpark keys (row {key})"),
        )))
    }

    /// Adds the entry `request` to the row `key`'s [`parked_keys`](super::Lease::parked_keys)
    /// if the row still holds the entry `parked`, whoever holds it, touching nothing else: a
    /// redrive's request that the holder replay a parked key's letters
    /// ([`replay`](crate::failure::redrive_entry)). `false` if the row no longer parks it. By
    /// default an error: a store that keeps no parked keys.
    fn request_redrive(
        &self,
        key: &ShardId,
        parked: &str,
        request: &str,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        let _ = (parked, request);
        std::future::ready(Err(BackendError::new(
            ErrorKind::Fatal,
            "request_redrive",
            format!("this lease store keeps no parked keys (row {key})"),
        )))
    }
}

/// A shared store has the extras of the store it shares.
impl<L: LeaseStore> LeaseStoreExtras for std::sync::Arc<L> {
    fn changes(
        &self,
        from: Option<&FeedPosition>,
    ) -> impl Future<Output = Result<FeedRead, BackendError>> + Send {
        (**self).changes(from)
    }

    fn offers_change_feed(&self) -> bool {
        (**self).offers_change_feed()
    }

    fn usage(&self) -> Option<Usage> {
        (**self).usage()
    }

    fn unreadable(&self) -> Vec<UnreadableRow> {
        (**self).unreadable()
    }

    fn unpark(
        &self,
        key: &ShardId,
        entries: &[String],
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        (**self).unpark(key, entries)
    }

    fn request_redrive(
        &self,
        key: &ShardId,
        parked: &str,
        request: &str,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        (**self).request_redrive(key, parked, request)
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::LeaseStoreExtras;
    use crate::lease::{Lease, LeaseStore};
    use crate::memory::MemoryLeaseStore;
    use crate::types::{Checkpoint, ShardId};

    /// A shared store passes every extra through (a redrive's request through an `Arc` was
    /// answered "keeps no parked keys").
    #[tokio::test]
    async fn a_shared_store_passes_every_extra_through() {
        let store = Arc::new(MemoryLeaseStore::new());
        store
            .ensure_table(crate::lease::TableFeatures::NONE)
            .await
            .unwrap();
        let mut lease = Lease::new(ShardId::new("s"), Checkpoint::TrimHorizon);
        lease.parked_keys = vec!["k@1".to_owned()];
        assert!(store.create(&lease).await.unwrap());
        let key = ShardId::new("s");
        assert!(
            store
                .request_redrive(&key, "k@1", "redrive:k@1")
                .await
                .unwrap()
        );
        store.unpark(&key, &["k@1".to_owned()]).await.unwrap();
        let row = store.get(&key).await.unwrap().unwrap();
        assert_eq!(row.parked_keys, vec!["redrive:k@1".to_owned()]);
        assert!(store.usage().is_some());
    }
}
