//! A child's `checkpoint` message carried out through the shard's fenced checkpointer, and
//! the Java exception name it is answered with when refused.

use kcl_core::{CheckpointError, Checkpointer, ErrorKind, ExtendedSequenceNumber, SequenceNumber};

use crate::protocol::CheckpointFailure;

/// Carries out a child's checkpoint; the error name to answer with, if it failed.
pub(super) async fn checkpoint(
    checkpointer: Option<&mut Checkpointer>,
    sequence_number: Option<&str>,
    sub_sequence_number: Option<i64>,
) -> Option<CheckpointFailure> {
    let Some(checkpointer) = checkpointer else {
        tracing::warn!("the child asked to checkpoint where no checkpoint is possible");
        return Some(CheckpointFailure::InvalidStateException);
    };
    let result = match sequence_number {
        None => checkpointer.checkpoint().await,
        Some(given) => {
            let sub = u64::try_from(sub_sequence_number.unwrap_or(0)).ok();
            let Some((sequence, sub_sequence)) = SequenceNumber::parse(given).zip(sub) else {
                tracing::warn!(
                    sequence_number = given,
                    sub_sequence_number,
                    "the child asked to checkpoint at a position that is not one"
                );
                return Some(CheckpointFailure::IllegalArgumentException);
            };
            let position = ExtendedSequenceNumber {
                sequence,
                sub_sequence,
            };
            checkpointer.checkpoint_at(position).await
        }
    };
    let error = result.err()?;
    tracing::warn!(error = %kcl_core::error_chain(&error), "checkpoint refused");
    Some(failure(&error))
}

/// The Java exception KCL Java's checkpointer would throw for `error`.
pub(super) fn failure(error: &CheckpointError) -> CheckpointFailure {
    match error {
        CheckpointError::LeaseLost { .. } => CheckpointFailure::ShutdownException,
        CheckpointError::NotDelivered { .. }
        | CheckpointError::Backwards { .. }
        | CheckpointError::NothingDelivered { .. } => CheckpointFailure::IllegalArgumentException,
        CheckpointError::Store { source, .. } => match source.kind() {
            ErrorKind::Throttled => CheckpointFailure::ThrottlingException,
            ErrorKind::Conflict => CheckpointFailure::ShutdownException,
            _ => CheckpointFailure::KinesisClientLibDependencyException,
        },
        _ => CheckpointFailure::KinesisClientLibDependencyException,
    }
}
