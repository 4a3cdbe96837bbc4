//! A tenure's transactional commits: a processor's writes and a checkpoint in one
//! transaction (see [`outputs`](crate::outputs) for why the condition is the owner, the
//! fence and the checkpoint before, and never the counter).
//!
//! Before a commit, a plain write of the tenure whose answer was lost is settled (see
//! [`Tenure::settle`]): conditioned on the counter, which commits leave alone, it could
//! otherwise land after the commit and move the checkpoint back behind its outputs.
//!
//! Each attempt of a commit runs behind the tenure's lock, so this worker's own renewals and
//! checkpoints of the lease never race it (the lock is let go between attempts, so that a
//! commit retried under throttling does not hold renewals back). An attempt whose outcome is unknown (a timeout, a lost answer)
//! is retried with the same token and the same `before`: it applies at most once, and a row
//! found one commit further with this tenure's owner and fence is that attempt applied. A
//! commit refused by a write's own condition, or refused as invalid, is definite: nothing
//! applied, so it is neither retried nor read back; the caller learns which write, when the
//! store said (an invalid checkpoint without writes is the store's error: no record is at
//! fault).
//!
//! Every commit is counted once by its outcome, and every attempt retried once more
//! ([`metrics::OUTPUT_COMMITS`](crate::metrics::OUTPUT_COMMITS)), and its time from call to outcome
//! measured ([`metrics::OUTPUT_COMMIT_DURATION`](crate::metrics::OUTPUT_COMMIT_DURATION)): here,
//! where the retries happen and the outcome is learned, so that a processor's commits and
//! `Parallel`'s committer's are counted alike.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::MutexGuard;
use tokio::time::Instant;

use super::{Held, Tenure, TenureError};
use crate::error::{BackendError, ErrorKind};
use crate::lease::positions::Sink;
use crate::lease::transact::{self, Commit, CommitError, Transact};
use crate::lease::{CheckpointUpdate, Lease};
use crate::metrics::{OUTPUT_COMMIT_DURATION, OUTPUT_COMMITS};
use crate::task::bounded;
use crate::types::{Checkpoint, ExtendedSequenceNumber};

/// What a commit came to, short of an error.
#[derive(Debug)]
pub(crate) enum Transacted {
    /// Writes and checkpoint applied (now, or by an earlier attempt whose answer was lost).
    Applied,
    /// Write `index` failed its own condition: nothing applied.
    Refused { index: usize, reason: String },
    /// The store refused the writes as invalid (write `index`, if it named one): nothing
    /// applied, and the same writes can never apply.
    Invalid {
        index: Option<usize>,
        reason: String,
    },
}

/// Attempts of one commit before its error is the caller's.
const ATTEMPTS: usize = 6;

/// The pauses between the attempts of one commit.
fn pauses() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .with_max_times(ATTEMPTS - 1)
        .build()
}

impl Tenure {
    /// Commits `writes` with `update` in one transaction of `store`, conditioned on this
    /// tenure's owner and fence and on the checkpoint it last wrote. See the module docs.
    /// `sink` is the worker's sink that keeps positions, if it was given one: a commit into
    /// a store that keeps its own position which the sink refused opens it again (see
    /// [`sink_refused`](Self::sink_refused)).
    pub(crate) async fn transact<T: Transact>(
        &self,
        store: &T,
        update: &CheckpointUpdate,
        writes: &[T::Write],
        (first, sink): (Option<&ExtendedSequenceNumber>, Option<&Sink>),
    ) -> Result<Transacted, TenureError> {
        let started = Instant::now();
        let outcome = self.commit(store, update, writes, (first, sink)).await;
        ::metrics::counter!(OUTPUT_COMMITS, "outcome" => counted_as(&outcome)).increment(1);
        ::metrics::histogram!(OUTPUT_COMMIT_DURATION).record(started.elapsed().as_secs_f64());
        outcome
    }

    /// [`transact`](Self::transact), uncounted.
    async fn commit<T: Transact>(
        &self,
        store: &T,
        update: &CheckpointUpdate,
        writes: &[T::Write],
        (first, sink): (Option<&ExtendedSequenceNumber>, Option<&Sink>),
    ) -> Result<Transacted, TenureError> {
        // Settled first, so that `before` is the row as it stands: a write of this tenure
        // whose answer was lost (the lease's checkpoint following a sink's commit) may have
        // moved it.
        self.settle().await?;
        let mut before = self.before(update, first).await?;
        let token = transact::token(&self.shard, self.fence, &before, update);
        let mut pauses = pauses();
        loop {
            // A fence against a straggler of a plain write (see the module docs), before
            // every attempt: another write may have lost its answer between two.
            self.settle().await?;
            // Taken per attempt, not across the pauses between them: renewals go on meanwhile.
            let mut held = self.held.lock().await;
            self.still(&held, &before)?;
            let commit = Commit {
                shard: &self.shard,
                owner: &self.worker,
                fence: self.fence,
                before: &before,
                update,
                writes: writes.to_vec(),
                token: token.clone(),
            };
            let sent;
            (sent, held) = self.send_commit(store, commit, held).await;
            let error = match sent {
                Ok(Ok(())) if store.keeps_position() => {
                    drop(held);
                    self.follow(update).await;
                    return Ok(Transacted::Applied);
                }
                Ok(Ok(())) => {
                    update.apply_to(&mut held.lease);
                    return Ok(Transacted::Applied);
                }
                Ok(Err(CommitError::Refused { index, reason })) => {
                    return Ok(Transacted::Refused { index, reason });
                }
                // Definite, as a refusal: nothing applied, so no retry and no read of the row.
                Ok(Err(CommitError::Invalid { index, reason })) if !writes.is_empty() => {
                    return Ok(Transacted::Invalid { index, reason });
                }
                Ok(Err(CommitError::Invalid { reason, .. })) => {
                    return Err(self.checkpoint_invalid(&reason));
                }
                Ok(Err(CommitError::LeaseRow)) if store.keeps_position() => {
                    drop(held);
                    // Opened again (and the lease brought up to the sink): once more from
                    // where the lease now stands, if the writes all come after it.
                    let refusal = self.sink_refused(update, sink).await?;
                    if pauses.next().is_none() {
                        return Err(refusal);
                    }
                    before = self.before(update, first).await?;
                    continue;
                }
                Ok(Err(CommitError::LeaseRow)) => {
                    return self.refused_by_row(&mut held.lease, update).await;
                }
                Ok(Err(CommitError::Store(e))) | Err(e) => e,
            };
            let retried = matches!(error.kind(), ErrorKind::Retryable | ErrorKind::Throttled);
            match pauses.next().filter(|_| retried) {
                Some(pause) => {
                    ::metrics::counter!(OUTPUT_COMMITS, "outcome" => "retried").increment(1);
                    drop(held);
                    tokio::time::sleep(pause).await;
                }
                None => return self.give_up(&mut held, update, error).await,
            }
        }
    }

    /// Whether the tenure still holds the lease at `before`: another write of this tenure may
    /// have moved the checkpoint between two attempts.
    fn still(&self, held: &Held, before: &Checkpoint) -> Result<(), TenureError> {
        if self.is_lost() {
            return Err(TenureError::Lost);
        }
        if held.lease.checkpoint != *before {
            return Err(TenureError::Behind(held.lease.checkpoint.clone()));
        }
        Ok(())
    }

    /// Sends one attempt of a commit, bounded by the call timeout, behind the tenure's lock
    /// `held` — except a sink's: conditioned on its own row, not the lease row, it lets the
    /// lease's renewals go on while it runs (a slow one would cost the lease).
    async fn send_commit<'a, T: Transact>(
        &'a self,
        store: &T,
        commit: Commit<'_, T::Write>,
        held: MutexGuard<'a, Held>,
    ) -> (
        Result<Result<(), CommitError>, BackendError>,
        MutexGuard<'a, Held>,
    ) {
        let send = bounded(self.call_timeout, "transact", async {
            Ok(store.commit(commit).await)
        });
        if !store.keeps_position() {
            return (send.await, held);
        }
        drop(held);
        let sent = send.await;
        (sent, self.held.lock().await)
    }

    /// A commit without writes refused as invalid: the checkpoint alone, so no record's
    /// writes are at fault; the store's error.
    fn checkpoint_invalid(&self, reason: &str) -> TenureError {
        let what = format!(
            "the checkpoint of lease {} refused as invalid: {reason}",
            self.shard
        );
        TenureError::Store(BackendError::new(ErrorKind::Fatal, "transact", what))
    }

    /// The checkpoint a commit of `update` must find: the one this tenure knows, refused if
    /// `update` is behind it or the writes' `first` record is at or before it (a caller that
    /// chose them from an older checkpoint, which another commit moved meanwhile).
    async fn before(
        &self,
        update: &CheckpointUpdate,
        first: Option<&ExtendedSequenceNumber>,
    ) -> Result<Checkpoint, TenureError> {
        let held = self.held.lock().await;
        super::behind(update, &held.lease.checkpoint)?;
        if let (Some(first), Checkpoint::Sequence(at)) = (first, &held.lease.checkpoint)
            && first <= at
        {
            return Err(TenureError::Behind(held.lease.checkpoint.clone()));
        }
        Ok(held.lease.checkpoint.clone())
    }

    /// The last attempt failed with `error`: the outcome may be unknown, so the row is read
    /// before the caller reads on; still unknown, the next checkpoint write reads it first.
    async fn give_up(
        &self,
        held: &mut Held,
        update: &CheckpointUpdate,
        error: BackendError,
    ) -> Result<Transacted, TenureError> {
        match self.settle_commit(&mut held.lease, update).await {
            Ok(applied) => Ok(applied),
            Err(TenureError::Lost) => Err(TenureError::Lost),
            Err(TenureError::Store(_)) => {
                held.commit_unknown = true;
                Err(TenureError::Store(error))
            }
            Err(_) => Err(TenureError::Store(error)),
        }
    }

    /// Before a plain write of the checkpoint, after a commit given up without knowing
    /// whether it applied: reads the row and adopts its checkpoint if this tenure still holds
    /// it. A plain write is conditioned on the counter, which a commit leaves alone: written
    /// from the checkpoint this tenure knew, it would move the row back behind the commit's
    /// outputs, and the next holder would commit them again. (A commit still in flight cannot
    /// land after the write: it is conditioned on the checkpoint before it.)
    pub(super) async fn learn_commit(&self, held: &mut Held) -> Result<(), TenureError> {
        if !held.commit_unknown {
            return Ok(());
        }
        let read = bounded(self.call_timeout, "get", self.store.get(&self.shard)).await;
        match read {
            Ok(Some(row)) if row.is_owned_by(&self.worker) && row.fence == Some(self.fence) => {
                held.lease.checkpoint = row.checkpoint;
                held.lease.pending_checkpoint = row.pending_checkpoint;
                held.lease.child_shard_ids = row.child_shard_ids;
                held.lease.parked_keys = row.parked_keys;
                held.commit_unknown = false;
                Ok(())
            }
            Ok(_) => {
                self.mark_lost();
                Err(TenureError::Lost)
            }
            Err(e) => Err(TenureError::Store(e)),
        }
    }

    /// A commit the lease row's condition refused: as [`settle_commit`](Self::settle_commit),
    /// except that a row found with this tenure at the very checkpoint the commit started
    /// from contradicts the refusal: the store that refused it does not hold this worker's
    /// lease rows (a `Transact` of another database, table or application): said so, at
    /// once and for good, rather than taken for a checkpoint that moved.
    async fn refused_by_row(
        &self,
        held: &mut Lease,
        update: &CheckpointUpdate,
    ) -> Result<Transacted, TenureError> {
        let before = held.checkpoint.clone();
        match self.settle_commit(held, update).await {
            Err(TenureError::Behind(now)) if now == before => {
                Err(TenureError::Store(BackendError::new(
                    ErrorKind::Fatal,
                    "transact",
                    format!(
                        "the outputs' store refused the condition on the lease row of {}, which \
                         this worker's lease store shows unchanged: the store committing the \
                         outputs does not hold this worker's leases (another database, table \
                         or application name)",
                        self.shard
                    ),
                )))
            }
            other => other,
        }
    }

    /// After a commit refused by the row's condition, or given up: reads the row. This
    /// tenure's owner and fence with the commit's checkpoint is the commit applied (by an
    /// attempt whose answer was lost); with another checkpoint, nothing applied and the
    /// row's checkpoint is adopted (`Behind`, when the commit was not the row's next); any
    /// other owner or fence is the lease lost.
    pub(super) async fn settle_commit(
        &self,
        held: &mut Lease,
        update: &CheckpointUpdate,
    ) -> Result<Transacted, TenureError> {
        let read = bounded(self.call_timeout, "get", self.store.get(&self.shard)).await;
        let row = match read {
            Ok(Some(row)) => row,
            Ok(None) => {
                self.mark_lost();
                return Err(TenureError::Lost);
            }
            Err(e) => return Err(TenureError::Store(e)),
        };
        let ours = row.is_owned_by(&self.worker) && row.fence == Some(self.fence);
        if !ours {
            self.mark_lost();
            return Err(TenureError::Lost);
        }
        let applied = row.checkpoint == update.checkpoint;
        held.checkpoint = row.checkpoint;
        held.pending_checkpoint = row.pending_checkpoint;
        held.child_shard_ids = row.child_shard_ids;
        held.parked_keys = row.parked_keys;
        if applied {
            Ok(Transacted::Applied)
        } else {
            Err(TenureError::Behind(held.checkpoint.clone()))
        }
    }
}

/// The `outcome` label of a commit that came to `outcome` (see
/// [`metrics::OUTPUT_COMMITS`](crate::metrics::OUTPUT_COMMITS)).
fn counted_as(outcome: &Result<Transacted, TenureError>) -> &'static str {
    match outcome {
        Ok(Transacted::Applied) => "committed",
        Ok(Transacted::Refused { .. }) => "refused",
        Ok(Transacted::Invalid { .. }) => "invalid",
        Err(TenureError::Lost) => "lease_lost",
        Err(TenureError::Behind(_)) => "behind",
        Err(TenureError::Store(_)) => "failed",
    }
}
