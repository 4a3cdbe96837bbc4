//! The one row through which every worker answers an autoscaler with the leader's figures.
//!
//! The leader holds the row `kcl-coordination/fleet-signals` as a lease and writes its
//! [`FleetSignals`] into it (`kclSignals`) with a fenced checkpoint write every publish
//! interval: a leader deposed meanwhile finds the row taken by its successor, and its write
//! fails instead of putting old figures back. The others read the row eventually
//! consistently ([`LeaseStore::peek`]) every publish interval. One row, one write unit per
//! interval, only when [`Autoscaling::publish_interval`](crate::Autoscaling::publish_interval)
//! is set.

use super::FleetSignals;
use crate::error::{BackendError, ErrorKind};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::types::{Checkpoint, ShardId, WorkerId};

/// The key of the row the leader publishes its signals in.
pub(crate) const SIGNALS_KEY: &str = "kcl-coordination/fleet-signals";

fn key() -> ShardId {
    ShardId::new(SIGNALS_KEY)
}

/// The leader's hold on the signals row.
#[derive(Debug, Default)]
pub(crate) struct Publisher {
    /// The row as this worker last wrote it; `None` until it takes it, and after a failed
    /// write (the next publish reads it again).
    held: Option<Lease>,
}

impl Publisher {
    /// Forgets the row: this worker no longer leads.
    pub(crate) fn let_go(&mut self) {
        self.held = None;
    }

    /// Writes `signals` into the row as `me`, taking the row first if another worker (a
    /// previous leader) holds it or nobody made it yet.
    pub(crate) async fn publish<L: LeaseStore>(
        &mut self,
        store: &L,
        me: &WorkerId,
        signals: &FleetSignals,
    ) -> Result<(), BackendError> {
        let held = match self.held.take() {
            Some(held) => held,
            None => take(store, me).await?,
        };
        let mut update = CheckpointUpdate::new(held.checkpoint.clone());
        update.signals = Some(signals.encode());
        self.held = Some(store.checkpoint(&held, &update).await?);
        Ok(())
    }

    /// What the leader last published, read eventually consistently; `None` if nothing was
    /// (or what was does not parse).
    pub(crate) async fn read<L: LeaseStore>(
        store: &L,
    ) -> Result<Option<FleetSignals>, BackendError> {
        let row = store.peek(&key()).await?;
        Ok(row
            .and_then(|row| row.signals)
            .and_then(|text| FleetSignals::decode(&text)))
    }
}

/// Takes the row for `me`, making it first if it does not exist.
async fn take<L: LeaseStore>(store: &L, me: &WorkerId) -> Result<Lease, BackendError> {
    let row = match store.get(&key()).await? {
        Some(row) => row,
        None => {
            store
                .create(&Lease::new(key(), Checkpoint::TrimHorizon))
                .await?;
            // Made by this worker or, racing, by another: either way read what is there.
            store.get(&key()).await?.ok_or_else(|| {
                BackendError::new(ErrorKind::Conflict, "get", "the fleet-signals row vanished")
            })?
        }
    };
    if row.is_owned_by(me) {
        return Ok(row);
    }
    store.take(&row, me).await
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
        }
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
        assert_eq!(Publisher::read(&store).await.ok(), Some(Some(signals(4))));
        // b leads now: it takes the row, and a's next write is refused.
        let mut new = Publisher::default();
        assert!(new.publish(&store, &b, &signals(6)).await.is_ok());
        assert!(old.publish(&store, &a, &signals(1)).await.is_err());
        assert_eq!(Publisher::read(&store).await.ok(), Some(Some(signals(6))));
    }
}
