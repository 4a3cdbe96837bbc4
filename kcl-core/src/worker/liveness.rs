//! Heartbeat rows ([`Liveness::Heartbeat`](crate::Liveness::Heartbeat)), and what every
//! worker, whatever its own mode, does about other workers' heartbeats.
//!
//! Under heartbeats a worker proves itself alive by renewing one row,
//! `kcl-coordination/worker/<id>`, every renew interval; the tenures of its leases are
//! derived from that row's (see [`tenure`](crate::lease::tenure)), so its leases are written
//! only when they move or are checkpointed.
//!
//! Three rules keep this as safe as per-lease renewals, for a fleet of either kind or both:
//!
//! - **Expiry** (`holder`): a lease is expired only when its own counter *and* its owner's
//!   heartbeat row (if the owner has one) have stood still for the failover time, as observed
//!   here.
//! - **Fence before taking**: a taker cannot make its take conditional on another row, so
//!   before it takes a lease from an owner with a heartbeat row it releases that row,
//!   conditionally on the counter it watched stand still. If that succeeds, no renewal the
//!   owner started before can apply any more, so the owner's validity ended at most 0.9 ×
//!   the failover time after its last successful renewal began, before the take. Without the
//!   fence, a renewal sent just before a long pause could land after the take and make a
//!   frozen owner valid again. An owner whose row the view does not show is looked up with a
//!   consistent read first: a view that lags must not hide a live heartbeat.
//! - **Handoffs**: owners under heartbeats no longer see handoff requests in their renewals,
//!   so whoever asks for one also flags the owner's heartbeat row (`handoffTo` on it); the
//!   owner sees the flag in its next heartbeat renewal, clears it, then reads its leases.
//!   Clearing first means a request made meanwhile flags the row again.
//!
//! A worker whose heartbeat is lost (fenced, or not renewed in time) loses every lease with
//! it, takes its row again, and takes back, each by a conditional write, the leases that still
//! name it. Rows are released, not deleted, by fences and on graceful shutdown, so that a
//! row's counter never starts again from zero where an observer could mistake the new row
//! for the old one standing still; the leader deletes released rows (and releases abandoned
//! ones) once they stood still for `lease_cleanup_delay`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::shards::Shards;
use super::table::Table;
use crate::error::ErrorKind;
use crate::lease::load::Figure;
use crate::lease::observer::Observer;
use crate::lease::tenure::{Taken, Tenure};
use crate::lease::{Lease, LeaseLoad, LeaseStore, renewer};
use crate::mutation::{self, Mutation};
use crate::singleton::{Carriers, heartbeat_key, heartbeat_of};
use crate::types::{Checkpoint, ShardId, WorkerId};

/// This worker's own liveness state: its heartbeat (under heartbeats), and the leases its
/// shard tasks could not hand back.
pub(super) struct HeartbeatState {
    current: Option<Heartbeat>,
    /// Leases whose shard task could not hand them back, to release again (under heartbeats
    /// nothing else would: their owner's heartbeat goes on).
    unreleased: Vec<ShardId>,
    /// Where the heartbeat is offered to carry the worker's roles.
    carriers: Arc<Carriers>,
}

/// This worker's heartbeat: the row's tenure and its renewer.
struct Heartbeat {
    tenure: Arc<Tenure>,
    _renewer: AbortOnDropHandle<()>,
    /// The heartbeat counter whose handoff flag was last acted on.
    flag_seen: Option<u64>,
}

impl HeartbeatState {
    /// No heartbeat yet; each one started is offered to `carriers`.
    pub(super) fn new(carriers: Arc<Carriers>) -> Self {
        Self {
            current: None,
            unreleased: Vec::new(),
            carriers,
        }
    }

    /// The heartbeat's tenure, which a lease's validity derives from under heartbeats.
    pub(super) fn tenure(&self) -> Option<&Arc<Tenure>> {
        self.current.as_ref().map(|h| &h.tenure)
    }

    /// Releases `leases` at the next cycle, if they still name this worker and it has not
    /// taken them again.
    pub(super) fn release_later(&mut self, leases: impl IntoIterator<Item = ShardId>) {
        self.unreleased.extend(leases);
    }
}

impl HeartbeatState {
    /// Under heartbeats, makes sure this worker has a live heartbeat, taking its row (again)
    /// if it has none. True if leases may be taken: always under per-lease renewals.
    pub(super) async fn ensure<L: LeaseStore>(&mut self, table: &Table<L>) -> bool {
        if table.config.liveness != crate::Liveness::Heartbeat {
            return true;
        }
        if self.current.as_ref().is_some_and(|h| h.tenure.is_valid()) {
            return true;
        }
        if let Some(old) = self.current.take() {
            // Ends every lease tenure derived from it, wherever its task is waiting.
            old.tenure.mark_lost();
            tracing::warn!("heartbeat lost: every lease went with it; taking them back");
        }
        let key = heartbeat_key(&table.me);
        let started = Instant::now();
        let row = match table.call("get", table.store.get(&key)).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                let row = Lease::new(key, Checkpoint::TrimHorizon);
                match table.call("create", table.store.create(&row)).await {
                    Ok(true) => row,
                    Ok(false) => return false, // created meanwhile: read it next cycle
                    Err(error) => {
                        tracing::warn!(%error, "creating the heartbeat row failed");
                        return false;
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "reading the heartbeat row failed");
                return false;
            }
        };
        let lease = match table.call("take", table.store.take(&row, &table.me)).await {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, "taking the heartbeat row failed");
                return false;
            }
        };
        let taken = Taken {
            lease,
            worker: table.me.clone(),
            store: table.store.clone(),
            started,
        };
        let figure = Figure::Worker(table.meters.clone());
        let tenure = Arc::new(Tenure::new(taken, table.timing()).with_figure(figure));
        self.carriers.offer(&tenure);
        let renew = renewer::run(tenure.clone(), table.config.renew_interval)
            .instrument(tracing::info_span!("heartbeat"));
        tracing::debug!("heartbeat started");
        self.current = Some(Heartbeat {
            tenure,
            _renewer: AbortOnDropHandle::new(crate::task::spawn(renew)),
            flag_seen: None,
        });
        true
    }

    /// Acts on a handoff flag on this worker's heartbeat row: clears it, then reads each held
    /// lease and hands over those asked for.
    pub(super) async fn follow_flag<L: LeaseStore>(&mut self, table: &Table<L>, held: &Shards) {
        let Some(heartbeat) = self.current.as_mut() else {
            return;
        };
        if heartbeat.tenure.handoff_requested().is_none() {
            return;
        }
        let row = heartbeat.tenure.snapshot().await;
        if row.handoff_to.is_none() || heartbeat.flag_seen == Some(row.counter) {
            return;
        }
        heartbeat.flag_seen = Some(row.counter);
        let clear = table.store.request_handoff(&row, None);
        if let Err(error) = table.call("request_handoff", clear).await {
            tracing::debug!(%error, "clearing the handoff flag failed");
        }
        for (key, held) in held.iter() {
            if held.control.is_handing_off() {
                continue;
            }
            match table.call("get", table.store.get(key)).await {
                Ok(Some(lease)) => {
                    if let Some(to) = lease.handoff_to.filter(|to| to != &table.me) {
                        tracing::info!(shard = %key, %to, "handing off as asked");
                        held.control.hand_off(to);
                    }
                }
                Ok(None) => {}
                Err(error) => tracing::debug!(shard = %key, %error, "reading a held lease failed"),
            }
        }
    }

    /// Releases the leases whose shard tasks could not hand them back, if they still name
    /// this worker and it has not taken them again; keeps those it could not release.
    pub(super) async fn release_left<L: LeaseStore>(&mut self, table: &Table<L>, held: &Shards) {
        let unreleased = &mut self.unreleased;
        for key in std::mem::take(&mut *unreleased) {
            if held.holds(&key) {
                continue;
            }
            let row = match table.call("get", table.store.get(&key)).await {
                Ok(Some(row)) if row.is_owned_by(&table.me) => row,
                Ok(_) => continue,
                Err(error) => {
                    tracing::debug!(shard = %key, %error, "reading a lease to release failed");
                    unreleased.push(key);
                    continue;
                }
            };
            match table.call("release", table.store.release(&row)).await {
                Ok(()) => tracing::info!(shard = %key, "lease released after a failed handback"),
                Err(error) if error.kind() == ErrorKind::Conflict => {}
                Err(error) => {
                    tracing::debug!(shard = %key, %error, "releasing a lease failed");
                    unreleased.push(key);
                }
            }
        }
    }

    /// On shutdown, once the leases are handed back: stops the heartbeat and releases its
    /// row (leases a shutdown cut short left behind then expire by their own counters).
    pub(super) async fn end(&mut self) {
        let Some(Heartbeat {
            tenure, _renewer, ..
        }) = self.current.take()
        else {
            return;
        };
        drop(_renewer);
        match tenure.release().await {
            Ok(()) => tracing::debug!("heartbeat row released"),
            Err(error) => tracing::debug!(?error, "releasing the heartbeat row failed"),
        }
    }
}

/// Other workers' heartbeat rows, as the last read of the table showed them, and which of
/// their owners this worker fenced (or decided not to) since.
#[derive(Default)]
pub(super) struct Heartbeats {
    rows: BTreeMap<WorkerId, Lease>,
    fenced: BTreeMap<WorkerId, bool>,
    /// Lease owners whose heartbeat row was absent from every read since then (on the local
    /// clock): deleted by hand, or never made (a per-lease owner).
    absent: BTreeMap<WorkerId, Instant>,
}

impl Heartbeats {
    /// A new read of the table at `now`: its heartbeat rows replace the last ones, and
    /// owners are fenced afresh.
    pub(super) fn saw(&mut self, leases: &[Lease], now: Instant) {
        self.rows = leases
            .iter()
            .filter_map(|l| heartbeat_of(&l.key).map(|w| (w, l.clone())))
            .collect();
        self.fenced.clear();
        let owners: std::collections::BTreeSet<&WorkerId> = leases
            .iter()
            .filter(|l| heartbeat_of(&l.key).is_none())
            .filter_map(|l| l.owner.as_ref())
            .filter(|w| !self.rows.contains_key(*w))
            .collect();
        self.absent.retain(|w, _| owners.contains(w));
        for owner in owners {
            self.absent.entry(owner.clone()).or_insert(now);
        }
    }

    /// How long `owner`'s heartbeat row has been absent from every read, if it is: a row
    /// deleted under a live worker must not make its leases look dead at once (the worker
    /// goes on until its next renewal finds the row gone), so its absence counts as a row
    /// that stood still only from when it was first seen absent.
    pub(super) fn absent_for(&self, owner: &WorkerId, now: Instant) -> Option<std::time::Duration> {
        let since = self.absent.get(owner)?;
        Some(now.saturating_duration_since(*since))
    }

    /// The load figures the live heartbeat rows carry: each worker's total (see
    /// [`load`](crate::lease::load)).
    pub(super) fn totals(&self) -> BTreeMap<WorkerId, LeaseLoad> {
        self.rows
            .iter()
            .filter(|(w, row)| row.is_owned_by(w))
            .filter_map(|(w, row)| Some((w.clone(), row.load?)))
            .collect()
    }

    /// `owner`'s heartbeat row, if the last read showed it held by `owner`.
    pub(super) fn live(&self, owner: &WorkerId) -> Option<&Lease> {
        self.rows.get(owner).filter(|row| row.is_owned_by(owner))
    }

    /// Whether a lease of `owner` (not this worker) may be taken now that it looks expired:
    /// after releasing `owner`'s heartbeat row, if it has one (see the module docs). Decided
    /// once per owner per read of the table.
    pub(super) async fn fence<L: LeaseStore>(
        &mut self,
        table: &Table<L>,
        owner: &WorkerId,
    ) -> bool {
        if let Some(&decided) = self.fenced.get(owner) {
            return decided;
        }
        let decided = match self.rows.get(owner) {
            Some(_) if mutation::on(Mutation::TakeWithoutFence) => true,
            Some(row) if row.is_owned_by(owner) => {
                match table.call("release", table.store.release(row)).await {
                    Ok(()) => {
                        tracing::info!(%owner, "heartbeat stopped: row released, its leases may move");
                        true
                    }
                    Err(error) => {
                        tracing::debug!(%owner, %error, "heartbeat row moved; not taking");
                        false
                    }
                }
            }
            Some(_) => true,
            // Not in the view: a lagging view must not hide a live heartbeat.
            None => match table
                .call("get", table.store.get(&heartbeat_key(owner)))
                .await
            {
                Ok(row) => row.is_none_or(|r| !r.is_owned_by(owner)),
                Err(error) => {
                    tracing::debug!(%owner, %error, "reading a heartbeat row failed");
                    false
                }
            },
        };
        self.fenced.insert(owner.clone(), decided);
        decided
    }

    /// After a handoff request for a lease of `owner`: flags `owner`'s heartbeat row, if it
    /// has one not flagged yet, so that it looks (see the module docs).
    pub(super) async fn flag<L: LeaseStore>(&self, table: &Table<L>, owner: &WorkerId) {
        let Some(row) = self.rows.get(owner) else {
            return;
        };
        if !row.is_owned_by(owner) || row.handoff_to.is_some() {
            return;
        }
        let flag = table.store.request_handoff(row, Some(&table.me));
        if let Err(error) = table.call("request_handoff", flag).await {
            tracing::debug!(%owner, %error, "flagging a heartbeat row failed");
        }
    }

    /// Flags the heartbeat rows of owners with handoff requests pending in `leases`, where
    /// the flag is not up: a request whose flag was lost (a write that timed out, a flag
    /// cleared just before it) would otherwise never reach an owner that renews no lease.
    pub(super) async fn flag_pending<L: LeaseStore>(&self, table: &Table<L>, leases: &[Lease]) {
        let mut owners: Vec<&WorkerId> = leases
            .iter()
            .filter(|l| l.handoff_to.is_some() && l.handoff_to != l.owner)
            .filter_map(|l| l.owner.as_ref())
            .filter(|o| *o != &table.me)
            .collect();
        owners.sort();
        owners.dedup();
        for owner in owners {
            self.flag(table, owner).await;
        }
    }

    /// Cleans up heartbeat rows that stood still for `lease_cleanup_delay`: releases those
    /// still naming a worker (one that died holding nothing anyone took), deletes released
    /// ones. The leader's, or every worker's under `EveryWorker`.
    pub(super) async fn clean<L: LeaseStore>(&self, table: &Table<L>, observer: &Observer) {
        let now = Instant::now();
        let delay = table.config.lease_cleanup_delay;
        let stale = self
            .rows
            .values()
            .filter(|row| observer.idle(row, now) >= delay);
        for row in stale {
            let result = if row.owner.is_some() {
                table.call("release", table.store.release(row)).await
            } else {
                table.call("delete", table.store.delete(row)).await
            };
            match result {
                Ok(()) => tracing::info!(key = %row.key, "stale heartbeat row cleaned up"),
                Err(error) if error.kind() == ErrorKind::Conflict => {}
                Err(error) => tracing::debug!(key = %row.key, %error, "cleanup failed"),
            }
        }
    }
}
