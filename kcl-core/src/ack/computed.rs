//! Records computed but not finished: [`Parallel::with_outputs`](crate::Parallel::with_outputs)
//! finishes a record only once its writes committed with a checkpoint that covers it (see
//! [`parallel::outputs`](crate::parallel::outputs)). Its committer asks the watermark where
//! such a commit may reach, and holds the watermark's own checkpoints back: its commits write
//! the shard's checkpoints.

use super::{Ack, Watermark};
use crate::types::ExtendedSequenceNumber;

impl Ack {
    /// The record's place in delivery order ([`Watermark::first_uncovered`]).
    pub(crate) fn index(&self) -> u64 {
        self.index
    }
}

impl Watermark {
    /// Where a commit of computed records may reach: the index of the oldest delivered
    /// record neither finished nor `computed`, and the position of the record delivered
    /// before it (`None` when every delivered record is one or the other).
    pub(crate) fn first_uncovered(
        &self,
        computed: impl Fn(u64) -> bool,
    ) -> Option<(u64, Option<ExtendedSequenceNumber>)> {
        let state = self.lock();
        (state.base..)
            .zip(&state.entries)
            .find(|(index, e)| !e.finished && !computed(*index))
            .map(|(index, e)| (index, e.previous.clone()))
    }

    /// Holds every checkpoint of the watermark back (its position is `None`) while `hold`:
    /// the processor's commits write the shard's checkpoints instead, each conditioned on the
    /// checkpoint before it (a plain checkpoint, conditioned on the lease counter alone, could
    /// land after a commit and move the row's checkpoint back past writes it committed).
    pub(crate) fn hold_back(&self, hold: bool) {
        self.lock().held_back = hold;
    }
}
