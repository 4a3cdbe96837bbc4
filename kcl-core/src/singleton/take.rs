//! One poll of a candidate: read the row, take it if it is free.
//!
//! Reading may be abandoned at shutdown; a take may not. A take abandoned after it was sent
//! can still land: the row would then be held by a candidate that does not know it, renewed
//! by nobody, and every other candidate would wait out the failover time for it. Standby
//! rows are given up all the time (each time a standby moves up), so this would not be
//! rare. A take is therefore always awaited (it is bounded by the failover time), and a row
//! taken after shutdown came is released at once.
//!
//! A candidate whose process reads the row anyway (a worker's standby follows the whole table
//! every taker interval) is handed those reads as a [`Sighting`] and polls without a read of
//! its own while one is fresh: the standby's leader candidate would otherwise read the leader
//! row every second, 60 read units a minute for every fleet. A sighting is never newer than
//! the row: expiry judged on it can only come later, and the take stays conditional.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Singleton;
use crate::BackendError;
use crate::error::ErrorKind;
use crate::lease::observer::Observer;
use crate::lease::{Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::task::bounded;
use crate::types::Checkpoint;

impl<L: LeaseStore> Singleton<L> {
    /// Reads the row (creating it if absent) and takes it if free, ours, or expired; `None`
    /// if it is not, or if `shutdown` came.
    pub(super) async fn try_take(
        &self,
        observer: &mut Observer,
        shutdown: &CancellationToken,
    ) -> Result<Option<(Lease, Instant)>, BackendError> {
        // Two polls' worth: the worker's cycles and this candidate's polls share a period but
        // not a phase.
        let sighted = self
            .sighting
            .as_ref()
            .and_then(|s| s.fresh(self.poll_interval() * 2));
        let (row, seen) = match sighted {
            Some((row, at)) => (Some(row), at),
            None => tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(None),
                row = self.read() => (row?, Instant::now()),
            },
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let now = Instant::now();
        observer.update(std::slice::from_ref(&row), seen);
        self.holder.send_if_modified(|h| {
            let changed = *h != row.owner;
            h.clone_from(&row.owner);
            changed
        });
        let free = match &row.owner {
            None => true,
            Some(o) if o == &self.me => true,
            Some(_) => observer.idle(&row, now) >= self.config.failover_time,
        };
        if !free {
            return Ok(None);
        }
        let started = Instant::now();
        let limit = self.config.failover_time;
        let lease = match bounded(limit, "take", self.store.take(&row, &self.me)).await {
            Ok(lease) => lease,
            Err(e) if e.kind() == ErrorKind::Conflict => return Ok(None),
            Err(e) => return Err(e),
        };
        if shutdown.is_cancelled() {
            if let Err(error) = bounded(limit, "release", self.store.release(&lease)).await {
                tracing::debug!(%error, singleton = %self.key, "releasing a row taken at shutdown failed");
            }
            return Ok(None);
        }
        Ok(Some((lease, started)))
    }

    /// The row, created if absent; `None` if it vanished again.
    async fn read(&self) -> Result<Option<Lease>, BackendError> {
        let limit = self.config.failover_time;
        if let Some(row) = bounded(limit, "get", self.store.get(&self.key)).await? {
            return Ok(Some(row));
        }
        // A new row is free: whoever created it tries to take it at once, and whoever lost
        // the race reads it again at once (at a slow pace, its next poll may be minutes
        // away while the winner is gone again).
        let row = Lease::new(self.key.clone(), Checkpoint::TrimHorizon);
        if bounded(limit, "create", self.store.create(&row)).await? {
            return Ok(Some(row));
        }
        bounded(limit, "get", self.store.get(&self.key)).await
    }
}

/// The row as another part of this process last read it, and when.
#[derive(Debug, Default)]
pub(crate) struct Sighting(Mutex<Option<(Lease, Instant)>>);

impl Sighting {
    /// `row` was read at `at`.
    pub(crate) fn saw(&self, row: Lease, at: Instant) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((row, at));
    }

    /// The last sighting, if it is at most `within` old.
    fn fresh(&self, within: Duration) -> Option<(Lease, Instant)> {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.as_ref()
            .filter(|(_, at)| {
                at.elapsed() <= within || mutation::on(Mutation::SightingTrustedHoweverOld)
            })
            .cloned()
    }
}
