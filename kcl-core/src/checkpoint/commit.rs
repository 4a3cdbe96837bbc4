//! Checkpoints that carry a processor's outputs (see [`outputs`](crate::outputs)).

use super::Checkpointer;
use crate::error::CheckpointError;
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{TenureError, Transacted};
use crate::mutation::{self, Mutation};
use crate::outputs::{Outputs, Part, Transact, split};
use crate::types::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

impl Checkpointer {
    /// Checkpoints as [`checkpoint`](Self::checkpoint) does, committing `outputs` (the
    /// writes of the records up to there) with it, exactly once: they apply in the same
    /// transaction of `store` as the checkpoint, conditioned on this tenure still holding
    /// the lease, so a replay never finds them unwritten and a worker that lost the lease
    /// cannot write them. Inside [`shard_ended`](crate::RecordProcessor::shard_ended) the
    /// last transaction writes `SHARD_END`.
    ///
    /// Writes more than one transaction holds commit in parts, each with the checkpoint of
    /// its last record, a record's writes always together: a crash between two parts leaves
    /// outputs and checkpoint in step.
    ///
    /// # Errors
    /// As [`checkpoint_at`](Self::checkpoint_at); [`CheckpointError::OutputOutside`] for an
    /// output of a record at or before the stored checkpoint or past the position;
    /// [`CheckpointError::OutputsTooLarge`] if one record's writes exceed a transaction (both
    /// before anything is written); [`CheckpointError::OutputRefused`] when a write's own
    /// condition fails (the parts before it stay committed); [`CheckpointError::OutputInvalid`]
    /// when the store refuses a record's writes as invalid (the parts before it stay
    /// committed; if the store did not say which write, the records of that part before it
    /// too: each was committed alone). On
    /// [`CheckpointError::LeaseLost`] nothing more is written: the new holder redoes what
    /// was not committed.
    pub async fn commit_outputs<T: Transact>(
        &mut self,
        store: &T,
        outputs: Outputs<T::Write>,
    ) -> Result<(), CheckpointError> {
        let last = match (&self.shard_end, self.finished()) {
            (Some(_), _) => None,
            (None, Some(position)) => Some(position),
            (None, None) if outputs.is_empty() => return self.checkpoint().await,
            (None, None) => {
                return Err(CheckpointError::NothingDelivered {
                    shard: self.shard_id().clone(),
                });
            }
        };
        self.commit_through(store, outputs, last).await
    }

    /// As [`commit_outputs`](Self::commit_outputs), checkpointing `position` (a delivered,
    /// finished record) rather than everything finished.
    ///
    /// # Errors
    /// As [`commit_outputs`](Self::commit_outputs).
    pub async fn commit_outputs_at<T: Transact>(
        &mut self,
        store: &T,
        outputs: Outputs<T::Write>,
        position: ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        self.commit_through(store, outputs, Some(position)).await
    }

    /// Commits `outputs` in parts, the last one checkpointing `last` (`None`: `SHARD_END`);
    /// a failure is noted for the shard's progress (see [`writes`](super::writes)).
    async fn commit_through<T: Transact>(
        &mut self,
        store: &T,
        outputs: Outputs<T::Write>,
        last: Option<ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        let committed = self.commit_parts(store, outputs, last).await;
        if let Err(error) = &committed {
            self.writes.failed(error);
        }
        committed
    }

    /// See [`commit_through`](Self::commit_through).
    async fn commit_parts<T: Transact>(
        &mut self,
        store: &T,
        outputs: Outputs<T::Write>,
        last: Option<ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        // An acknowledged record counts as finished, and the row lists it for a successor to
        // skip, before its outputs could commit: the two cannot go together.
        if self.watermark.used() {
            return Err(CheckpointError::OutputsAcknowledgedLater {
                shard: self.shard_id().clone(),
            });
        }
        if store.keeps_position() && self.sink.is_none() {
            return Err(CheckpointError::PositionsNotOpened {
                shard: self.shard_id().clone(),
            });
        }
        let current = match &last {
            Some(position) => self.validate(position).await?,
            None => self.tenure.snapshot().await.checkpoint,
        };
        self.check_outside(&outputs, &current, last.as_ref())?;
        store.prepare(&outputs.writes()).await;
        let parts =
            split(outputs.into_inner(), |w| store.measure(w), store.limits()).map_err(|large| {
                CheckpointError::OutputsTooLarge {
                    shard: self.shard_id().clone(),
                    record: large.record,
                    writes: large.writes,
                    bytes: large.bytes,
                }
            })?;
        for part in parts {
            self.commit_isolating(store, part, last.as_ref()).await?;
        }
        Ok(())
    }

    /// The checkpoint of a part that checkpoints `through` (`None`: the position asked for,
    /// `last`, or `SHARD_END` when that is `None` too).
    fn part_update(
        &self,
        through: Option<&ExtendedSequenceNumber>,
        last: Option<&ExtendedSequenceNumber>,
    ) -> Result<CheckpointUpdate, CheckpointError> {
        let own = through.filter(|_| !mutation::on(Mutation::PartsCheckpointTheStretch));
        Ok(match (own.or(last), &self.shard_end) {
            (Some(at), _) => CheckpointUpdate::new(Checkpoint::Sequence(at.clone())),
            (None, children) => {
                self.check_shard_end()?;
                let mut update = CheckpointUpdate::new(Checkpoint::ShardEnd);
                update.child_shard_ids = children.clone().unwrap_or_default();
                update
            }
        })
    }

    /// Commits `part`. Refused as invalid without the store naming the write, a part of
    /// several records is committed again one record at a time (see
    /// [`outputs`](crate::outputs)): the records before the one at fault commit, and the one
    /// whose writes fail alone is named.
    async fn commit_isolating<T: Transact>(
        &mut self,
        store: &T,
        part: Part<T::Write>,
        last: Option<&ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        let update = self.part_update(part.through.as_ref(), last)?;
        let (part, reason) = match self.commit_part(store, part, &update).await? {
            None => return Ok(()),
            Some(unnamed) if unnamed.0.several_records() => unnamed,
            Some((part, reason)) => return Err(self.invalid(&part, reason)),
        };
        tracing::info!(
            %reason,
            writes = part.writes.len(),
            "the store refused a part of the outputs as invalid without naming the write: \
             committing its records one at a time"
        );
        for alone in part.by_record() {
            let update = self.part_update(alone.through.as_ref(), last)?;
            if let Some((alone, reason)) = self.commit_part(store, alone, &update).await? {
                return Err(self.invalid(&alone, reason));
            }
        }
        Ok(())
    }

    /// `part`'s record (its first) was refused as invalid.
    fn invalid<W>(&self, part: &Part<W>, reason: String) -> CheckpointError {
        let record = part.writes.first().map(|(record, _)| record.clone());
        CheckpointError::OutputInvalid {
            shard: self.shard_id().clone(),
            record: record.unwrap_or_else(|| ExtendedSequenceNumber::new(SequenceNumber::from(0))),
            reason,
        }
    }

    /// Refuses outputs of records at or before `current` or after `last`.
    fn check_outside<W>(
        &self,
        outputs: &Outputs<W>,
        current: &Checkpoint,
        last: Option<&ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        let outside = |record: &ExtendedSequenceNumber| {
            let done = match current {
                Checkpoint::Sequence(c) => record <= c,
                Checkpoint::ShardEnd => true,
                _ => false,
            };
            done || last.is_some_and(|last| record > last)
                || self.last_delivered.as_ref().is_none_or(|d| record > d)
        };
        match outputs.records().find(|r| outside(r)) {
            Some(record) => Err(CheckpointError::OutputOutside {
                shard: self.shard_id().clone(),
                record: record.clone(),
                after: current.clone(),
                upto: last.map_or_else(|| Checkpoint::ShardEnd.to_string(), ToString::to_string),
            }),
            None => Ok(()),
        }
    }

    /// `SHARD_END` waits for every record delivered to finish.
    fn check_shard_end(&self) -> Result<(), CheckpointError> {
        if self.watermark.outstanding() > 0 {
            return Err(CheckpointError::Unfinished {
                shard: self.shard_id().clone(),
                requested: Checkpoint::ShardEnd.to_string(),
                watermark: self.finished(),
            });
        }
        Ok(())
    }

    /// One transaction: `part`'s writes with `update` (a plain checkpoint without writes).
    /// `Some`, with the part and what the store said, if the store refused it as invalid
    /// without naming the write.
    async fn commit_part<T: Transact>(
        &mut self,
        store: &T,
        part: Part<T::Write>,
        update: &CheckpointUpdate,
    ) -> Result<Option<(Part<T::Write>, String)>, CheckpointError> {
        // A part without writes is a transaction too: a plain checkpoint is conditioned on
        // the counter, which commits leave alone, so one written while an earlier commit of
        // this tenure is still in flight could land under it and move the row back behind
        // its outputs; a commit is conditioned on the checkpoint before it.
        let update = self.with_parking(update);
        let through = part.through;
        let (records, writes): (Vec<ExtendedSequenceNumber>, Vec<T::Write>) =
            part.writes.into_iter().unzip();
        let shard = || self.shard_id().clone();
        let named = |index: usize| {
            let record = records.get(index).or(records.last()).cloned();
            record.unwrap_or_else(|| ExtendedSequenceNumber::new(SequenceNumber::from(0)))
        };
        match self
            .tenure
            .transact(
                store,
                &update,
                &writes,
                (records.first(), self.sink.as_ref()),
            )
            .await
        {
            Ok(Transacted::Applied) => {
                metrics::counter!(crate::metrics::CHECKPOINTS).increment(1);
                self.watermark.parked(&update.park);
                self.writes.applied();
                self.committed = true;
                Ok(None)
            }
            Ok(Transacted::Refused { index, reason }) => Err(CheckpointError::OutputRefused {
                shard: shard(),
                record: named(index),
                reason,
            }),
            Ok(Transacted::Invalid {
                index: Some(index),
                reason,
            }) if index < records.len() => Err(CheckpointError::OutputInvalid {
                shard: shard(),
                record: named(index),
                reason,
            }),
            Ok(Transacted::Invalid { reason, .. }) => {
                let writes = records.into_iter().zip(writes).collect();
                Ok(Some((Part { writes, through }, reason)))
            }
            Err(TenureError::Lost) => Err(self.lease_lost()),
            Err(TenureError::Behind(current)) => Err(CheckpointError::Backwards {
                shard: shard(),
                requested: update.checkpoint.to_string(),
                current,
            }),
            Err(TenureError::Store(source)) => Err(CheckpointError::Store {
                shard: shard(),
                source,
            }),
        }
    }
}
