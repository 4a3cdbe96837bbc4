//! Errors, classified by what the caller should do about them.
//!
//! Backends ([`LeaseStore`](crate::LeaseStore), [`ShardSource`](crate::ShardSource)) return a
//! [`BackendError`] whose [`ErrorKind`] drives every retry decision in the worker: retry,
//! back off harder, treat as a lost race, re-open an iterator, or give up. The mapping from a
//! concrete SDK error to a kind lives in one place per backend.

use std::error::Error as StdError;

use crate::types::{Checkpoint, ExtendedSequenceNumber, ShardId};

/// A boxed error from user code or a backend.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a failed backend call means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A transient failure (network, 5xx, timeout). Retry with backoff. The write may or may
    /// not have been applied.
    Retryable,
    /// The backend asked us to slow down. Retry with a longer backoff.
    Throttled,
    /// A conditional write lost: the row changed since we read it (for a held lease: it was
    /// taken or released elsewhere).
    Conflict,
    /// The shard iterator expired; open a new one after the last record read.
    ExpiredIterator,
    /// The resource does not exist: the stream, the lease table, or one shard (a closed shard
    /// whose records all aged out of the stream's retention). Retrying will not help; for a
    /// shard, the worker checks that the stream still exists and treats the shard as ended.
    NotFound,
    /// Retrying will not help (bad credentials, access denied, invalid request).
    Fatal,
}

impl ErrorKind {
    /// True for kinds worth retrying as they are.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Retryable | Self::Throttled)
    }

    /// True for kinds that retrying cannot fix: `Fatal` and `NotFound`.
    pub fn is_permanent(self) -> bool {
        matches!(self, Self::Fatal | Self::NotFound)
    }
}

/// A failed call to a [`LeaseStore`](crate::LeaseStore) or [`ShardSource`](crate::ShardSource).
#[derive(Debug, thiserror::Error)]
#[error("{operation}: {message} ({kind:?})")]
pub struct BackendError {
    kind: ErrorKind,
    operation: &'static str,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl BackendError {
    /// A new error of `kind` raised by `operation` (e.g. `"renew"`, `"get_records"`).
    pub fn new(kind: ErrorKind, operation: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            operation,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What the caller should do.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operation that failed.
    pub fn operation(&self) -> &'static str {
        self.operation
    }
}

/// A checkpoint that was refused or could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The lease was taken by another worker, released, or expired locally. The processor must
    /// stop: its records will be redelivered to the new owner.
    #[error("lease on shard {shard} is lost: checkpoint refused")]
    LeaseLost {
        /// The shard.
        shard: ShardId,
    },
    /// The position is beyond the last record delivered to this processor.
    #[error(
        "checkpoint {requested} on shard {shard} is past the last delivered record ({last_delivered:?})"
    )]
    NotDelivered {
        /// The shard.
        shard: ShardId,
        /// What was asked for.
        requested: ExtendedSequenceNumber,
        /// The last record delivered, if any.
        last_delivered: Option<ExtendedSequenceNumber>,
    },
    /// The position is past a record that was handed out with
    /// [`ProcessRecordsInput::acknowledge_later`](crate::ProcessRecordsInput::acknowledge_later)
    /// and is not acknowledged yet (see [`ack`](crate::ack)).
    #[error(
        "checkpoint {requested} on shard {shard} is past an unfinished record ({})",
        .watermark.as_ref().map_or_else(|| "none of the records delivered has finished yet".to_owned(), |w| format!("a checkpoint may go up to {w}"))
    )]
    Unfinished {
        /// The shard.
        shard: ShardId,
        /// What was asked for.
        requested: String,
        /// The furthest position a checkpoint may go to now.
        watermark: Option<ExtendedSequenceNumber>,
    },
    /// No position was given and nothing has been delivered yet.
    #[error("nothing delivered on shard {shard} yet: no position to checkpoint")]
    NothingDelivered {
        /// The shard.
        shard: ShardId,
    },
    /// The position is behind the lease's current checkpoint.
    #[error("checkpoint {requested} on shard {shard} is behind the current checkpoint {current}")]
    Backwards {
        /// The shard.
        shard: ShardId,
        /// What was asked for.
        requested: String,
        /// The lease's checkpoint.
        current: Checkpoint,
    },
    /// An output handed to [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs)
    /// belongs to a record this commit does not cover: one at or before the stored
    /// checkpoint (its outputs are committed already, or were never to be), or one after
    /// the position checkpointed. Nothing was written.
    #[error(
        "an output of record {record} on shard {shard} is outside what this commit covers \
         (after {after}, up to {upto})"
    )]
    OutputOutside {
        /// The shard.
        shard: ShardId,
        /// The output's record.
        record: ExtendedSequenceNumber,
        /// The stored checkpoint.
        after: Checkpoint,
        /// The position the commit checkpoints.
        upto: String,
    },
    /// One record's outputs exceed what one transaction of the store holds (or write one
    /// item twice): they could never commit together. Nothing of this commit was written.
    #[error(
        "the {writes} outputs ({bytes} bytes) of record {record} on shard {shard} exceed one \
         transaction, or write one item twice"
    )]
    OutputsTooLarge {
        /// The shard.
        shard: ShardId,
        /// The record.
        record: ExtendedSequenceNumber,
        /// Its writes.
        writes: usize,
        /// Their size, as the store counts it.
        bytes: usize,
    },
    /// [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs) in a processor
    /// that takes records to acknowledge later: an acknowledged record counts as finished
    /// (and a successor skips it) before its outputs could commit. Use
    /// [`Parallel::with_outputs`](crate::Parallel::with_outputs) for records finished out of
    /// order. Nothing was written.
    #[error(
        "commit_outputs on shard {shard} in a processor that acknowledges records later: \
         use Parallel::with_outputs for records finished out of order"
    )]
    OutputsAcknowledgedLater {
        /// The shard.
        shard: ShardId,
    },
    /// `commit_outputs` into a sink that keeps its own position
    /// ([`Transact::keeps_position`](crate::outputs::Transact::keeps_position)) on a worker
    /// not given it ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)): the sink
    /// was never fenced for this tenure, nor the shard resumed from its position. Nothing
    /// was written.
    #[error(
        "commit_outputs on shard {shard} into a sink that keeps its own position, which the \
         worker was not given: build the worker with WorkerBuilder::positions(sink)"
    )]
    PositionsNotOpened {
        /// The shard.
        shard: ShardId,
    },
    /// An output's own condition failed, so its transaction did not apply: the outputs and
    /// checkpoint stand where the transactions before it left them.
    #[error("an output of record {record} on shard {shard} was refused by its condition: {reason}")]
    OutputRefused {
        /// The shard.
        shard: ShardId,
        /// The output's record.
        record: ExtendedSequenceNumber,
        /// What the store said.
        reason: String,
    },
    /// The store refused an output of this record as invalid (DynamoDB: an item over 400 KB,
    /// a malformed key or number, two writes of one item), so its transaction did not apply
    /// and never can: the outputs and checkpoint stand where the transactions before it left
    /// them, the records before it included when the store did not say which write it was
    /// (each record's writes were then committed alone until one failed). Give the record up
    /// (dead-letter it, skip it) or fix the processor.
    #[error(
        "an output of record {record} on shard {shard} was refused by the store as invalid: {reason}"
    )]
    OutputInvalid {
        /// The shard.
        shard: ShardId,
        /// The output's record.
        record: ExtendedSequenceNumber,
        /// What the store said.
        reason: String,
    },
    /// The write failed for a reason other than a lost lease; the caller may retry.
    #[error("checkpoint write on shard {shard} failed")]
    Store {
        /// The shard.
        shard: ShardId,
        /// The store's error.
        #[source]
        source: BackendError,
    },
}

/// An invalid configuration value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config `{key}`: {reason}")]
pub struct ConfigError {
    /// The configuration key.
    pub key: &'static str,
    /// Why it was rejected.
    pub reason: String,
}

/// Why [`Worker::run`](crate::Worker::run) returned an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The lease store failed in a way retrying cannot fix.
    #[error("lease store failed fatally")]
    Store(#[source] BackendError),
    /// The shard source failed in a way retrying cannot fix.
    #[error("shard source failed fatally")]
    Source(#[source] BackendError),
    /// The dead-letter sink cannot work (its queue, bucket, stream or directory is missing
    /// or may not be written; [`DeadLetterSink::check`](crate::failure::DeadLetterSink::check)).
    #[error("the dead-letter sink cannot work")]
    DeadLetters(#[source] BackendError),
}

/// `error` and its sources, each once, joined by `: ` (a source whose text the previous
/// message already contains is left out): one readable line for a log.
///
/// ```
/// let io = std::io::Error::other("connection refused");
/// let error = kcl_core::BackendError::new(kcl_core::ErrorKind::Retryable, "list", "lease table")
///     .with_source(io);
/// assert_eq!(kcl_core::error_chain(&error), "list: lease table (Retryable): connection refused");
/// ```
pub fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}
