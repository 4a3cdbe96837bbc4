//! Stores that commit a processor's writes with a checkpoint in one transaction: the
//! capability a store offers for exactly-once outputs. What it is for, and why its
//! condition is the owner, the fence and the checkpoint before, never the counter:
//! [`outputs`](crate::outputs), where processors meet it.

use std::future::Future;

use super::CheckpointUpdate;
use crate::error::BackendError;
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

/// What one transaction may hold besides the checkpoint's own write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Writes per transaction (DynamoDB: 100 actions, less the lease row's).
    pub writes: usize,
    /// Bytes per transaction, as [`Transact::measure`] counts them (DynamoDB: 4 MB, less
    /// room for the lease row's update).
    pub bytes: usize,
}

/// What [`Transact::measure`] says of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measure {
    /// Its size, as counted against [`Limits::bytes`].
    pub bytes: usize,
    /// The item it writes, if the store refuses two writes of one item in one transaction
    /// (DynamoDB does): writes of two records to one item go into different parts.
    pub item: Option<String>,
}

/// One transaction: the writes of a stretch of records and the checkpoint that covers them.
#[derive(Debug)]
#[non_exhaustive]
pub struct Commit<'a, W> {
    /// The lease's shard (its row's key).
    pub shard: &'a ShardId,
    /// The holder: the row's owner must still be this worker.
    pub owner: &'a WorkerId,
    /// This tenure's fence: the row's fence must still be this one.
    pub fence: FencingToken,
    /// The checkpoint the row must still hold (the one this tenure last wrote): a commit
    /// applied once can never apply again.
    pub before: &'a Checkpoint,
    /// The checkpoint written. The counter is left as it is.
    pub update: &'a CheckpointUpdate,
    /// The processor's writes, in record order.
    pub writes: Vec<W>,
    /// The same for every attempt of this commit and different for every call, at most 36
    /// characters: a store that keeps idempotency tokens (DynamoDB's `ClientRequestToken`)
    /// answers a retry of an applied commit with success.
    pub token: String,
}

/// Why a [`Transact::commit`] did not apply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The lease row's condition failed: another owner or fence (the lease moved), or a
    /// checkpoint other than [`Commit::before`] (an earlier attempt of this commit applied).
    #[error("the lease row no longer holds this tenure's owner, fence and checkpoint")]
    LeaseRow,
    /// Write `index` of [`Commit::writes`] failed its own condition; nothing applied.
    #[error("output write {index} was refused by its own condition: {reason}")]
    Refused {
        /// Its index in [`Commit::writes`].
        index: usize,
        /// What the store said.
        reason: String,
    },
    /// The store refuses the commit as invalid (DynamoDB's `ValidationException`, or a
    /// cancellation reason `ValidationError`: an item over 400 KB, a malformed key or number,
    /// two writes of one item); nothing applied, and a retry of the same request cannot pass.
    /// Not a store that cannot work (a table missing, access denied): that is
    /// [`Store`](Self::Store), an outage rather than a record at fault.
    #[error("the store refused the commit as invalid{}: {reason}", .index.map_or_else(String::new, |i| format!(" (output write {i})")))]
    Invalid {
        /// The index in [`Commit::writes`] of the write at fault, when the store names it;
        /// `None` when it refuses the request as a whole (the write at fault is then found by
        /// committing each record's writes alone).
        index: Option<usize>,
        /// What the store said.
        reason: String,
    },
    /// The store failed (a `Retryable` or `Throttled` kind is retried, a cancelled
    /// transaction among them); the commit may or may not have applied.
    #[error(transparent)]
    Store(#[from] BackendError),
}

/// A store that commits a processor's writes with a shard's checkpoint in one transaction.
///
/// Implemented by the lease store whose table the writes share a transaction with
/// (kcl-aws's DynamoDB store; the in-memory store for tests and the simulation).
pub trait Transact: Send + Sync + 'static {
    /// One write of the processor's (DynamoDB: a `TransactWriteItem`).
    type Write: Clone + Send + Sync + 'static;

    /// What one transaction may hold besides the lease row's update.
    fn limits(&self) -> Limits;

    /// The size of `write` and the item it writes.
    fn measure(&self, write: &Self::Write) -> Measure;

    /// Called with a stretch's writes before they are split into transactions: a store
    /// learns here what [`measure`](Self::measure) needs and cannot work out alone (DynamoDB:
    /// the key of a table a `Put` writes, read once per table). By default nothing.
    fn prepare(&self, writes: &[&Self::Write]) -> impl Future<Output = ()> + Send {
        let _ = writes;
        std::future::ready(())
    }

    /// Whether the store keeps each shard's position apart from the lease row: a sink in
    /// another system than the lease store (see [`Positions`](crate::outputs::Positions)).
    /// Then its commit conditions on and writes its own position row, the lease row's
    /// checkpoint follows each applied commit as a plain write, and the worker must have been
    /// given the sink ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)). By
    /// default false: the store holds the lease rows and commits the checkpoint into them.
    fn keeps_position(&self) -> bool {
        false
    }

    /// Applies `commit.writes` and the checkpoint in one transaction, conditioned on the
    /// lease row holding `commit.owner`, `commit.fence` and `commit.before`; leaves the
    /// counter alone. A cancellation because of the row's condition is
    /// [`CommitError::LeaseRow`], one because of a write's is [`CommitError::Refused`], a
    /// write or request the store refuses as invalid is [`CommitError::Invalid`]; a conflict
    /// with another write in progress is a `Retryable` store error.
    fn commit(
        &self,
        commit: Commit<'_, Self::Write>,
    ) -> impl Future<Output = Result<(), CommitError>> + Send;
}

/// The idempotency token of one commit call: the same for every attempt of it, and
/// different for every call (32 hex digits: the commit's shard, fence and checkpoints hashed
/// under keys drawn at random for the call). Drawn per call rather than worked out from the
/// commit alone, because a store keeps a token for a while (DynamoDB: 10 minutes) whatever
/// became of the row: a call with other writes at the same place (after a refusal), another
/// application's, or one on a row deleted and made again must never be answered with an
/// earlier call's outcome, nor refused as a mismatch.
pub(crate) fn token(
    shard: &ShardId,
    fence: FencingToken,
    before: &Checkpoint,
    update: &CheckpointUpdate,
) -> String {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut a = std::collections::hash_map::RandomState::new().build_hasher();
    let mut b = std::collections::hash_map::RandomState::new().build_hasher();
    for h in [&mut a, &mut b] {
        shard.as_str().hash(h);
        fence.0.hash(h);
        before.to_string().hash(h);
        update.checkpoint.to_string().hash(h);
    }
    format!("{:016x}{:016x}", a.finish(), b.finish())
}
