//! Checkpointing: how a processor records progress, fenced by the lease.

use std::sync::Arc;

use crate::ack::{SparseAcks, Watermark};
use crate::error::CheckpointError;
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError};
use crate::mutation::{self, Mutation};
use crate::outputs::Sink;
use crate::types::{Checkpoint, ExtendedSequenceNumber, FencingToken, ShardId};
pub(crate) use writes::WriteLog;

/// Records a processor's progress in its shard's lease.
///
/// A [`Checkpointer`] belongs to one processor instance for one tenure of one lease. It refuses
/// positions that were not delivered yet or that move backwards, and every write is the lease
/// store's conditional checkpoint write (owner + counter). When the lease is gone the write
/// fails with [`CheckpointError::LeaseLost`]: the processor must then assume its work will be
/// redone by the new owner.
///
/// The rules:
/// - [`checkpoint`](Self::checkpoint) records the last record delivered so far (in
///   `shard_ended`, `SHARD_END`, which lets the shard's children start);
///   [`checkpoint_at`](Self::checkpoint_at) records any delivered position, sub-sequence
///   numbers of aggregated records included.
/// - A position after the last delivered record is refused ([`CheckpointError::NotDelivered`]),
///   and so is one behind the stored checkpoint ([`CheckpointError::Backwards`]); the same
///   position again is a no-op.
/// - Everything after the last checkpoint is delivered again after a failover, a restart or a
///   processor failure (at least once). Checkpoint in `shutdown_requested` and a graceful
///   shutdown or a planned handoff repeats nothing.
/// - A checkpoint is only as good as the lease: the write is conditional on this worker's
///   ownership and the lease counter, so a worker that lost the lease cannot move it.
/// - Records taken with [`ProcessRecordsInput::acknowledge_later`](crate::ProcessRecordsInput::acknowledge_later)
///   hold every checkpoint back until they are acknowledged: `checkpoint` writes the
///   watermark (see [`ack`](crate::ack)), and a position past an unfinished record is refused
///   ([`CheckpointError::Unfinished`]).
/// - [`prepare_checkpoint`](Self::prepare_checkpoint) writes a pending checkpoint that the next owner sees in
///   [`InitializationInput::pending_checkpoint`](crate::InitializationInput), for side effects
///   that must not be repeated blindly.
#[derive(Debug)]
#[doc(alias = "RecordProcessorCheckpointer")]
pub struct Checkpointer {
    tenure: Arc<Tenure>,
    last_delivered: Option<ExtendedSequenceNumber>,
    /// The checkpoint this instance's shard was opened after, if a record's.
    pub(crate) opened: Option<ExtendedSequenceNumber>,
    shard_end: Option<Vec<ShardId>>,
    watermark: Arc<Watermark>,
    /// What became of this instance's writes, for the shard's progress.
    writes: WriteLog,
    /// Whether this instance committed outputs ([`commit_outputs`](Self::commit_outputs)).
    committed: bool,
    /// The worker's sink that keeps positions, fenced for this tenure when the shard opened
    /// ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)).
    pub(crate) sink: Option<Sink>,
}

/// A checkpoint written as pending by [`Checkpointer::prepare_checkpoint`], to be committed
/// by [`Checkpointer::commit`] once the side effects it covers are done.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a prepared checkpoint does nothing until committed"]
#[doc(alias = "PreparedCheckpointer")]
pub struct PreparedCheckpoint {
    position: ExtendedSequenceNumber,
}

impl PreparedCheckpoint {
    /// The prepared position.
    pub fn position(&self) -> &ExtendedSequenceNumber {
        &self.position
    }
}

impl Checkpointer {
    pub(crate) fn new(tenure: Arc<Tenure>) -> Self {
        Self {
            watermark: Arc::new(Watermark::new(tenure.clone())),
            tenure,
            last_delivered: None,
            opened: None,
            shard_end: None,
            writes: WriteLog::default(),
            committed: false,
            sink: None,
        }
    }

    /// What became of this instance's checkpoint writes (see `checkpoint::writes`): the shard task
    /// takes it between batches; a committer writing for this instance notes its own.
    pub(crate) fn writes(&self) -> &WriteLog {
        &self.writes
    }

    /// This processor instance's watermark.
    pub(crate) fn watermark(&self) -> &Arc<Watermark> {
        &self.watermark
    }

    /// The tenure this checkpointer writes for (`Parallel`'s committer commits through it).
    pub(crate) fn tenure(&self) -> &Arc<Tenure> {
        &self.tenure
    }

    /// The furthest position a checkpoint may go to now: the last delivered record, or the
    /// watermark while delivered records are unfinished (acknowledged later; see
    /// [`ack`](crate::ack)). Inside `process_records`, the hook's own batch counts as
    /// finished unless it was taken to acknowledge later.
    pub fn finished(&self) -> Option<ExtendedSequenceNumber> {
        self.watermark
            .position_in_hook(self.last_delivered.as_ref())
    }

    /// Checkpoints the watermark if it moved past the stored checkpoint (the worker's own
    /// checkpoints of acknowledged records); otherwise writes the stored checkpoint again if
    /// the records finished past it changed (sparse acknowledgements, see
    /// [`SparseAcks`](crate::ack::SparseAcks): a stuck record holds the checkpoint, not what
    /// the row says finished after it).
    pub(crate) async fn checkpoint_finished(&mut self) -> Result<(), CheckpointError> {
        let row = self.tenure.snapshot().await;
        let position = self.watermark.position(self.last_delivered.as_ref());
        let ahead = match (&position, &row.checkpoint) {
            (None, _) | (_, Checkpoint::ShardEnd) => false,
            (Some(position), Checkpoint::Sequence(current)) => position > current,
            _ => true,
        };
        if let (true, Some(position)) = (ahead, position) {
            return self.checkpoint_at(position).await;
        }
        if row.checkpoint == Checkpoint::ShardEnd
            || self.watermark.held_back()
            || self.acked(&row.checkpoint) == row.acked
        {
            return Ok(());
        }
        let mut update = CheckpointUpdate::new(row.checkpoint.clone());
        update.pending = row.pending_checkpoint;
        self.write(&update).await
    }

    pub(crate) fn set_last_delivered(&mut self, position: ExtendedSequenceNumber) {
        self.last_delivered = Some(position);
    }

    /// Delivery ends at `position` again: the records after it were given up unfinished.
    pub(crate) fn rewind_delivered(&mut self, position: Option<ExtendedSequenceNumber>) {
        self.last_delivered = position;
    }

    pub(crate) fn set_shard_end(&mut self, children: Vec<ShardId>) {
        self.shard_end = Some(children);
    }

    /// This tenure's fencing token: higher than that of every earlier holder of the shard's
    /// lease (see [`FencingToken`]). Condition writes to other systems on it.
    pub fn fencing_token(&self) -> FencingToken {
        self.tenure.fence()
    }

    /// The shard this checkpointer writes for.
    pub fn shard_id(&self) -> &ShardId {
        self.tenure.shard()
    }

    /// The last record handed to the processor, if any.
    pub fn last_delivered(&self) -> Option<&ExtendedSequenceNumber> {
        self.last_delivered.as_ref()
    }

    /// The default [`shard_ended`](crate::RecordProcessor::shard_ended): `SHARD_END` by
    /// [`checkpoint`](Self::checkpoint). A processor that committed outputs and has records
    /// delivered past its last commit is told at WARN: a plain `SHARD_END` passes them, and
    /// writes it still holds for them are lost (it should commit them in `shard_ended`).
    /// Not refused: a processor whose last records had no writes is right to end plainly,
    /// and a refusal would keep the shard's children from starting for good.
    pub(crate) async fn end_shard(&mut self) -> Result<(), CheckpointError> {
        if self.committed
            && let Some(last) = self.last_delivered.clone()
        {
            let current = self.tenure.snapshot().await.checkpoint;
            let past = match &current {
                Checkpoint::Sequence(at) => last > *at,
                _ => true,
            };
            if past {
                tracing::warn!(
                    checkpoint = %current,
                    last_delivered = %last,
                    "the shard ended with records delivered past the last commit of outputs: \
                     the default shard_ended checkpoints SHARD_END plainly, so writes this \
                     processor still holds for them are lost; commit them in shard_ended \
                     (Checkpointer::commit_outputs writes SHARD_END there)"
                );
            }
        }
        self.checkpoint().await
    }

    /// Checkpoints everything delivered so far ([`finished`](Self::finished) so far, when
    /// records are acknowledged later). Inside
    /// [`shard_ended`](crate::RecordProcessor::shard_ended) this writes `SHARD_END`, which
    /// lets the shard's children start. Without any delivery, or with records delivered and
    /// none of them finished, it checks the lease is still held and writes nothing.
    pub async fn checkpoint(&mut self) -> Result<(), CheckpointError> {
        if let Some(children) = &self.shard_end {
            if self.watermark.outstanding() > 0 && !mutation::on(Mutation::CheckpointPastUnfinished)
            {
                return Err(CheckpointError::Unfinished {
                    shard: self.shard_id().clone(),
                    requested: Checkpoint::ShardEnd.to_string(),
                    watermark: self.finished(),
                });
            }
            let update = CheckpointUpdate {
                checkpoint: Checkpoint::ShardEnd,
                pending: None,
                child_shard_ids: children.clone(),
                start_timestamp: None,
                endpoint: None,
                park: Vec::new(),
                restart_grace: None,
                carrier: None,
                signals: None,
                acked: None,
            };
            return self.write(&update).await;
        }
        match self.finished() {
            Some(position) => self.checkpoint_at(position).await,
            None if self.tenure.is_lost() => Err(self.lease_lost()),
            None => Ok(()),
        }
    }

    /// Checkpoints at `position`: that record and everything before it are done.
    pub async fn checkpoint_at(
        &mut self,
        position: ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        let current = self.validate(&position).await?;
        if current == Checkpoint::Sequence(position.clone()) {
            return if self.tenure.is_lost() {
                Err(self.lease_lost())
            } else {
                Ok(())
            };
        }
        let update = CheckpointUpdate {
            checkpoint: Checkpoint::Sequence(position),
            pending: None,
            child_shard_ids: Vec::new(),
            start_timestamp: None,
            endpoint: None,
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        };
        self.write(&update).await
    }

    /// Writes `position` (default: the last delivered record) as the pending checkpoint,
    /// leaving the committed one as it is. A new owner sees it in
    /// [`InitializationInput::pending_checkpoint`](crate::InitializationInput) and can tell
    /// that side effects up to it may have happened.
    pub async fn prepare_checkpoint(
        &mut self,
        position: Option<ExtendedSequenceNumber>,
    ) -> Result<PreparedCheckpoint, CheckpointError> {
        let Some(position) = position.or_else(|| self.finished()) else {
            return Err(CheckpointError::NothingDelivered {
                shard: self.shard_id().clone(),
            });
        };
        let current = self.validate(&position).await?;
        let update = CheckpointUpdate {
            checkpoint: current,
            pending: Some(Checkpoint::Sequence(position.clone())),
            child_shard_ids: Vec::new(),
            start_timestamp: None,
            endpoint: None,
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        };
        self.write(&update).await?;
        Ok(PreparedCheckpoint { position })
    }

    /// Commits a prepared checkpoint and clears the pending one.
    pub async fn commit(&mut self, prepared: PreparedCheckpoint) -> Result<(), CheckpointError> {
        self.validate(&prepared.position).await?;
        let update = CheckpointUpdate {
            checkpoint: Checkpoint::Sequence(prepared.position),
            pending: None,
            child_shard_ids: Vec::new(),
            start_timestamp: None,
            endpoint: None,
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        };
        self.write(&update).await
    }

    /// Checks `position` against what was delivered and the current checkpoint; returns the
    /// current checkpoint.
    async fn validate(
        &self,
        position: &ExtendedSequenceNumber,
    ) -> Result<Checkpoint, CheckpointError> {
        if self
            .last_delivered
            .as_ref()
            .is_none_or(|last| position > last)
        {
            return Err(CheckpointError::NotDelivered {
                shard: self.shard_id().clone(),
                requested: position.clone(),
                last_delivered: self.last_delivered.clone(),
            });
        }
        let finished = self.finished();
        if finished.as_ref().is_none_or(|finished| position > finished)
            && !mutation::on(Mutation::CheckpointAtPastWatermark)
        {
            return Err(CheckpointError::Unfinished {
                shard: self.shard_id().clone(),
                requested: position.to_string(),
                watermark: finished,
            });
        }
        let current = self.tenure.snapshot().await.checkpoint;
        let behind = match &current {
            Checkpoint::Sequence(c) => position < c,
            Checkpoint::ShardEnd => true,
            _ => false,
        };
        if behind {
            return Err(CheckpointError::Backwards {
                shard: self.shard_id().clone(),
                requested: position.to_string(),
                current,
            });
        }
        Ok(current)
    }

    /// `update` with what goes with every checkpoint: the parked-key entries its checkpoint
    /// passes, and the records past it that finished (sparse acknowledgements). Read after
    /// the position was chosen (see `Watermark::parking`). An entry goes only with a
    /// checkpoint that passes its record: written with one that stops short, a crash would
    /// leave the key parked in the row while the record (and the good ones before it) are
    /// delivered again.
    fn with_parking(&self, update: &CheckpointUpdate) -> CheckpointUpdate {
        let mut update = update.clone();
        let parking = self.watermark.parking();
        let pending = parking.len();
        update.park = passed_by(parking, &update.checkpoint);
        // While a key's entry waits for a checkpoint that passes its record, the records
        // given up behind it finish without the row saying why: listed as finished, a
        // successor would skip them and run the key's later records out of order.
        update.acked = if update.park.len() < pending {
            None
        } else {
            self.acked(&update.checkpoint)
        };
        update
    }

    /// The `kclAcked` value to write with `checkpoint`: the records past it that finished.
    fn acked(&self, checkpoint: &Checkpoint) -> Option<String> {
        let acks = self.watermark.sparse(checkpoint);
        let (value, kept) = acks.encode_within(checkpoint, SparseAcks::MAX_ENCODED);
        if kept < acks.runs().len() {
            tracing::debug!(
                kept,
                runs = acks.runs().len(),
                "more records finished past the checkpoint than the lease row holds: those \
                 furthest from it would be delivered again after a failover"
            );
        }
        value
    }

    async fn write(&mut self, update: &CheckpointUpdate) -> Result<(), CheckpointError> {
        let update = &self.with_parking(update);
        let written = match self.tenure.checkpoint(update).await {
            Ok(_) => {
                metrics::counter!(crate::metrics::CHECKPOINTS).increment(1);
                self.watermark.parked(&update.park);
                self.writes.applied();
                return Ok(());
            }
            Err(TenureError::Lost) => Err(self.lease_lost()),
            Err(TenureError::Behind(current)) => Err(CheckpointError::Backwards {
                shard: self.shard_id().clone(),
                requested: update.checkpoint.to_string(),
                current,
            }),
            Err(TenureError::Store(source)) => Err(CheckpointError::Store {
                shard: self.shard_id().clone(),
                source,
            }),
        };
        if let Err(error) = &written {
            self.writes.failed(error);
        }
        written
    }

    fn lease_lost(&self) -> CheckpointError {
        CheckpointError::LeaseLost {
            shard: self.shard_id().clone(),
        }
    }
}

/// The parked-key entries of `parking` whose record `checkpoint` passes (all of them at the
/// shard's end; a malformed one never, logged).
pub(crate) fn passed_by(parking: Vec<String>, checkpoint: &Checkpoint) -> Vec<String> {
    if mutation::on(Mutation::ParkingBeforeItsRecord) {
        return parking;
    }
    let passes = |entry: &String| match (checkpoint, crate::failure::parse_park_entry(entry)) {
        (Checkpoint::ShardEnd, _) => true,
        (Checkpoint::Sequence(at), Some((_, behind))) => behind <= *at,
        (_, None) => {
            tracing::warn!(entry, "a malformed parked-key entry is not written");
            false
        }
        _ => false,
    };
    parking.into_iter().filter(passes).collect()
}

mod commit;
#[cfg(test)]
mod tests;
pub(crate) mod writes;
