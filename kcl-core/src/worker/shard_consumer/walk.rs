//! A batch under a failure policy that handles failures in place (see
//! [`failure`](crate::failure)): delivered whole, then, if it fails, part by part until the
//! record that fails is found, tried again and given up on.
//!
//! The batch holds its place in the watermark as one reservation that only this walk
//! finishes, a part at a time: a part the processor handled, the records it checkpointed, a
//! record given up on once the sink took it. A part the processor takes to acknowledge later
//! is its own from then on (its `Ack`s finish it); if it then fails, the shard restarts, as
//! without a policy. Waits (a retry's backoff, a refusing sink) end with the lease's validity
//! or a graceful stop; a stop gives the rest of the batch up unfinished, so the checkpoint
//! stays before it and the next owner delivers it again.

use std::ops::Range;

use super::skip::Kept;
use super::{Failure, Hook, hook};
use crate::ack::Reservation;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::failure::{Bisect, Handling, Reason, Then, failed_at};
use crate::lease::tenure::Tenure;
use crate::mutation::{self, Mutation};
use crate::processor::{ProcessRecordsInput, RecordProcessor};
use crate::types::{Checkpoint, ExtendedSequenceNumber, Record};

use super::Control;

/// Delivers `records` under `handling`; see the module docs.
pub(super) async fn deliver(
    handling: &Handling,
    (tenure, control): (&Tenure, &Control),
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    kept: &Kept,
    millis_behind_latest: Option<u64>,
) -> Result<Hook, Failure> {
    let records = &kept.records[..];
    let watermark = checkpointer.watermark().clone();
    let batch = watermark.reserve_each(kept.pairs()).walked();
    kept.skipped_after(&watermark);
    let mut walk = Walk {
        handling,
        tenure,
        control,
        records,
        previous: &kept.previous,
        opened: checkpointer.opened.clone(),
        batch,
        bisect: Bisect::new(records.len()),
    };
    while let Some(part) = walk.bisect.next() {
        if super::batches::past_validity(tenure) {
            return Ok(Hook::Expired);
        }
        let input = ProcessRecordsInput::part(
            records[part.clone()].to_vec(),
            millis_behind_latest,
            &watermark,
            walk.batch.part(part.clone()),
        );
        if let Some(last) = records.get(part.end - 1) {
            checkpointer.set_last_delivered(last.position());
        }
        let call = processor.process_records(input, checkpointer);
        let outcome = hook(tenure, "process_records", call).await;
        let own = watermark.hook_returned();
        let error: BoxError = match outcome {
            Ok(Hook::Done) => {
                if own {
                    walk.batch.finish(part);
                    handling.succeeded();
                }
                // Taken to acknowledge later: each success counts as its `Ack` is done.
                continue;
            }
            Ok(other) => return Ok(other),
            // Its records were taken to acknowledge later: they are the processor's now.
            Err(failure) if !own => return Err(failure),
            Err(Failure::Processor { source, .. }) => source,
            Err(Failure::Panic { message, .. }) => {
                format!("process_records panicked: {message}").into()
            }
            Err(other) => return Err(other),
        };
        if let Some(end) = walk.failed(part, error, checkpointer).await? {
            return Ok(end);
        }
    }
    if let Some(last) = records.last() {
        checkpointer.set_last_delivered(last.position());
    }
    Ok(Hook::Done)
}

/// One batch's walk: what it needs between parts.
struct Walk<'a> {
    handling: &'a Handling,
    tenure: &'a Tenure,
    control: &'a Control,
    records: &'a [Record],
    /// The record before each of the batch's in the shard (records that finished before
    /// are not delivered, see `skip`).
    previous: &'a [Option<ExtendedSequenceNumber>],
    /// The checkpoint the shard was opened after, if a record's.
    opened: Option<ExtendedSequenceNumber>,
    /// The batch's place in the watermark, finished a part at a time.
    batch: Reservation,
    bisect: Bisect,
}

impl Walk<'_> {
    /// The part `part` failed with `error`: what the policy says follows, done (a split, a
    /// retry's wait, a record given up). `Some` when the walk ends there.
    async fn failed(
        &mut self,
        part: Range<usize>,
        error: BoxError,
        checkpointer: &mut Checkpointer,
    ) -> Result<Option<Hook>, Failure> {
        let records = self.records;
        let checkpointed = checkpointed(self.tenure, records).await;
        let named = failed_at(&error);
        let at = named.and_then(|p| records.iter().position(|r| &r.position() == p));
        if let Some(p) = named
            && at.is_none_or(|i| !part.contains(&i) || i < checkpointed)
        {
            tracing::warn!(
                named = %p,
                "BatchFailed names a record that is not in the batch delivered, or that the \
                 processor checkpointed: the batch is bisected instead"
            );
        }
        let policy = &self.handling.policy;
        let failed = self
            .bisect
            .failed(policy, records, part, checkpointed, at, &error);
        // Where the failing record is: everything before it finished.
        let failing = failed.processed.end;
        if !failed.processed.is_empty() {
            // Named (or checkpointed) records before it succeeded: a run of give-ups ends.
            self.handling.succeeded();
        }
        self.batch.finish(failed.processed);
        let waited = match failed.then {
            Then::Split => {
                self.handling.bisected();
                Waited::Done(Ok(()))
            }
            Then::Retry(index, wait) => {
                let tries = self.bisect.tries(index);
                self.handling.retrying(&records[index], &tries, wait);
                let rest = async {
                    tokio::time::sleep(wait).await;
                    Ok(())
                };
                wait_for(self.tenure, self.control, rest).await
            }
            // An outage: the record blocks (the shard restarts from its checkpoint).
            Then::GiveUp(..) if !self.handling.may_give_up() => Waited::Done(Err(error)),
            Then::GiveUp(index, reason) => {
                let waited = self.give_up(index, reason).await;
                if matches!(waited, Waited::Done(Ok(()))) {
                    self.pass(index, checkpointer).await;
                }
                waited
            }
            Then::Block => Waited::Done(Err(error)),
        };
        match waited {
            Waited::Done(Ok(())) => Ok(None),
            Waited::Done(Err(source)) => Err(Failure::Processor {
                hook: "process_records",
                source,
            }),
            Waited::Lost => Ok(Some(Hook::Expired)),
            Waited::Stopped => {
                // Delivery ends before the failing record: the next owner starts there.
                if let Some(previous) = self.batch.abandon_from(failing) {
                    checkpointer.rewind_delivered(previous);
                }
                Ok(Some(Hook::Stopped))
            }
        }
    }

    /// Checkpoints past the record at `index`, just given up, if the processor's own
    /// checkpoint stands right before it: nothing else would (a batch processor checkpoints
    /// only in its hooks), and after a restart the record would be given up again. Only
    /// then: the records before it are the processor's to call done.
    async fn pass(&self, index: usize, checkpointer: &mut Checkpointer) {
        // Nothing delivered yet (a new holder, a restart): the checkpoint it opened after.
        let before = self.previous.get(index).cloned().flatten();
        let before = before.or_else(|| self.opened.clone());
        let committed = self.tenure.snapshot().await.checkpoint;
        if before.is_some_and(|b| committed == Checkpoint::Sequence(b)) {
            let at = self.records[index].position();
            if let Err(error) = checkpointer.checkpoint_at(at).await {
                tracing::debug!(%error, "checkpointing past a record given up failed");
            }
        }
    }

    /// Gives the record at `index` up as the policy says; finished once that is over.
    async fn give_up(&self, index: usize, reason: Reason) -> Waited {
        let tries = self.bisect.tries(index);
        let letter = self
            .handling
            .letter(self.records[index].clone(), &tries, reason);
        match wait_for(self.tenure, self.control, self.handling.give_up(letter)).await {
            Waited::Done(Ok(())) => {
                self.batch.finish(index..index + 1);
                Waited::Done(Ok(()))
            }
            other => other,
        }
    }
}

/// How a wait inside the walk ended.
enum Waited {
    Done(Result<(), BoxError>),
    /// The lease's validity ran out.
    Lost,
    /// A graceful stop came first.
    Stopped,
}

/// Waits for `work` unless the lease's validity ends or a graceful stop comes first.
async fn wait_for(
    tenure: &Tenure,
    control: &Control,
    work: impl Future<Output = Result<(), BoxError>>,
) -> Waited {
    tokio::select! {
        biased;
        () = control.graceful.cancelled() => Waited::Stopped,
        done = tenure.while_valid(work) => match done {
            Some(result) => Waited::Done(result),
            None => Waited::Lost,
        },
    }
}

/// How many records of the batch the lease's checkpoint covers (the processor checkpointed
/// them in its hook).
async fn checkpointed(tenure: &Tenure, records: &[Record]) -> usize {
    let committed = tenure.snapshot().await.checkpoint;
    let covered = records.partition_point(|r| {
        committed
            .progress_cmp(&Checkpoint::Sequence(r.position()))
            .is_some_and(std::cmp::Ordering::is_ge)
    });
    if mutation::on(Mutation::BisectRedeliversCheckpointed) {
        return covered.saturating_sub(1);
    }
    covered
}
