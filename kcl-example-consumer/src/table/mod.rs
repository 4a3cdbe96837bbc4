//! Window counts written to a table exactly once, in the same transaction as the checkpoint.
//!
//! Why windows and not records: a window's counts are what this consumer makes of its
//! records, and one write per window costs one item of a transaction however busy the shard
//! is, where one write per record would cost an item per record (and a transaction item costs
//! twice a plain write). Each closed window adds its counts to the item of its shard and
//! window start (`ADD`), committed with the checkpoint at the window's last record
//! ([`Checkpointer::commit_outputs_at`]): a window committed before a crash is never added
//! again (the next owner starts after its checkpoint), one not committed is recounted whole by
//! the next owner, and a worker that lost the lease cannot add anything (the transaction is
//! conditioned on its lease). A window emitted early at a graceful shutdown or handoff
//! (`"complete": false`) adds what it counted, and the next owner adds the rest to the same
//! item: the item holds each window's exact count, across any number of owners.
//!
//! What the transaction cannot see, the table is made to show:
//! - **the shard's position**: every commit also writes the checkpoint it commits to the
//!   shard's position item, in the same transaction. A lease found ahead of it was
//!   checkpointed by a worker without the table (see [`step`]). A lease found behind it was
//!   moved back (`kcl-admin reset`): the records up to the position are counted already, and
//!   the processor resumes from the later of the two, skipping them ([`Committed`]). It is
//!   also what a failed commit is read back from: a commit whose answer was lost may have
//!   applied, and the position says whether it did.
//! - **the application**: the table's application item names the one application (lease
//!   table) it belongs to, checked at start; each position item names it too, and every commit
//!   is conditioned on it, so a second application's worker writes nothing to the table.
//!
//! The stdout lines stay at least once: they are printed before the commit, outside the
//! transaction, so a line may be printed again by the next owner after a crash.

pub mod claim;
pub mod error;
pub mod step;

#[cfg(feature = "aws")]
pub mod dynamodb;
#[cfg(test)]
mod failed_tests;
#[cfg(test)]
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::Utc;
use futures_util::future::BoxFuture;
use kcl_core::outputs::{Outputs, Transact};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    Checkpoint, CheckpointError, Checkpointer, ExtendedSequenceNumber, FencingToken, Lease, ShardId,
};

pub use self::error::{CommitFailed, TableError};
use self::step::{Found, Mismatch, Mismatches, Step};
pub use crate::window::Closed;
use crate::window::WindowSummary;

/// What a commit checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Through {
    /// This record (a delivered one).
    Record(ExtendedSequenceNumber),
    /// Every record delivered.
    Delivered,
    /// `SHARD_END` (inside `shard_ended`).
    ShardEnd,
}

/// What a shard's commits have written, as its processor knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The lease's checkpoint: as opened, then as commits move it.
    pub lease: Checkpoint,
    /// The later of the lease's checkpoint and the table's position of the shard: the
    /// records at or before it are counted in the table already. Ahead of the lease only
    /// after the lease was moved back (a reset backwards), until a commit passes it.
    pub counted: Checkpoint,
}

impl Committed {
    /// A shard opened at `lease`, in step with the table.
    pub fn new(lease: Checkpoint) -> Self {
        Self {
            counted: lease.clone(),
            lease,
        }
    }

    /// Whether `record` is counted in the table already (at or before [`Self::counted`]).
    pub fn covers(&self, record: &ExtendedSequenceNumber) -> bool {
        !after(record, &self.counted)
    }
}

/// Whether the table's `position` is further on than `counted`: a commit applied that the
/// processor did not know of.
pub fn further(position: &Checkpoint, counted: &Checkpoint) -> bool {
    match (position, counted) {
        (_, Checkpoint::ShardEnd) => false,
        (Checkpoint::ShardEnd, _) => true,
        (Checkpoint::Sequence(p), Checkpoint::Sequence(c)) => p > c,
        (Checkpoint::Sequence(_), _) => true,
        _ => false,
    }
}

/// Where closed windows are committed with the checkpoint that covers them.
pub trait WindowTable: Send + Sync + fmt::Debug + 'static {
    /// The table's name, for messages.
    fn name(&self) -> &str;

    /// A processor opens `shard` after `lease` (its lease's checkpoint): compares it with the
    /// table's position of the shard, reports a mismatch ([`step`]) and records it in the
    /// table. Returns the table's position when it is ahead of the lease (the lease was moved
    /// back): the records up to it are counted already.
    ///
    /// # Errors
    /// [`TableError::Gone`], [`TableError::OtherApplication`], or the read's error: the
    /// shard is not processed.
    fn open<'a>(
        &'a self,
        shard: &'a ShardId,
        lease: &'a Checkpoint,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, TableError>>;

    /// The table's position of `shard`, read consistently: where its last commit went.
    ///
    /// # Errors
    /// The read's.
    fn position<'a>(
        &'a self,
        shard: &'a ShardId,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, TableError>>;

    /// Checkpoints `through`, with `windows` written in the same transaction (or several, each
    /// with the checkpoint of its last window) and the shard's position with each (never
    /// moving it back: a checkpoint before [`Committed::counted`] goes without it).
    /// `committed` is moved as commits apply.
    ///
    /// # Errors
    /// [`CommitFailed`]: as [`Checkpointer::commit_outputs`]
    /// ([`CheckpointError::LeaseLost`] when this worker no longer holds the lease: nothing
    /// was written), or what the table turned out to be ([`TableError::Gone`],
    /// [`TableError::OtherApplication`]).
    fn commit<'a>(
        &'a self,
        checkpointer: &'a mut Checkpointer,
        windows: Vec<Closed>,
        committed: &'a mut Committed,
        through: Through,
    ) -> BoxFuture<'a, Result<(), CommitFailed>>;

    /// Compares the unfinished leases of `leases` (the whole lease table, read before this
    /// call) with the table's positions, and reports those ahead; how many were. With
    /// `sample`, only that many leases other workers hold, the next ones after those of the
    /// last check (round the table): a check costs a read per lease checked, so a fleet's
    /// periodic checks cost in proportion to its workers, not to workers × shards.
    ///
    /// # Errors
    /// The read's.
    fn check<'a>(
        &'a self,
        leases: &'a [Lease],
        sample: Option<usize>,
    ) -> BoxFuture<'a, Result<usize, TableError>>;

    /// What this process found out of step.
    fn mismatches(&self) -> &Mismatches;
}

/// What a shard's position item holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The checkpoint last committed with windows (or recorded at a baseline or a mismatch).
    pub checkpoint: Checkpoint,
    /// The application that wrote it.
    pub application: Option<String>,
}

/// The items of one store's table: how windows and positions are written, and read back.
pub trait Items: Send + Sync + fmt::Debug + 'static {
    /// The store whose transactions carry the writes.
    type Store: Transact;
    /// The table's name.
    fn table(&self) -> &str;
    /// This worker's application (its lease table).
    fn application(&self) -> &str;
    /// This worker.
    fn worker(&self) -> &str;
    /// A window's write.
    fn window(&self, summary: &WindowSummary) -> <Self::Store as Transact>::Write;
    /// The write of `shard`'s position: `checkpoint`, committed by the tenure of `fence`;
    /// refused if the item names another application.
    fn position(
        &self,
        shard: &ShardId,
        checkpoint: &Checkpoint,
        fence: FencingToken,
    ) -> <Self::Store as Transact>::Write;
    /// The position items of `shards` (absent ones left out), read consistently.
    fn read_positions<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<HashMap<ShardId, Position>, TableError>>;
    /// Records `mismatch` in the position item of its shard, if the item still holds the
    /// table's position it found (false if it changed meanwhile): a lease ahead moves the
    /// position to the lease's checkpoint (the table counts from there); a lease behind leaves
    /// it (the records up to it are counted, and skipped).
    fn realign<'a>(&'a self, mismatch: &'a Mismatch) -> BoxFuture<'a, Result<bool, TableError>>;
    /// After a commit of `shard` failed: [`TableError::Gone`] if the table is.
    fn diagnose<'a>(&'a self, shard: &'a ShardId) -> BoxFuture<'a, Option<TableError>>;
}

/// A [`WindowTable`] on a transactional lease store, its items made by `I`.
pub struct Transactional<I: Items> {
    store: I::Store,
    items: I,
    found: Mismatches,
    /// The last lease a sampled check read.
    cursor: Mutex<Option<ShardId>>,
}

impl<I: Items> Transactional<I> {
    /// Windows written through `store` (the worker's lease store, or a clone of it), as
    /// `items` makes them.
    pub fn new(store: I::Store, items: I) -> Self {
        Self {
            store,
            items,
            found: Mismatches::default(),
            cursor: Mutex::new(None),
        }
    }

    /// One transaction: `windows` (at most a transaction's writes less one) and the
    /// position, with the checkpoint of `through`.
    async fn commit_part(
        &self,
        checkpointer: &mut Checkpointer,
        windows: Vec<Closed>,
        committed: &mut Committed,
        through: &Through,
    ) -> Result<(), CommitFailed> {
        let shard = checkpointer.shard_id().clone();
        let mut outputs = Outputs::new();
        for (summary, last) in &windows {
            outputs.push_at(last.clone(), self.items.window(summary));
        }
        let (target, tag) = match through {
            Through::Record(p) => (Checkpoint::Sequence(p.clone()), Some(p.clone())),
            Through::Delivered => match checkpointer.finished() {
                Some(p) => (Checkpoint::Sequence(p.clone()), Some(p)),
                None => (committed.lease.clone(), None),
            },
            Through::ShardEnd => (Checkpoint::ShardEnd, checkpointer.last_delivered().cloned()),
        };
        // The position goes with the record the checkpoint covers; none if it does not move
        // past what is counted (a write must belong to a record after the stored checkpoint,
        // and the position never goes back: after a reset backwards, the lease catches up
        // with it first).
        let tag = tag.filter(|t| after(t, &committed.counted));
        let moves = tag.is_some();
        if let Some(tag) = tag {
            let write = self
                .items
                .position(&shard, &target, checkpointer.fencing_token());
            outputs.push_at(tag, write);
        }
        let result = match through {
            Through::Record(p) => {
                checkpointer
                    .commit_outputs_at(&self.store, outputs, p.clone())
                    .await
            }
            // Everything finished, or SHARD_END inside `shard_ended`.
            Through::Delivered | Through::ShardEnd => {
                checkpointer.commit_outputs(&self.store, outputs).await
            }
        };
        match result {
            Ok(()) => {
                if moves {
                    committed.counted = target.clone();
                }
                committed.lease = target;
                Ok(())
            }
            Err(source) => Err(self.explain(&shard, source).await),
        }
    }

    /// What a failed commit of `shard` says about the table.
    async fn explain(&self, shard: &ShardId, source: CheckpointError) -> CommitFailed {
        let table = match &source {
            CheckpointError::OutputRefused { .. } => self.other_application(shard).await,
            CheckpointError::LeaseLost { .. } | CheckpointError::Backwards { .. } => None,
            // The store's error (a table missing is one), or any other.
            _ => self.items.diagnose(shard).await,
        };
        match table {
            Some(table) => CommitFailed::Table { table, source },
            None => CommitFailed::Checkpoint(source),
        }
    }

    /// [`TableError::OtherApplication`] if `shard`'s position item names another one.
    async fn other_application(&self, shard: &ShardId) -> Option<TableError> {
        let shards = [shard.clone()];
        let positions = self.items.read_positions(&shards).await.ok()?;
        let theirs = positions.get(shard)?.application.clone()?;
        (theirs != self.items.application()).then(|| TableError::OtherApplication {
            table: self.items.table().to_owned(),
            ours: self.items.application().to_owned(),
            theirs,
            shard: Some(shard.clone()),
        })
    }

    async fn open_shard(
        &self,
        shard: &ShardId,
        lease: &Checkpoint,
    ) -> Result<Option<Checkpoint>, TableError> {
        let position = self.read_position(shard).await?;
        let table = position.map(|p| p.checkpoint);
        let step = step::compare(lease, table.as_ref());
        if step == Step::InStep {
            self.found.mark(shard, None);
            return Ok(None);
        }
        let mismatch = Mismatch {
            shard: shard.clone(),
            lease: lease.clone(),
            table,
            step,
            found: Found::Open,
            at: Utc::now(),
        };
        self.found.report(self.items.table(), &mismatch);
        // Recorded in the table; a lease ahead is in step from here: the next opening
        // reports nothing.
        match self.items.realign(&mismatch).await {
            Ok(realigned) => {
                let ahead = step == Step::Missing && !realigned;
                self.found.mark(shard, ahead.then_some(&mismatch));
            }
            Err(error) => tracing::warn!(
                %shard,
                error = format!("{error:#}"),
                "cannot record the mismatch in the position item"
            ),
        }
        // A lease behind: the processor resumes after the table's position.
        Ok(match step {
            Step::Behind => mismatch.table,
            Step::Missing | Step::InStep => None,
        })
    }

    /// `shard`'s position, refused if its item names another application.
    async fn read_position(&self, shard: &ShardId) -> Result<Option<Position>, TableError> {
        let shards = [shard.clone()];
        let position = self.items.read_positions(&shards).await?.remove(shard);
        if let Some(theirs) = position.as_ref().and_then(|p| p.application.clone())
            && theirs != self.items.application()
        {
            return Err(TableError::OtherApplication {
                table: self.items.table().to_owned(),
                ours: self.items.application().to_owned(),
                theirs,
                shard: Some(shard.clone()),
            });
        }
        Ok(position)
    }

    async fn check_leases(
        &self,
        leases: &[Lease],
        sample: Option<usize>,
    ) -> Result<usize, TableError> {
        let mut open: Vec<&Lease> = leases
            .iter()
            .filter(|l| !is_coordination_key(&l.key) && !l.is_finished())
            .collect();
        if let Some(n) = sample {
            open.retain(|l| {
                l.owner
                    .as_ref()
                    .is_none_or(|o| o.as_str() != self.items.worker())
            });
            open.sort_by(|a, b| a.key.cmp(&b.key));
            let mut cursor = self.cursor.lock().unwrap_or_else(PoisonError::into_inner);
            let from = cursor
                .as_ref()
                .map_or(0, |c| open.partition_point(|l| l.key <= *c));
            open.rotate_left(from);
            open.truncate(n);
            *cursor = open.last().map(|l| l.key.clone());
        }
        let shards: Vec<ShardId> = open.iter().map(|l| l.key.clone()).collect();
        let positions = self.items.read_positions(&shards).await?;
        let mut ahead = 0;
        for lease in open {
            let table = positions.get(&lease.key).map(|p| p.checkpoint.clone());
            // Only ahead: the leases were read before the positions, so a commit between the
            // two reads can only make the table look further on.
            if step::compare(&lease.checkpoint, table.as_ref()) != Step::Missing {
                self.found.mark(&lease.key, None);
                continue;
            }
            ahead += 1;
            let mismatch = Mismatch {
                shard: lease.key.clone(),
                lease: lease.checkpoint.clone(),
                table,
                step: Step::Missing,
                found: Found::Check,
                at: Utc::now(),
            };
            self.found.mark(&lease.key, Some(&mismatch));
            self.found.report(self.items.table(), &mismatch);
        }
        Ok(ahead)
    }
}

/// Whether `record` is after the `stored` checkpoint (a write may belong to it).
fn after(record: &ExtendedSequenceNumber, stored: &Checkpoint) -> bool {
    match stored {
        Checkpoint::Sequence(at) => record > at,
        Checkpoint::ShardEnd => false,
        _ => true,
    }
}

impl<I: Items> fmt::Debug for Transactional<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactional")
            .field("items", &self.items)
            .finish_non_exhaustive()
    }
}

impl<I: Items> WindowTable for Transactional<I> {
    fn name(&self) -> &str {
        self.items.table()
    }

    fn open<'a>(
        &'a self,
        shard: &'a ShardId,
        lease: &'a Checkpoint,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, TableError>> {
        Box::pin(self.open_shard(shard, lease))
    }

    fn position<'a>(
        &'a self,
        shard: &'a ShardId,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, TableError>> {
        Box::pin(async move { Ok(self.read_position(shard).await?.map(|p| p.checkpoint)) })
    }

    fn commit<'a>(
        &'a self,
        checkpointer: &'a mut Checkpointer,
        windows: Vec<Closed>,
        committed: &'a mut Committed,
        through: Through,
    ) -> BoxFuture<'a, Result<(), CommitFailed>> {
        // A transaction's writes less the position's, so that each carries its position.
        let per = self.store.limits().writes.saturating_sub(1).max(1);
        Box::pin(async move {
            let mut windows = windows.into_iter().peekable();
            loop {
                let part: Vec<Closed> = windows.by_ref().take(per).collect();
                let last = windows.peek().is_none();
                let step = match part.last() {
                    Some((_, at)) if !last => Through::Record(at.clone()),
                    _ => through.clone(),
                };
                self.commit_part(checkpointer, part, committed, &step)
                    .await?;
                if last {
                    return Ok(());
                }
            }
        })
    }

    fn check<'a>(
        &'a self,
        leases: &'a [Lease],
        sample: Option<usize>,
    ) -> BoxFuture<'a, Result<usize, TableError>> {
        Box::pin(self.check_leases(leases, sample))
    }

    fn mismatches(&self) -> &Mismatches {
        &self.found
    }
}

/// Checks the whole lease table against the table's positions every [`step::CHECK_EVERY`]
/// (the caller checks at start), and keeps the metrics fresh, until the runtime stops.
pub fn watch<L: kcl_core::LeaseStore>(store: L, table: Arc<dyn WindowTable>) {
    tokio::spawn(async move {
        // The first one is the caller's, at start.
        let first = tokio::time::Instant::now() + step::CHECK_EVERY;
        let mut check = tokio::time::interval_at(first, step::CHECK_EVERY);
        let mut refresh = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = check.tick() => {
                    let found = match store.list().await {
                        Ok(leases) => table.check(&leases, Some(step::CHECK_SAMPLE)).await,
                        Err(error) => {
                            tracing::debug!(%error, "no check of the exactly-once table: the lease table cannot be read");
                            continue;
                        }
                    };
                    if let Err(error) = found {
                        tracing::warn!(error = format!("{error:#}"), "the check of the exactly-once table failed");
                    }
                }
                _ = refresh.tick() => table.mismatches().refresh(),
            }
        }
    });
}
