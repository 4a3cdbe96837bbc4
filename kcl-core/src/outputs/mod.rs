//! Exactly-once outputs: a processor's writes commit in one transaction with its checkpoint,
//! fenced by the lease.
//!
//! At least once is where every Kinesis consumer stops: what came after the last checkpoint
//! runs again after a failover, and its writes land twice. When the writes go to the store
//! that holds the lease (DynamoDB tables in the lease table's account and region), they can
//! commit in the same transaction as the checkpoint that covers their records, conditioned
//! on the lease row still being this tenure's:
//! - a replay starts after the checkpoint, so it never produces a committed write again;
//! - a worker that lost the lease (frozen past the failover time, partitioned) cannot commit
//!   at all: the row's owner or [`FencingToken`] is no longer its own;
//! - a crash leaves outputs and checkpoint in step, since they commit or fail together.
//!
//! The condition is the owner, the fence and the checkpoint the row held before, never the
//! counter: renewals bump the counter every third of the failover time and would refuse a
//! commit that raced them, and a transaction cannot tell the holder the counter it wrote.
//! So a commit leaves the counter alone. Within a worker, commits and renewals of a lease
//! take turns behind its tenure's lock; a write of another process racing a commit (a
//! renewal that timed out here but still lands, an operator's unpark, the leader's handoff
//! request) may make the store cancel one of them (DynamoDB's `TransactionConflict`): the
//! commit is retried, with the same idempotency token, and the renewal is retried at its
//! next turn. Neither reads a conflict as a lost lease.
//!
//! A stretch of writes larger than one transaction allows ([`Limits`]) commits in parts,
//! each with the checkpoint of its last record, so that any crash between two parts leaves
//! every committed write at or before the checkpoint and every checkpointed record's writes
//! committed. The writes of one record always commit together.
//!
//! A backend implements [`Transact`]; a processor collects its writes per record in
//! [`Outputs`] and hands them to
//! [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs).

mod parts;

pub(crate) use parts::{Part, split};

use std::future::Future;

use crate::error::BackendError;
use crate::lease::CheckpointUpdate;
use crate::types::{Checkpoint, ExtendedSequenceNumber, FencingToken, Record, ShardId, WorkerId};

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
    /// The same for every attempt of this commit, at most 36 characters: a store that keeps
    /// idempotency tokens (DynamoDB's `ClientRequestToken`) answers a retry of an applied
    /// commit with success.
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

    /// Applies `commit.writes` and the checkpoint in one transaction, conditioned on the
    /// lease row holding `commit.owner`, `commit.fence` and `commit.before`; leaves the
    /// counter alone. A cancellation because of the row's condition is
    /// [`CommitError::LeaseRow`], one because of a write's is [`CommitError::Refused`];
    /// a conflict with another write in progress is a `Retryable` store error.
    fn commit(
        &self,
        commit: Commit<'_, Self::Write>,
    ) -> impl Future<Output = Result<(), CommitError>> + Send;
}

/// The writes of a stretch of records, each tagged with its record, for
/// [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs).
///
/// Push them in any order; they commit in record order, a record's writes in the order
/// pushed and always in one transaction.
#[derive(Debug)]
pub struct Outputs<W> {
    writes: Vec<(ExtendedSequenceNumber, W)>,
}

impl<W> Default for Outputs<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W> Outputs<W> {
    /// No writes yet.
    pub fn new() -> Self {
        Self { writes: Vec::new() }
    }

    /// Adds `write`, an output of `record`.
    pub fn push(&mut self, record: &Record, write: W) {
        self.writes.push((record.position(), write));
    }

    /// Adds `write`, an output of the record at `position`.
    pub fn push_at(&mut self, position: ExtendedSequenceNumber, write: W) {
        self.writes.push((position, write));
    }

    /// How many writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// True without writes.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The last record with a write, if any.
    pub fn last(&self) -> Option<&ExtendedSequenceNumber> {
        self.writes.iter().map(|(p, _)| p).max()
    }

    /// The records with writes, in the order pushed.
    pub(crate) fn records(&self) -> impl Iterator<Item = &ExtendedSequenceNumber> {
        self.writes.iter().map(|(p, _)| p)
    }

    /// The writes, without their records.
    pub(crate) fn writes(&self) -> Vec<&W> {
        self.writes.iter().map(|(_, w)| w).collect()
    }

    pub(crate) fn into_inner(self) -> Vec<(ExtendedSequenceNumber, W)> {
        self.writes
    }
}

/// The idempotency token of a commit: the same for every attempt, different for every
/// shard, tenure and position (32 hex digits).
pub(crate) fn token(
    shard: &ShardId,
    fence: FencingToken,
    before: &Checkpoint,
    update: &CheckpointUpdate,
) -> String {
    use std::hash::{Hash, Hasher};
    let mut a = siphasher::sip::SipHasher13::new_with_keys(0x6b63_6c2d, 0x6f75_7470);
    let mut b = siphasher::sip::SipHasher13::new_with_keys(0x7574_732d, 0x6b63_6c21);
    for h in [&mut a, &mut b] {
        shard.as_str().hash(h);
        fence.0.hash(h);
        before.to_string().hash(h);
        update.checkpoint.to_string().hash(h);
    }
    format!("{:016x}{:016x}", a.finish(), b.finish())
}
