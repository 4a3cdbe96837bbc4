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
//!   at all: the row's owner or [`FencingToken`](crate::FencingToken) is no longer its own;
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
//! A write the store refuses, by its own condition or as invalid ([`CommitError::Invalid`]:
//! an item over 400 KB, a malformed key), fails its record, not the commit: nothing of its
//! part applied, and a retry of the same writes cannot pass. `commit_outputs` names the record
//! ([`CheckpointError::OutputInvalid`](crate::CheckpointError::OutputInvalid)); under
//! [`Parallel::with_outputs`](crate::Parallel::with_outputs) the failure policy gives it up.
//! A part refused as invalid without the store naming the write is committed again one record
//! at a time, so that the records before the one at fault commit and only it fails. A store
//! that cannot work (a table missing, access denied) is no record's fault: its error is the
//! store's, and no record is given up for it.
//!
//! A backend implements [`Transact`]; a processor collects its writes per record in
//! [`Outputs`] and hands them to
//! [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs).

mod parts;

pub use crate::lease::positions::Positions;
pub(crate) use crate::lease::positions::Sink;
pub(crate) use parts::{Part, split};

pub use crate::lease::transact::{Commit, CommitError, Limits, Measure, Transact};
use crate::types::{ExtendedSequenceNumber, Record};

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
