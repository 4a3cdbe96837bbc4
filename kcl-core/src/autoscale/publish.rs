//! The one row through which every worker answers an autoscaler with the leader's figures.
//!
//! The leader holds the row `kcl-coordination/fleet-signals` as a lease and writes its
//! [`FleetSignals`] into it (`kclSignals`) with a fenced checkpoint write every publish
//! interval: a leader deposed meanwhile finds the row taken by its successor, and its write
//! fails instead of putting old figures back. It does not take the row back either: once a
//! worker has held the row in a leadership and finds another worker holding it, it writes
//! nothing more until it leads again. The others read the row eventually consistently
//! ([`LeaseStore::peek`]) every publish interval. One row, one write unit per interval, only
//! when [`Autoscaling::publish_interval`](crate::Autoscaling::publish_interval) is set.

use super::FleetSignals;
use crate::error::{BackendError, ErrorKind};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::types::{Checkpoint, ShardId, WorkerId};

/// The key of the row the leader publishes its signals in.
pub(crate) const SIGNALS_KEY: &str = "kcl-coordination/fleet-signals";

fn key() -> ShardId {
    ShardId::new(SIGNALS_KEY)
}

/// The leader's hold on the signals row, for one leadership.
#[derive(Debug, Default)]
pub(crate) struct Publisher {
    /// The row as this worker last wrote it; `None` until it takes it, and after a failed
    /// write (the next publish reads it again).
    held: Option<Lease>,
    /// Who held the row when this leadership first read it (`Some(None)`: nobody).
    found: Option<Option<WorkerId>>,
    /// It held the row in this leadership.
    took: bool,
    /// Another worker holds the row this one held: it writes nothing until it leads again.
    deposed: bool,
}

/// The row as read: its figures, and the write it is (its lease counter, bumped by every
/// write: how a reader sees it change).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Published {
    pub(crate) counter: u64,
    pub(crate) signals: Option<FleetSignals>,
}

impl Publisher {
    /// Forgets the row: this worker no longer leads (and may publish again once it does).
    pub(crate) fn let_go(&mut self) {
        *self = Self::default();
    }

    /// Writes `signals` into the row as `me`, taking the row first if a previous leader holds
    /// it or nobody made it yet. Refused, without a write, once another worker holds the row
    /// this leadership held: a successor publishes now.
    pub(crate) async fn publish<L: LeaseStore>(
        &mut self,
        store: &L,
        me: &WorkerId,
        signals: &FleetSignals,
    ) -> Result<(), BackendError> {
        if self.deposed {
            return Err(deposed());
        }
        let held = match self.held.take() {
            Some(held) => held,
            None => self.take(store, me).await?,
        };
        let mut update = CheckpointUpdate::new(held.checkpoint.clone());
        update.signals = Some(signals.encode());
        self.held = Some(store.checkpoint(&held, &update).await?);
        Ok(())
    }

    /// The row for `me` to write: as it is if `me` holds it; taken from whoever held it when
    /// this leadership first read it, while `me` never held it yet; else nothing (deposed).
    async fn take<L: LeaseStore>(
        &mut self,
        store: &L,
        me: &WorkerId,
    ) -> Result<Lease, BackendError> {
        let row = read_or_make(store).await?;
        if row.is_owned_by(me) {
            self.took = true;
            return Ok(row);
        }
        let found = self.found.get_or_insert_with(|| row.owner.clone());
        // A worker other than the one it took from holds it now, or it held the row and
        // another holds it now: a successor leads. A row nobody holds (deleted by hand and
        // made again, or given back) is taken, whatever this leadership saw before.
        if row.owner.is_some() && (self.took || row.owner != *found) {
            tracing::warn!(holder = ?row.owner, "another worker holds the fleet-signals row: not publishing until this worker leads again");
            self.deposed = true;
            return Err(deposed());
        }
        let taken = store.take(&row, me).await?;
        self.took = true;
        Ok(taken)
    }

    /// What the leader last published, read eventually consistently; `None` if no row was
    /// made yet (`signals` `None`: nothing written yet, or what was does not parse).
    pub(crate) async fn read<L: LeaseStore>(store: &L) -> Result<Option<Published>, BackendError> {
        let row = store.peek(&key()).await?;
        Ok(row.map(|row| Published {
            counter: row.counter,
            signals: row.signals.as_deref().and_then(FleetSignals::decode),
        }))
    }
}

fn deposed() -> BackendError {
    BackendError::new(
        ErrorKind::Conflict,
        "publish_signals",
        "another worker holds the fleet-signals row: this one no longer leads",
    )
}

/// The row as it is, made first if it does not exist.
async fn read_or_make<L: LeaseStore>(store: &L) -> Result<Lease, BackendError> {
    if let Some(row) = store.get(&key()).await? {
        return Ok(row);
    }
    store
        .create(&Lease::new(key(), Checkpoint::TrimHorizon))
        .await?;
    // Made by this worker or, racing, by another: either way read what is there.
    store.get(&key()).await?.ok_or_else(|| {
        BackendError::new(ErrorKind::Conflict, "get", "the fleet-signals row vanished")
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease::TableFeatures;
    use crate::memory::MemoryLeaseStore;

    fn signals(desired: u32) -> FleetSignals {
        FleetSignals {
            workers: 2,
            shards: 4,
            behind: Duration::from_secs(3),
            backlog_records: 10,
            arrival_rate: 1.0,
            drain_rate: 1.0,
            load: 0.5,
            needed: 0.5,
            recommended: desired,
            desired_workers: desired,
            shard_floor: 1,
            at: None,
        }
    }

    async fn figures(store: &MemoryLeaseStore) -> Option<FleetSignals> {
        let read = Publisher::read(store).await.ok().flatten();
        read.and_then(|published| published.signals)
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_publishes_and_a_deposed_leader_cannot_overwrite() {
        let store = MemoryLeaseStore::new();
        let _ = store.ensure_table(TableFeatures::NONE).await;
        assert_eq!(
            Publisher::read(&store).await.ok(),
            Some(None),
            "nothing yet"
        );
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut old = Publisher::default();
        assert!(old.publish(&store, &a, &signals(3)).await.is_ok());
        assert!(old.publish(&store, &a, &signals(4)).await.is_ok());
        assert_eq!(figures(&store).await, Some(signals(4)));
        // b leads now: it takes the row, and a's next write is refused.
        let mut new = Publisher::default();
        assert!(new.publish(&store, &b, &signals(6)).await.is_ok());
        assert!(old.publish(&store, &a, &signals(1)).await.is_err());
        assert_eq!(figures(&store).await, Some(signals(6)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deposed_publisher_never_writes_again_until_it_leads_again() {
        let store = MemoryLeaseStore::new();
        let _ = store.ensure_table(TableFeatures::NONE).await;
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut old = Publisher::default();
        assert!(old.publish(&store, &a, &signals(3)).await.is_ok());
        let mut new = Publisher::default();
        assert!(new.publish(&store, &b, &signals(6)).await.is_ok());
        let counter = Publisher::read(&store)
            .await
            .ok()
            .flatten()
            .map(|p| p.counter);
        // a still thinks it leads: every publish of its is refused, none writes (not the
        // first, fenced by the counter, nor any later one, which would take the row back).
        for desired in [1, 2, 3] {
            assert!(old.publish(&store, &a, &signals(desired)).await.is_err());
        }
        let read = Publisher::read(&store).await.ok().flatten();
        assert_eq!(read.as_ref().map(|p| p.counter), counter, "a wrote");
        assert_eq!(read.and_then(|p| p.signals), Some(signals(6)));
        // b goes on.
        assert!(new.publish(&store, &b, &signals(7)).await.is_ok());
        assert_eq!(figures(&store).await, Some(signals(7)));
        // a leads again (it followed meanwhile): it takes the row, and b, deposed, is refused.
        old.let_go();
        assert!(old.publish(&store, &a, &signals(8)).await.is_ok());
        assert!(new.publish(&store, &b, &signals(9)).await.is_err());
        assert!(new.publish(&store, &b, &signals(9)).await.is_err());
        assert_eq!(figures(&store).await, Some(signals(8)));
    }

    /// The row deleted by hand (and made again by the next read) under a publisher that
    /// leads: it takes the row nobody holds and goes on publishing (it was deposed for its
    /// whole leadership before, and followers went UNAVAILABLE).
    #[tokio::test]
    async fn a_publisher_whose_row_was_deleted_goes_on() {
        let store = MemoryLeaseStore::new();
        let _ = store.ensure_table(TableFeatures::NONE).await;
        let a = WorkerId::new("a");
        let mut publisher = Publisher::default();
        assert!(publisher.publish(&store, &a, &signals(3)).await.is_ok());
        let row = store.get(&key()).await.ok().flatten();
        assert!(
            store
                .delete(&row.unwrap_or_else(|| unreachable!()))
                .await
                .is_ok()
        );
        // The first write after the delete fails (its row is gone); the next ones succeed.
        let _ = publisher.publish(&store, &a, &signals(4)).await;
        for desired in [5, 6] {
            assert!(
                publisher
                    .publish(&store, &a, &signals(desired))
                    .await
                    .is_ok()
            );
        }
        assert_eq!(figures(&store).await, Some(signals(6)));
    }
}
