//! Records that finished before the shard was opened, skipped before the processor sees them
//! (sparse acknowledgements, see [`SparseAcks`]).
//!
//! The lease row carries the records past its checkpoint that finished (`kclAcked`). When a
//! processor opens the shard (a new holder after a failover or a handoff, or a new processor
//! after a failure), those records are read as usual but not handed over: they take no place
//! in the watermark, the record delivered after them counts them as its predecessors (so the
//! watermark, and the checkpoint, pass them as soon as everything before them finished), and
//! every checkpoint writes them on until it passes them. Once the reader is past the highest
//! of them, nothing is checked any more.
//!
//! Under transactional outputs ([`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs))
//! this stays exactly once: a record counts as finished only once its outputs committed (under
//! `Parallel`, a record whose outputs wait for the watermark is computed, not finished), so
//! a record skipped here has its outputs in the table.

use std::sync::Arc;

use crate::ack::{SparseAcks, SparseAcksError, Watermark};
use crate::lease::Lease;
use crate::processor::ProcessRecordsInput;
use crate::types::{ExtendedSequenceNumber, Record, ShardId};

/// Tells `watermark` which records past the checkpoint `lease` says finished.
pub(super) fn open(watermark: &Watermark, lease: &Lease) {
    let Some(value) = &lease.acked else {
        return;
    };
    if crate::mutation::on(crate::mutation::Mutation::AckedIgnoredOnOpen) {
        return;
    }
    match SparseAcks::decode(value, &lease.checkpoint) {
        Ok(acks) => {
            tracing::info!(
                runs = acks.runs().len(),
                highest = ?acks.highest().map(ToString::to_string),
                "records past the checkpoint finished before: they are not delivered again"
            );
            watermark.inherit(acks);
        }
        Err(error @ SparseAcksError::Stale { .. }) => {
            tracing::info!(%error, "the lease's finished records (kclAcked) are ignored");
        }
        Err(error) => tracing::warn!(
            %error,
            value,
            "the lease's finished records (kclAcked) do not parse: ignored, every record past \
             the checkpoint is delivered again"
        ),
    }
}

/// A fetched batch without the records that finished before.
pub(super) struct Kept {
    /// The records to deliver.
    pub(super) records: Vec<Record>,
    /// For each of them, the record before it in the shard, skipped or not.
    pub(super) previous: Vec<Option<ExtendedSequenceNumber>>,
    /// For each of them, how many records were skipped right before it.
    before: Vec<u64>,
    /// How many records were skipped after the last one kept.
    after: u64,
    /// The batch's last record, skipped or not: where delivery stands after it.
    pub(super) last: Option<ExtendedSequenceNumber>,
    /// How many records were skipped.
    pub(super) skipped: u64,
}

impl Kept {
    /// Each kept record's position, with the record before it and how many were skipped
    /// in between (see `Watermark::reserve_each`).
    pub(super) fn pairs(
        &self,
    ) -> impl Iterator<Item = (Option<ExtendedSequenceNumber>, ExtendedSequenceNumber, u64)> + '_
    {
        let positions = self.records.iter().map(Record::position);
        (self.previous.iter().cloned().zip(positions))
            .zip(self.before.iter().copied())
            .map(|((previous, position), skipped)| (previous, position, skipped))
    }

    /// The kept records as a batch for `process_records`, in its place in `watermark` after
    /// `previous` (the batch's own records skipped in it).
    pub(super) fn input(
        self,
        millis_behind_latest: Option<u64>,
        watermark: &Arc<Watermark>,
        previous: Option<ExtendedSequenceNumber>,
    ) -> ProcessRecordsInput<'_> {
        let after = self.after;
        let input = if self.skipped == 0 {
            ProcessRecordsInput::delivered(self.records, millis_behind_latest, watermark, previous)
        } else {
            // Each record after the one before it in the shard, skipped or not.
            let reservation = watermark.reserve_each(self.pairs());
            ProcessRecordsInput::part(self.records, millis_behind_latest, watermark, reservation)
        };
        watermark.skipped(after);
        input
    }

    /// Tells `watermark` of the records skipped after the last one kept, once the kept ones
    /// took their places.
    pub(super) fn skipped_after(&self, watermark: &Watermark) {
        if self.after > 0 {
            watermark.skipped(self.after);
        }
    }
}

/// Drops from `records` (read after `previous`) those `watermark` says finished before;
/// counts them.
pub(super) fn finished(
    watermark: &Watermark,
    shard: &ShardId,
    records: Vec<Record>,
    mut previous: Option<ExtendedSequenceNumber>,
) -> Kept {
    let mut kept = Kept {
        records: Vec::with_capacity(records.len()),
        previous: Vec::with_capacity(records.len()),
        last: None,
        skipped: 0,
        before: Vec::with_capacity(records.len()),
        after: 0,
    };
    for record in records {
        let position = record.position();
        if watermark.finished_before(&position) {
            kept.skipped += 1;
            kept.after += 1;
        } else {
            kept.previous.push(previous);
            kept.before.push(std::mem::take(&mut kept.after));
            kept.records.push(record);
        }
        previous = Some(position);
    }
    kept.last = previous;
    if kept.skipped > 0 {
        let skipped = kept.skipped;
        tracing::debug!(skipped, "records that finished before not delivered again");
        ::metrics::counter!(crate::metrics::ALREADY_FINISHED, "shard" => shard.to_string())
            .increment(skipped);
    }
    kept
}
