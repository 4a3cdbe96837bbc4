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
//! the row: expiry judged on it can only come later, and the take stays conditional. A poll
//! after a poke reads the row all the same: what poked it (an index query showing the row
//! handed to this worker) is newer than the sighting may be.
//!
//! A worker's role rows are carried (see `carried`): their candidates read the row and its
//! carrier cheaply (eventually consistent), judge the pair, and read the carrier consistently
//! before taking a row that looks expired.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Singleton;
use super::carried::Proof;
use crate::BackendError;
use crate::error::ErrorKind;
use crate::lease::{Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::task::bounded;
use crate::types::Checkpoint;

impl<L: LeaseStore> Singleton<L> {
    /// Reads the row (creating it if absent) and takes it if free, ours, or expired; `None`
    /// if it is not, or if `shutdown` came.
    pub(super) async fn try_take(
        &self,
        proof: &mut Proof,
        shutdown: &CancellationToken,
    ) -> Result<Option<(Lease, Instant)>, BackendError> {
        // Two polls' worth: the worker's cycles and this candidate's polls share a period but
        // not a phase. (At most two failover times: a candidate that seldom polls, or only
        // when poked, takes sightings of a recent read only.)
        let within = self.poll_interval().min(self.config.failover_time) * 2;
        let read = self
            .read_next
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        let sighted = (self.sighting.as_ref())
            .filter(|_| !read)
            .and_then(|s| s.fresh(within));
        let (row, carrier, seen) = match sighted {
            Some(Seen { row, carrier, at }) => (Some(row), carrier, at),
            None => tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(None),
                read = self.read_with_carrier() => {
                    let (row, carrier) = read?;
                    (row, carrier, Instant::now())
                }
            },
        };
        let Some(row) = row else {
            return Ok(None);
        };
        proof.observe(&row, carrier.as_ref(), seen);
        tracing::trace!(singleton = %self.key, owner = ?row.owner, counter = row.counter, carrier = ?carrier.as_ref().map(|c| (&c.key, &c.owner, c.counter)), idle = ?proof.idle(Instant::now()), "polled");
        self.holder.send_if_modified(|h| {
            let changed = *h != row.owner;
            h.clone_from(&row.owner);
            changed
        });
        let free = match &row.owner {
            None => true,
            Some(o) if o == &self.me => true,
            Some(_) => self.expired(proof, &row).await?,
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

    /// Whether `row`, as `proof` observed it, is expired: its proof stood still for the
    /// failover time, confirmed by a consistent read of its carrier where it has one.
    async fn expired(&self, proof: &mut Proof, row: &Lease) -> Result<bool, BackendError> {
        let failover = self.config.failover_time;
        let mut confirmed = false;
        if let Some(key) = proof.to_confirm(Instant::now(), failover).cloned() {
            let carrier = bounded(failover, "get", self.store.get(&key)).await?;
            confirmed = proof.confirm(row, carrier.as_ref(), Instant::now());
        }
        Ok(proof.expired(Instant::now(), failover, confirmed))
    }

    /// The row (created if absent; `None` if it vanished again) and, for a carried row, the
    /// row it names as its carrier, both read cheaply.
    async fn read_with_carrier(&self) -> Result<(Option<Lease>, Option<Lease>), BackendError> {
        let row = self.read().await?;
        let carrier = match row
            .as_ref()
            .and_then(|r| r.carrier.as_ref().filter(|c| **c != r.key))
        {
            Some(key) if self.carriers.is_some() => {
                let limit = self.config.failover_time;
                bounded(limit, "peek", self.store.peek(key)).await?
            }
            _ => None,
        };
        Ok((row, carrier))
    }

    /// The row, created if absent; `None` if it vanished again. Carried rows are read
    /// cheaply (their takes are confirmed), the others consistently.
    async fn read(&self) -> Result<Option<Lease>, BackendError> {
        let limit = self.config.failover_time;
        let found = if self.carriers.is_some() {
            bounded(limit, "peek", self.store.peek(&self.key)).await?
        } else {
            bounded(limit, "get", self.store.get(&self.key)).await?
        };
        if let Some(row) = found {
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

/// What a sighting holds: the row, its carrier if the read had it, and when it was read.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) row: Lease,
    pub(crate) carrier: Option<Lease>,
    pub(crate) at: Instant,
}

/// The row as another part of this process last read it, and when.
#[derive(Debug, Default)]
pub(crate) struct Sighting(Mutex<Option<Seen>>);

impl Sighting {
    /// `row` (and the row its carrier names, if the read had it) was read at `at`.
    pub(crate) fn saw(&self, row: Lease, carrier: Option<Lease>, at: Instant) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Seen { row, carrier, at });
    }

    /// The last sighting, if it is at most `within` old.
    fn fresh(&self, within: Duration) -> Option<Seen> {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.as_ref()
            .filter(|s| {
                s.at.elapsed() <= within || mutation::on(Mutation::SightingTrustedHoweverOld)
            })
            .cloned()
    }
}
