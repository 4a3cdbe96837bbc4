//! Exactly-once outputs under [`Parallel`]: a handler returns its writes instead of
//! performing them, and they commit in one transaction with the checkpoint that covers their
//! record, fenced by the lease (see [`outputs`](crate::outputs)).
//!
//! Records finish out of order under `Parallel`, but a checkpoint covers a prefix of the
//! shard. So a record whose handler returned is *computed*, not finished: its `Ack` stays
//! open while its writes wait (a record given up on by the failure policy waits too, with no
//! writes). A commit takes every computed record before the oldest delivered record that is
//! not (one still running, waiting for its key or resting before a retry), commits their
//! writes with the checkpoint of the record just before that one, and only then finishes
//! their `Ack`s, so the watermark reaches that checkpoint. Records computed past a stuck key
//! wait for it: their writes commit as the watermark passes them, never before.
//!
//! Why this is exactly once:
//! - **Every checkpoint of the shard is such a commit.** The worker's own checkpoints of the
//!   watermark are held back for the processor's whole life: a plain checkpoint is
//!   conditioned on the lease's owner and counter only, which a commit leaves as they are,
//!   so one written from a checkpoint the tenure has not learnt yet (after a commit whose
//!   answer was lost), or one delayed in the network, could land after a commit and move the
//!   row's checkpoint back past writes already committed; the next holder would commit them
//!   again. A commit is conditioned on the checkpoint before it, so it applies once or not
//!   at all, whenever it lands. (Even the watermark alone could not pass a computed record:
//!   it stops before the oldest unfinished one, and a computed record is unfinished until
//!   its commit applied.) `SHARD_END` is written as ever, once every record finished.
//! - **A computed record the row's checkpoint already passes** was committed by an attempt
//!   whose answer was lost (here, or under an earlier processor of this tenure): it is
//!   finished without being written again.
//! - **A commit refused because the lease moved is the lease lost**: nothing more commits,
//!   and the records computed but not committed are delivered again to the next holder (their
//!   writes never applied).
//! - **A record given up on** (dead-lettered or skipped by the failure policy) has no writes.
//!   A record whose writes alone exceed one transaction of the store fails as a
//!   [`Permanent`] failure, for the policy to give up on; so does one whose write is refused
//!   by its own condition or refused by the store as invalid, found when its part commits
//!   (a part refused as invalid without the store naming the write is committed again one
//!   record at a time, so that only the record at fault fails). Given up, it commits without
//!   writes; under [`FailurePolicy::block`](crate::failure::FailurePolicy::block), or in an
//!   outage, the shard restarts from the watermark.
//!
//! Commits come once [`commit_every`](Parallel::commit_every) records were computed or
//! [`commit_interval`](Parallel::commit_interval) after the oldest one waiting (by default the
//! worker's defaults for [`ack_checkpoint_every`](crate::WorkerConfig::ack_checkpoint_every)
//! and [`ack_checkpoint_interval`](crate::WorkerConfig::ack_checkpoint_interval)), and at once
//! from `shutdown_requested` on (a graceful stop or a handoff), before the worker's last
//! checkpoint. Before `SHARD_END` the worker waits for every record to finish, so the last
//! commit comes at most one interval after the last record was computed. Each checkpoint is a
//! transaction, with writes or without (twice the write units of a plain one on DynamoDB).
//!
//! A redrive of a parked key replays letters behind the checkpoint, whose writes could not
//! commit with it: [`Parallel::park_keys`] is refused with outputs (dead-letter and go on, and
//! redrive the letters to the stream).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Parallel;
use super::committer::{Cadence, Committer, Computed};
use super::work::{Policy, Started, Work};
use crate::ack::Ack;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::failure::Permanent;
use crate::outputs::{Transact, split};
use crate::types::{ExtendedSequenceNumber, Record};

/// Handles one record and returns its writes, which commit with the checkpoint that covers
/// it; the per-record work of [`Parallel::with_outputs`].
///
/// Any `Fn(Record) -> impl Future<Output = Result<Vec<W>, BoxError>>` is one. As a
/// [`RecordHandler`](super::RecordHandler), it is shared by every shard and runs
/// concurrently with itself. It must not perform the writes itself: a record may be
/// computed more than once (after a failover, or a retry), and only the writes it returns
/// are committed exactly once.
pub trait OutputHandler<W>: Send + Sync + 'static {
    /// The writes of `record` (none is fine: the record's checkpoint still commits).
    fn handle(&self, record: Record) -> impl Future<Output = Result<Vec<W>, BoxError>> + Send;
}

impl<F, Fut, W> OutputHandler<W> for F
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<W>, BoxError>> + Send,
{
    fn handle(&self, record: Record) -> impl Future<Output = Result<Vec<W>, BoxError>> + Send {
        self(record)
    }
}

/// An [`OutputHandler`] and the store its writes commit to: what
/// [`Parallel::with_outputs`] runs.
pub struct WithOutputs<T, O> {
    store: Arc<T>,
    handler: Arc<O>,
    cadence: Cadence,
}

impl<T, O> std::fmt::Debug for WithOutputs<T, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithOutputs")
            .field("cadence", &self.cadence)
            .finish_non_exhaustive()
    }
}

impl<T: Transact, O: OutputHandler<T::Write>> Parallel<WithOutputs<T, O>> {
    /// Runs `handler` as [`Parallel::new`] does, committing the writes it returns for each
    /// record to `store` in one transaction with the checkpoint that covers the record,
    /// fenced by the lease: exactly once, however records finish; see the
    /// [module docs](super::outputs). `store` is the lease store's (the writes share a
    /// transaction with the lease row).
    pub fn with_outputs(store: Arc<T>, handler: O) -> Self {
        let defaults = crate::WorkerConfig::default();
        let work = WithOutputs {
            store,
            handler: Arc::new(handler),
            cadence: Cadence {
                every: defaults.ack_checkpoint_every,
                interval: defaults.ack_checkpoint_interval,
            },
        };
        Self::around(work)
    }

    /// Commits once this many records were computed since the last commit. Default 1,000
    /// (as [`ack_checkpoint_every`](crate::WorkerConfig::ack_checkpoint_every)); 0 is taken
    /// as 1.
    #[must_use]
    pub fn commit_every(self, records: u64) -> Self {
        let cadence = Cadence {
            every: records.max(1),
            ..self.handler.cadence
        };
        self.commit_on(cadence)
    }

    /// ... or once this long passed since the oldest computed record waiting. Default 5 s
    /// (as [`ack_checkpoint_interval`](crate::WorkerConfig::ack_checkpoint_interval)).
    #[must_use]
    pub fn commit_interval(self, interval: Duration) -> Self {
        let cadence = Cadence {
            interval,
            ..self.handler.cadence
        };
        self.commit_on(cadence)
    }

    fn commit_on(mut self, cadence: Cadence) -> Self {
        let work = WithOutputs {
            store: self.handler.store.clone(),
            handler: self.handler.handler.clone(),
            cadence,
        };
        self.handler = Arc::new(work);
        self
    }
}

impl<T: Transact, O: OutputHandler<T::Write>> Work for WithOutputs<T, O> {
    /// The record (kept for the failure policy, should its writes not commit) and its writes.
    type Output = (Record, Vec<T::Write>);

    async fn run(&self, record: Record) -> Result<(Record, Vec<T::Write>), BoxError> {
        let position = record.position();
        let writes = self.handler.handle(record.clone()).await?;
        // What `measure` needs (a table's key) is learnt here, once per table, and kept for
        // the commit's own split.
        self.store.prepare(&writes.iter().collect::<Vec<_>>()).await;
        // Refused now, for the failure policy, rather than when it would commit.
        let tagged = writes.into_iter().map(|w| (position.clone(), w)).collect();
        let parts =
            split(tagged, |w| self.store.measure(w), self.store.limits()).map_err(|large| {
                Permanent::new(format!(
                    "the record's {} writes ({} bytes) exceed one transaction of the store",
                    large.writes, large.bytes
                ))
            })?;
        let writes = parts.into_iter().flat_map(|p| p.writes).map(|(_, w)| w);
        Ok((record, writes.collect()))
    }

    fn start(
        &self,
        checkpointer: &Checkpointer,
        policy: &Policy,
    ) -> Started<(Record, Vec<T::Write>)> {
        let store = self.store.clone();
        let (settled, committer) =
            Committer::spawn(store, checkpointer, self.cadence, policy.0.clone());
        let done = move |position: ExtendedSequenceNumber, output: Option<_>, ack: Ack| {
            let given_up = output.is_none();
            let (record, writes) = match output {
                Some((record, writes)) => (Some(record), writes),
                None => (None, Vec::new()),
            };
            // A committer gone drops the Ack: a failure, so the shard restarts.
            let _ = settled.send(Computed {
                position,
                writes,
                ack,
                given_up,
                record,
            });
        };
        Started {
            done: Arc::new(done),
            committer: Some(committer),
        }
    }

    fn replays(&self) -> bool {
        false
    }

    fn needs_positions(&self) -> bool {
        self.store.keeps_position()
    }

    fn check(&self, park_keys: bool) -> Result<(), crate::ConfigError> {
        if park_keys {
            return Err(crate::ConfigError {
                key: "Parallel::park_keys",
                reason: "with Parallel::with_outputs, a parked key's redrive would replay \
                         letters behind the checkpoint, whose outputs cannot commit with it: \
                         dead-letter without parking, and redrive the letters to the stream"
                    .into(),
            });
        }
        Ok(())
    }
}
