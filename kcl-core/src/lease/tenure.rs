//! One period of holding one lease: the single writer of that lease inside this worker.
//!
//! Renewals, checkpoints and the final release of a lease all bump its counter, and each is
//! conditional on the counter the previous one produced. If they ran concurrently they would
//! fail each other's condition and report a lease lost that was never lost. So every write of
//! a held lease goes through its `Tenure`, which serialises them behind one async mutex and
//! carries the counter forward. A lease taken again later gets a new `Tenure`, so a processor
//! of the old tenure can never write with the new counter.
//!
//! Validity: a renewal that *started* at `t` proves that nobody can take the lease before
//! `t + failover_time` (others need to see the new counter stand still that long). The tenure
//! keeps that deadline, less a safety margin, and the consumer delivers nothing after it:
//! [`Tenure::expired`] resolves at that deadline, and a processor hook still running then is
//! dropped.
//!
//! Every write is bounded by the call timeout, so a hung store cannot hold the tenure's lock
//! (and with it every renewal) forever.
//!
//! Under [`Liveness::Heartbeat`](crate::Liveness::Heartbeat) a lease's tenure is *derived*
//! from the worker's heartbeat tenure: nothing renews the lease itself, its validity is the
//! heartbeat's, and it is lost when the heartbeat is (the worker then takes its leases again,
//! each by a conditional write, under a new heartbeat).
//!
//! A tenure may also *carry* another row's validity ([`Tenure::carry`]): a worker's role row
//! names a lease (or heartbeat row) its holder renews anyway, and each renewal or checkpoint
//! of that lease proves the role too. Only while the proof is unbroken: a write proves the
//! role if its answer came before the role's validity ran out (a role that lapsed stays
//! lapsed, whatever the carrier does later; see `singleton/carried.rs` for why that is needed).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as SyncMutex, Weak};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::load::{Figure, Meter};
use super::validity::Validity;
use super::{CheckpointUpdate, Lease};
use crate::error::{BackendError, ErrorKind};
use crate::mutation::{self, Mutation};
use crate::task::bounded;
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

pub(crate) use self::transact::Transacted;
pub(crate) use super::held::HeldLeaseStore;

mod sink;
mod transact;

/// Why a write through a tenure failed.
#[derive(Debug)]
pub(crate) enum TenureError {
    /// The lease is no longer ours.
    Lost,
    /// The checkpoint would move backwards from the stored one (given).
    Behind(Checkpoint),
    /// The store failed; the lease may still be ours.
    Store(BackendError),
}

struct Held {
    lease: Lease,
    /// The last write failed in a way that may have applied it (timeout, 5xx), so the stored
    /// counter may be ahead of ours.
    uncertain: bool,
    /// A commit was given up without knowing whether it applied (see `transact`): the
    /// row's checkpoint may be ahead of ours, with the counter unchanged.
    commit_unknown: bool,
}

#[derive(Clone, Copy)]
enum Write<'a> {
    Renew,
    Checkpoint(&'a CheckpointUpdate),
    HandOff(&'a WorkerId),
    Release,
    /// The last write before a restart: the row as it is, marked kept for `grace`.
    Keep(Duration),
}

/// A role carried by a tenure, until this is dropped (see [`Tenure::carry`]).
pub(crate) struct Carry(Arc<AtomicBool>);

impl Drop for Carry {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A held lease. See the module docs.
pub(crate) struct Tenure {
    shard: ShardId,
    worker: WorkerId,
    store: Arc<dyn HeldLeaseStore>,
    /// The fence of this tenure (see [`FencingToken`]).
    fence: FencingToken,
    held: Mutex<Held>,
    valid_until: Arc<Validity>,
    call_timeout: Duration,
    lost: CancellationToken,
    /// The heartbeat this tenure's validity comes from, if it is derived (see module docs).
    heartbeat: Option<Arc<Tenure>>,
    /// What the lease (or, for a heartbeat row, the worker) costs, written with each renewal
    /// and checkpoint.
    figure: Option<Figure>,
    /// The validities this tenure's writes prove too, each while its [`Carry`] lives.
    carried: SyncMutex<Vec<(Weak<Validity>, Arc<AtomicBool>)>>,
}

impl std::fmt::Debug for Tenure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenure")
            .field("shard", &self.shard)
            .field("worker", &self.worker)
            .finish()
    }
}

/// A lease just taken: what a [`Tenure`] starts from.
pub(crate) struct Taken {
    /// The lease as the successful take returned it.
    pub(crate) lease: Lease,
    /// Who took it.
    pub(crate) worker: WorkerId,
    /// Where its writes go.
    pub(crate) store: Arc<dyn HeldLeaseStore>,
    /// When the take was sent: validity counts from there, not from its answer.
    pub(crate) started: Instant,
}

/// How long a tenure lasts and how long each of its writes may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// The fleet's failover time: a lease whose counter stood still this long may be taken.
    pub(crate) failover_time: Duration,
    /// After this, a write is given up (and its outcome is uncertain).
    pub(crate) call_timeout: Duration,
}

impl Tenure {
    /// Starts a tenure from a lease just taken.
    pub(crate) fn new(taken: Taken, timing: Timing) -> Self {
        let Taken {
            lease,
            worker,
            store,
            started,
        } = taken;
        let failover_time = timing.failover_time;
        // Every kcl take writes the fence; a store that does not keep it (or a row whose
        // take was not a kcl one) falls back on the counter the take left, the same value.
        let fence = lease.fence.unwrap_or(FencingToken(lease.counter));
        // A tenth of the failover time absorbs clock-rate differences between machines.
        let validity = failover_time - failover_time / 10;
        Self {
            shard: lease.key.clone(),
            worker,
            store,
            fence,
            held: Mutex::new(Held {
                lease,
                uncertain: false,
                commit_unknown: false,
            }),
            valid_until: Arc::new(Validity::new(started + validity, validity)),
            call_timeout: timing.call_timeout,
            lost: CancellationToken::new(),
            heartbeat: None,
            figure: None,
            carried: SyncMutex::new(Vec::new()),
        }
    }

    /// Writes `figure` with each renewal and checkpoint (see [`load`](super::load)).
    pub(crate) fn with_figure(mut self, figure: Figure) -> Self {
        self.figure = Some(figure);
        self
    }

    /// What measures the lease's load, if anything does.
    pub(crate) fn meter(&self) -> Option<&Meter> {
        match &self.figure {
            Some(Figure::Lease(meter)) => Some(meter),
            _ => None,
        }
    }

    /// The lease's meter, to share with what reads the shard.
    pub(crate) fn shared_meter(&self) -> Option<Arc<Meter>> {
        match &self.figure {
            Some(Figure::Lease(meter)) => Some(meter.clone()),
            _ => None,
        }
    }

    /// This tenure's validity, for a tenure that carries it ([`carry`](Self::carry)).
    pub(crate) fn validity(&self) -> Arc<Validity> {
        self.valid_until.clone()
    }

    /// From now on, until the returned [`Carry`] is dropped, every renewal and checkpoint of
    /// this lease (writes that keep it this worker's) proves `role` too, under the rule of
    /// the module docs. Handoffs and releases prove nothing: they give the row away.
    pub(crate) fn carry(&self, role: &Arc<Validity>) -> Carry {
        let on = Arc::new(AtomicBool::new(true));
        let mut carried = self
            .carried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        carried.retain(|(v, on)| on.load(Ordering::Acquire) && v.strong_count() > 0);
        carried.push((Arc::downgrade(role), on.clone()));
        Carry(on)
    }

    /// A write of this lease that keeps it ours, started at `started`, just succeeded.
    fn prove_carried(&self, started: Instant) {
        let answered = Instant::now();
        let carried = self
            .carried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (role, on) in carried.iter() {
            if let Some(role) = role.upgrade().filter(|_| on.load(Ordering::Acquire)) {
                role.proved(started, answered);
            }
        }
    }

    /// As [`new`](Self::new), deriving validity from `heartbeat`: this tenure is valid while
    /// the heartbeat is, and lost when it is lost.
    pub(crate) fn derived(taken: Taken, heartbeat: Arc<Tenure>, call_timeout: Duration) -> Self {
        let lost = heartbeat.lost.child_token();
        // Its own validity is nothing: the heartbeat's is what counts.
        let timing = Timing {
            failover_time: Duration::ZERO,
            call_timeout,
        };
        let mut tenure = Self::new(taken, timing);
        tenure.lost = lost;
        tenure.heartbeat = Some(heartbeat);
        tenure
    }

    /// True if something else (the heartbeat) keeps this tenure valid: nothing renews it.
    pub(crate) fn is_derived(&self) -> bool {
        self.heartbeat.is_some()
    }

    pub(crate) fn shard(&self) -> &ShardId {
        &self.shard
    }

    pub(crate) fn worker(&self) -> &WorkerId {
        &self.worker
    }

    pub(crate) fn store(&self) -> &dyn HeldLeaseStore {
        &*self.store
    }

    /// Cancelled once the lease is known or assumed lost.
    pub(crate) fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Until when this worker may act as the owner without another successful write.
    pub(crate) fn valid_until(&self) -> Instant {
        if let Some(heartbeat) = &self.heartbeat {
            return heartbeat.valid_until();
        }
        self.valid_until.until()
    }

    /// True if the lease is held and its validity has not run out.
    pub(crate) fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.valid_until()
    }

    /// Gives the lease up locally (validity ran out, or a write lost its condition).
    pub(crate) fn mark_lost(&self) {
        self.lost.cancel();
    }

    /// Resolves once the lease is lost, or its validity runs out without a successful write
    /// (then it marks the lease lost): from then on another worker may hold it.
    pub(crate) async fn expired(&self) {
        loop {
            let until = self.valid_until();
            tokio::select! {
                biased;
                () = self.lost.cancelled() => return,
                () = sleep_until(until) => {
                    if Instant::now() >= self.valid_until() {
                        self.mark_lost();
                        return;
                    }
                }
            }
        }
    }

    /// Runs `work` while the lease is valid: `None` once it is lost or its validity ran out,
    /// and `work` is dropped. The deadline is compared with the clock at every poll, not only
    /// when its timer fires: a process that thaws after a freeze polls the work it woke
    /// before the runtime fires any timer, and that work must not go on past the validity.
    pub(crate) async fn while_valid<F: Future>(&self, work: F) -> Option<F::Output> {
        if mutation::on(Mutation::HooksOutliveLease) || mutation::on(Mutation::SkipValidityCheck) {
            return Some(work.await);
        }
        let started = Instant::now();
        let mut work = std::pin::pin!(work);
        let mut expired = std::pin::pin!(self.expired());
        let outcome = std::future::poll_fn(|cx| {
            if !self.is_valid() && !mutation::on(Mutation::ValidityByTimerOnly) {
                self.mark_lost();
                return std::task::Poll::Ready(None);
            }
            if expired.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(None);
            }
            work.as_mut().poll(cx).map(Some)
        })
        .await;
        // Every hook and `Parallel` handler runs here: their time is the lease's busy time.
        if let Some(meter) = self.meter() {
            meter.busy(started.elapsed());
        }
        outcome
    }

    /// This tenure's fence: the counter its take wrote (see [`FencingToken`]).
    pub(crate) fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The lease as last written by this tenure.
    pub(crate) async fn snapshot(&self) -> Lease {
        self.held.lock().await.lease.clone()
    }

    /// The lease's checkpoint as last written or read; `None` while a write is under way.
    pub(crate) fn checkpoint_now(&self) -> Option<Checkpoint> {
        Some(self.held.try_lock().ok()?.lease.checkpoint.clone())
    }

    /// The parked-key entries of the row as last written or renewed; `None` while a write is
    /// under way.
    pub(crate) fn parked_now(&self) -> Option<Vec<String>> {
        Some(self.held.try_lock().ok()?.lease.parked_keys.clone())
    }

    /// Reads the row again for its parked-key entries, which an operator's unpark changes
    /// without a write of ours (under heartbeats no renewal reads the row): adopted while the
    /// row is still this tenure's (same owner and counter).
    pub(crate) async fn refresh_parked(&self) -> Result<(), BackendError> {
        let row = self.store.get(self.shard()).await?;
        let mut held = self.held.lock().await;
        if let Some(row) =
            row.filter(|r| r.owner == held.lease.owner && r.counter == held.lease.counter)
        {
            held.lease.parked_keys = row.parked_keys;
        }
        Ok(())
    }

    /// Removes `entries` from the row's parked keys (a redrive done: the key's letters were
    /// replayed), without a fenced write: the counter stays, and so do the holder's writes.
    pub(crate) async fn unpark(&self, entries: &[String]) -> Result<(), BackendError> {
        self.store.unpark(self.shard(), entries).await?;
        self.held
            .lock()
            .await
            .lease
            .parked_keys
            .retain(|e| !entries.contains(e));
        Ok(())
    }

    /// Replaces the entry `old` by `new` in the row's parked keys (a redrive's request, its
    /// count of letters lowered as they are replayed): `new` added while `old` is there, then
    /// `old` removed; a crash between leaves both, and the lower count is the one that holds.
    pub(crate) async fn replace_entry(&self, old: &str, new: &str) -> Result<(), BackendError> {
        if self.store.request_redrive(self.shard(), old, new).await? {
            let parked = &mut self.held.lock().await.lease.parked_keys;
            if !parked.iter().any(|e| e == new) {
                parked.push(new.to_owned());
            }
        }
        self.unpark(&[old.to_owned()]).await
    }

    /// Who asked, in the row as last written, for this lease to be handed over; `None` also
    /// while a write is under way (it is looked at again next cycle).
    pub(crate) fn handoff_requested(&self) -> Option<WorkerId> {
        self.held.try_lock().ok()?.lease.handoff_to.clone()
    }

    pub(crate) async fn renew(&self) -> Result<Lease, TenureError> {
        self.write(Write::Renew).await
    }

    pub(crate) async fn checkpoint(&self, update: &CheckpointUpdate) -> Result<Lease, TenureError> {
        self.write(Write::Checkpoint(update)).await
    }

    /// Settles a write whose outcome is unknown (the store's answer was lost, or the call
    /// timed out) before anything reads the lease as this tenure knows it: a renewal from
    /// the counter held either succeeds, and fences the unknown write off for good (it was
    /// conditional on that counter, so a straggler can no longer land), or finds the row one
    /// write further, which is the unknown write applied (a `SHARD_END`, a checkpoint), and
    /// adopts it. Without this, a processor restarted after such a write would read the
    /// shard again from the checkpoint the row has left behind — a parent after its
    /// children had started, when the write was its `SHARD_END`.
    pub(crate) async fn settle(&self) -> Result<(), TenureError> {
        if !self.held.lock().await.uncertain || mutation::on(Mutation::UncertainWriteIgnored) {
            return Ok(());
        }
        self.write(Write::Renew).await.map(drop)
    }

    /// Hands the lease to `to` (a planned rebalance). Ends the tenure.
    pub(crate) async fn hand_off(&self, to: &WorkerId) -> Result<(), TenureError> {
        let result = self.write(Write::HandOff(to)).await.map(drop);
        self.mark_lost();
        result
    }

    /// Releases the lease so that any worker may take it at once. Ends the tenure.
    pub(crate) async fn release(&self) -> Result<(), TenureError> {
        let result = self.write(Write::Release).await.map(drop);
        self.mark_lost();
        result
    }

    /// Keeps the lease through this worker's restart: its last write marks the row
    /// ([`Lease::restart_grace`]) so that others wait `grace` longer than the failover time
    /// before they take it, and the same worker id resumes it when it comes back. The row keeps
    /// its checkpoints. Ends the tenure: nothing is delivered after the mark.
    pub(crate) async fn keep_for_restart(&self, grace: Duration) -> Result<(), TenureError> {
        let result = self.write(Write::Keep(grace)).await.map(drop);
        self.mark_lost();
        result
    }

    async fn write(&self, op: Write<'_>) -> Result<Lease, TenureError> {
        let mut held = self.held.lock().await;
        // Retried at most once, after reconciling an uncertain earlier write.
        for _ in 0..2 {
            if self.is_lost() {
                return Err(TenureError::Lost);
            }
            let started = Instant::now();
            if matches!(op, Write::Checkpoint(_) | Write::Keep(_)) {
                self.learn_commit(&mut held).await?;
            }
            if let Write::Checkpoint(update) = op {
                // Checked under the lock against the latest row this worker knows, so that a
                // retry after an uncertain write can never move a checkpoint back.
                behind(update, &held.lease.checkpoint)?;
            }
            // Uncertain until the store answers: if this future is dropped mid-call (a timeout,
            // a cancelled task), the write may have applied and the next one must reconcile.
            let was_uncertain = std::mem::replace(&mut held.uncertain, true);
            match self.send(op, held.lease.clone()).await {
                Ok(lease) => {
                    held.lease = lease;
                    held.uncertain = false;
                    // A write of a lease proves nothing about it under heartbeats.
                    if self.heartbeat.is_none() {
                        self.valid_until.wrote(started);
                        if matches!(op, Write::Renew | Write::Checkpoint(_)) {
                            self.prove_carried(started);
                        }
                    }
                    return Ok(held.lease.clone());
                }
                Err(e) if e.kind() == ErrorKind::Conflict && was_uncertain => {
                    self.reconcile(&mut held).await?;
                }
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    held.uncertain = false;
                    self.mark_lost();
                    self.name_a_twin();
                    return Err(TenureError::Lost);
                }
                Err(e) => {
                    held.uncertain = true;
                    return Err(TenureError::Store(e));
                }
            }
        }
        Err(TenureError::Lost)
    }

    /// One write to the store, conditional on `lease` (the row as this worker knows it).
    async fn send(&self, op: Write<'_>, mut lease: Lease) -> Result<Lease, BackendError> {
        let store = &*self.store;
        if let (Write::Renew | Write::Checkpoint(_), Some(figure)) = (op, &self.figure) {
            let load = figure.report();
            if let Figure::Lease(_) = figure {
                load.export(&self.shard);
            }
            lease.load = Some(load);
        }
        let limit = self.call_timeout;
        match op {
            Write::Renew => bounded(limit, "renew", store.renew(&lease)).await,
            Write::Checkpoint(update) => {
                bounded(limit, "checkpoint", store.checkpoint(&lease, update)).await
            }
            Write::HandOff(to) => bounded(limit, "take", store.take(&lease, to)).await,
            Write::Release => bounded(limit, "release", store.release(&lease))
                .await
                .map(|()| lease),
            Write::Keep(grace) => {
                let mut update = CheckpointUpdate::new(lease.checkpoint.clone());
                update.pending = lease.pending_checkpoint.clone();
                // The same checkpoint: the records finished past it still stand.
                update.acked = lease.acked.clone();
                update.restart_grace = Some(grace);
                bounded(limit, "checkpoint", store.checkpoint(&lease, &update)).await
            }
        }
    }

    /// After a conflict: a row that still names this worker was written by another process
    /// running under its id (or given back to it by the leader after its renewals stalled
    /// past the failover time). Two processes with one id take each other's leases all the
    /// time, and each loss would otherwise read as an ordinary one; said at WARN, at the cost
    /// of one read per lease lost, made apart so that the caller learns of the loss at once.
    fn name_a_twin(&self) {
        let (store, shard, worker) = (self.store.clone(), self.shard.clone(), self.worker.clone());
        let limit = self.call_timeout;
        tokio::spawn(async move {
            let read = bounded(limit, "get", store.get(&shard)).await;
            if let Ok(Some(row)) = read
                && row.is_owned_by(&worker)
            {
                tracing::warn!(
                    %shard,
                    %worker,
                    "lease lost to a write naming this worker's own id: another process runs \
                     as this worker (two processes given one id, or an old one still running \
                     after a restart replaced it), or the leader gave the lease back after \
                     this worker's renewals stalled; give each process its own id"
                );
            }
        });
    }

    /// After a conflict that followed an uncertain write: finds out whether that write
    /// applied. Our own writes keep us as owner and move the counter by exactly one, and at
    /// most one of them can apply from the counter we hold (each is conditional on it).
    /// Anyone else who writes us as owner (a leader assigning the lease back to us, an owner
    /// granting a handoff) does so from a row that already moved on: the counter is further
    /// along. So a row naming us exactly one further was advanced by our uncertain write, and
    /// the write is retried from it; anything else means the lease is lost.
    async fn reconcile(&self, held: &mut Held) -> Result<(), TenureError> {
        let read = bounded(self.call_timeout, "get", self.store.get(&self.shard)).await;
        match read {
            Ok(Some(row))
                if (row.is_owned_by(&self.worker) && row.counter == held.lease.counter + 1)
                    || mutation::on(Mutation::ReconcileAnyRow) =>
            {
                held.lease = row;
                held.uncertain = false;
                Ok(())
            }
            Ok(_) => {
                self.mark_lost();
                Err(TenureError::Lost)
            }
            Err(read) => Err(TenureError::Store(read)),
        }
    }
}

/// Refuses a checkpoint behind `current`, the checkpoint of the row as this worker knows it
/// (the same one again is allowed: a write that changes nothing).
fn behind(update: &CheckpointUpdate, current: &Checkpoint) -> Result<(), TenureError> {
    let back = update
        .checkpoint
        .progress_cmp(current)
        .is_none_or(std::cmp::Ordering::is_lt);
    if back && update.checkpoint != *current {
        return Err(TenureError::Behind(current.clone()));
    }
    Ok(())
}
