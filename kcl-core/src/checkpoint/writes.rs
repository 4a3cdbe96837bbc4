//! What became of a processor's checkpoint writes, for its shard's progress (see
//! `worker::shard_consumer::progress`, which reports a shard `failing` once its writes
//! keep failing).
//!
//! A write **fails** when it reached the store and did not apply for a reason other than
//! the lease moving (a store error: throttled past the retries, access denied, a table
//! gone; an output refused by its own condition), or when it can never apply as asked (one
//! record's outputs larger than a transaction, outputs under `acknowledge_later`). A write
//! that applied (a checkpoint, or a commit of outputs with its checkpoint) ends the run of
//! failures.
//!
//! Why failed writes, and not a checkpoint that does not move: a processor may checkpoint
//! rarely on purpose (as a window closes, every few minutes, only at shutdown). It writes
//! nothing meanwhile, so it has no failed write, and its records waiting is `stalled`'s
//! business (which can be turned off). A processor whose writes are all refused, and that
//! goes on (it logs the error and returns `Ok`), looks like the first to every other
//! signal: its batches are processed without an error. Its failed writes are what tells
//! "cannot move the checkpoint" from "does not move it yet".
//!
//! Not failures: a lost lease (the tenure ends, and the next holder delivers again), and a
//! position the checkpoint may not take now (not delivered, past an unfinished record,
//! behind the stored checkpoint, outputs outside it): the processor is told, nothing was
//! sent, and the same call may succeed once records finish.
//!
//! The log is shared (cloned with an `Arc`), so that writes made outside the processor's
//! hooks land in it too; the shard task takes what it holds between batches.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::error::{CheckpointError, error_chain};

/// Checkpoint writes that failed in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failed {
    /// When the first of them failed.
    pub(crate) since: Instant,
    /// How many failed.
    pub(crate) count: u32,
    /// The first's kind and error: what a report says while the run lasts (a text that
    /// changed at every write would be logged as a new problem each time).
    pub(crate) first: String,
}

/// Checkpoint writes since the shard task last looked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Writes {
    /// A write applied: the failures before it are over.
    pub(crate) applied: bool,
    /// The writes that failed after the last one that applied.
    pub(crate) failed: Option<Failed>,
}

/// See the module docs.
#[derive(Debug, Default, Clone)]
pub(crate) struct WriteLog(Arc<Mutex<Writes>>);

impl WriteLog {
    fn lock(&self) -> MutexGuard<'_, Writes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A write applied.
    pub(crate) fn applied(&self) {
        let mut writes = self.lock();
        writes.applied = true;
        writes.failed = None;
    }

    /// A write ended with `error`: noted if it is a failure (see the module docs).
    pub(crate) fn failed(&self, error: &CheckpointError) {
        let Some(kind) = kind(error) else {
            return;
        };
        let mut writes = self.lock();
        match &mut writes.failed {
            Some(run) => run.count = run.count.saturating_add(1),
            None => {
                writes.failed = Some(Failed {
                    since: Instant::now(),
                    count: 1,
                    first: format!("{kind}: {}", error_chain(error)),
                });
            }
        }
        tracing::debug!(kind, %error, "a checkpoint write failed");
    }

    /// What happened since the last call.
    pub(crate) fn take(&self) -> Writes {
        std::mem::take(&mut *self.lock())
    }
}

/// The kind of a failed write, as reports name it; `None` for an error that is not one.
pub(crate) fn kind(error: &CheckpointError) -> Option<String> {
    match error {
        CheckpointError::Store { source, .. } => {
            Some(format!("store_error ({:?})", source.kind()).to_lowercase())
        }
        CheckpointError::OutputRefused { .. } => Some("output_refused".to_owned()),
        CheckpointError::OutputInvalid { .. } => Some("output_invalid".to_owned()),
        CheckpointError::OutputsTooLarge { .. } => Some("outputs_too_large".to_owned()),
        CheckpointError::OutputsAcknowledgedLater { .. } => {
            Some("outputs_acknowledged_later".to_owned())
        }
        CheckpointError::PositionsNotOpened { .. } => Some("positions_not_opened".to_owned()),
        CheckpointError::LeaseLost { .. }
        | CheckpointError::NotDelivered { .. }
        | CheckpointError::Unfinished { .. }
        | CheckpointError::NothingDelivered { .. }
        | CheckpointError::Backwards { .. }
        | CheckpointError::OutputOutside { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BackendError, ErrorKind};
    use crate::types::{ExtendedSequenceNumber, SequenceNumber, ShardId};

    fn refused() -> CheckpointError {
        CheckpointError::OutputRefused {
            shard: ShardId::new("s"),
            record: ExtendedSequenceNumber::new(SequenceNumber::from(7)),
            reason: "ConditionalCheckFailed".to_owned(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_add_up_until_a_write_applies_and_lost_leases_do_not_count() {
        let log = WriteLog::default();
        let started = Instant::now();
        log.failed(&refused());
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let denied = BackendError::new(ErrorKind::Fatal, "transact", "AccessDenied");
        log.failed(&CheckpointError::Store {
            shard: ShardId::new("s"),
            source: denied,
        });
        log.failed(&CheckpointError::LeaseLost {
            shard: ShardId::new("s"),
        });
        let writes = log.take();
        let failed = writes.failed.clone().unwrap_or_else(|| unreachable!());
        assert_eq!(
            (writes.applied, failed.count, failed.since),
            (false, 2, started)
        );
        assert!(failed.first.starts_with("output_refused: "), "{failed:?}");
        assert_eq!(log.take(), Writes::default(), "taken");
        log.failed(&refused());
        log.applied();
        let writes = log.take();
        assert!(writes.applied && writes.failed.is_none(), "{writes:?}");
    }
}
