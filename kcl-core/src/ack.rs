//! Asynchronous acknowledgement: records that finish after `process_records` returned, and
//! the checkpoint watermark they leave.
//!
//! A processor that hands records to its own tasks or queues cannot checkpoint when
//! `process_records` returns: the work is not done yet. Checkpointing anyway loses records on
//! a crash; waiting in the hook serializes the shard again. Instead it takes the batch with
//! [`ProcessRecordsInput::acknowledge_later`](crate::ProcessRecordsInput::acknowledge_later):
//! one [`Ack`] per record, completed later from any task.
//!
//! The shard task keeps the **watermark**: the last position below which every delivered
//! record has finished. The rules:
//! - every checkpoint stops at the watermark: [`Checkpointer::checkpoint`](crate::Checkpointer::checkpoint)
//!   writes it instead of the last delivered record, and a position past it is refused with
//!   [`CheckpointError::Unfinished`](crate::CheckpointError::Unfinished);
//! - the worker checkpoints the watermark itself as acknowledgements arrive (after
//!   [`ack_checkpoint_every`](crate::WorkerConfig::ack_checkpoint_every) records or
//!   [`ack_checkpoint_interval`](crate::WorkerConfig::ack_checkpoint_interval)), before
//!   `shutdown_requested` on a graceful stop or a handoff (having waited for what is in flight
//!   until half the [`shutdown_timeout`](crate::WorkerConfig::shutdown_timeout) or the lease's
//!   validity ends), and writes `SHARD_END` only once every record of the shard finished;
//! - reading pauses while [`max_unacknowledged`](crate::WorkerConfig::max_unacknowledged)
//!   records are outstanding: memory stays bounded however slow the acknowledgements are;
//! - [`Ack::fail`], or an `Ack` dropped unacknowledged (a task that panicked or was
//!   cancelled), restarts the shard from the watermark, as a failing `process_records` does:
//!   every record after it is delivered again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::BoxError;
use crate::lease::tenure::Tenure;
use crate::mutation::{self, Mutation};
use crate::types::ExtendedSequenceNumber;

/// Completes one record handed out by
/// [`ProcessRecordsInput::acknowledge_later`](crate::ProcessRecordsInput::acknowledge_later).
///
/// `Send` and `'static`: move it to the task that finishes the record. Dropping it without
/// [`done`](Self::done) counts as [`fail`](Self::fail): a record whose task panicked or was
/// cancelled is delivered again, never skipped.
#[derive(Debug)]
#[must_use = "a record is finished only once its Ack is done; dropping it restarts the shard"]
pub struct Ack {
    watermark: Weak<Watermark>,
    index: u64,
    settled: bool,
}

impl Ack {
    /// The record is finished: the watermark may move past it.
    pub fn done(mut self) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade() {
            watermark.finish(self.index, None);
        }
    }

    /// The record failed: the shard restarts from the watermark, so this record and every
    /// one after it is delivered again.
    pub fn fail(mut self, error: impl Into<BoxError>) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade() {
            watermark.finish(self.index, Some(error.into()));
        }
    }
}

impl Ack {
    /// Resolves once the lease the record was delivered under may be held elsewhere (see
    /// [`RecordProcessor`](crate::RecordProcessor)'s fencing in time): work on the record
    /// must stop, as a hook's does.
    pub(crate) async fn expired(&self) {
        let tenure = self.watermark.upgrade().and_then(|w| w.tenure.clone());
        match tenure {
            Some(tenure)
                if !mutation::on(Mutation::HooksOutliveLease)
                    && !mutation::on(Mutation::SkipValidityCheck) =>
            {
                tenure.expired().await;
            }
            _ => std::future::pending().await,
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if !self.settled
            && let Some(watermark) = self.watermark.upgrade()
        {
            watermark.finish(
                self.index,
                Some("a record's Ack was dropped unacknowledged (its task panicked or was cancelled)".into()),
            );
        }
    }
}

/// One processor instance's watermark; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    state: Mutex<State>,
    progress: Notify,
    /// The tenure the records were delivered under: work on them ends with its validity.
    tenure: Option<Arc<Tenure>>,
}

#[derive(Debug, Default)]
struct State {
    /// Acknowledgements still awaited, in delivery order, from the oldest unfinished one on.
    entries: VecDeque<Entry>,
    /// The index of `entries[0]`.
    base: u64,
    /// The index the next registered record gets.
    next: u64,
    /// Records not finished.
    outstanding: usize,
    /// Records the watermark passed since [`Watermark::take_advanced`] last looked.
    advanced: u64,
    /// The first failure, until the shard task takes it.
    failed: Option<BoxError>,
}

#[derive(Debug)]
struct Entry {
    /// The record delivered just before this one, if any: the watermark while this one waits.
    previous: Option<ExtendedSequenceNumber>,
    finished: bool,
    delivered: Instant,
}

impl Watermark {
    /// The watermark of records delivered under `tenure`.
    pub(crate) fn new(tenure: Arc<Tenure>) -> Self {
        Self {
            tenure: Some(tenure),
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers records delivered in order, the first after `previous`; one `Ack` each.
    pub(crate) fn register(
        self: &Arc<Self>,
        previous: Option<ExtendedSequenceNumber>,
        positions: impl Iterator<Item = ExtendedSequenceNumber>,
    ) -> Vec<Ack> {
        let mut state = self.lock();
        let delivered = Instant::now();
        let mut previous = previous;
        let mut acks = Vec::new();
        for position in positions {
            if state.entries.is_empty() {
                state.base = state.next;
            }
            state.entries.push_back(Entry {
                previous: previous.replace(position),
                finished: false,
                delivered,
            });
            acks.push(Ack {
                watermark: Arc::downgrade(self),
                index: state.next,
                settled: false,
            });
            state.next += 1;
            state.outstanding += 1;
        }
        acks
    }

    fn finish(&self, index: u64, failure: Option<BoxError>) {
        let mut state = self.lock();
        let Some(offset) = index
            .checked_sub(state.base)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return;
        };
        let Some(entry) = state.entries.get_mut(offset) else {
            return;
        };
        if let Some(error) = failure {
            // The record stays unfinished: the watermark never passes it.
            if state.failed.is_none() {
                state.failed = Some(error);
            }
        } else if !entry.finished {
            entry.finished = true;
            state.outstanding -= 1;
            while state.entries.front().is_some_and(|e| e.finished) {
                state.entries.pop_front();
                state.base += 1;
                state.advanced += 1;
            }
        }
        drop(state);
        self.progress.notify_one();
    }

    /// The position a checkpoint may move to, given the last record delivered: the record
    /// before the oldest unfinished one, or `last_delivered` when every record finished.
    pub(crate) fn position(
        &self,
        last_delivered: Option<&ExtendedSequenceNumber>,
    ) -> Option<ExtendedSequenceNumber> {
        let state = self.lock();
        match state.entries.front() {
            Some(_) if mutation::on(Mutation::CheckpointPastUnfinished) => last_delivered.cloned(),
            Some(oldest) => oldest.previous.clone(),
            None => last_delivered.cloned(),
        }
    }

    /// Records delivered and not finished.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().outstanding
    }

    /// Whether any record was handed out to be acknowledged later.
    pub(crate) fn used(&self) -> bool {
        self.lock().next > 0
    }

    /// Records handed out from the oldest unfinished one on, and when that one was delivered.
    pub(crate) fn behind(&self) -> (usize, Option<Instant>) {
        let state = self.lock();
        (
            state.entries.len(),
            state.entries.front().map(|e| e.delivered),
        )
    }

    /// How many records the watermark passed since the last call.
    pub(crate) fn take_advanced(&self) -> u64 {
        std::mem::take(&mut self.lock().advanced)
    }

    /// The first failure reported by an `Ack`, if one was.
    pub(crate) fn take_failure(&self) -> Option<BoxError> {
        self.lock().failed.take()
    }

    /// Resolves after an acknowledgement arrived (at once if one arrived since the last call).
    pub(crate) async fn progressed(&self) {
        self.progress.notified().await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn at(n: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::from(u128::from(n)))
    }

    #[test]
    fn the_watermark_stops_before_the_oldest_unfinished_record() {
        let w = Arc::new(Watermark::default());
        let mut acks = w.register(Some(at(0)), (1..=4).map(at));
        let last = Some(at(4));
        assert_eq!(w.position(last.as_ref()), Some(at(0)));
        let fourth = acks.pop().unwrap();
        let third = acks.pop().unwrap();
        let second = acks.pop().unwrap();
        let first = acks.pop().unwrap();
        second.done();
        assert_eq!(w.position(last.as_ref()), Some(at(0)), "1 is unfinished");
        first.done();
        assert_eq!(w.position(last.as_ref()), Some(at(2)));
        assert_eq!(w.take_advanced(), 2);
        fourth.done();
        assert_eq!(w.position(last.as_ref()), Some(at(2)));
        assert_eq!(w.outstanding(), 1);
        third.done();
        assert_eq!(w.position(last.as_ref()), Some(at(4)));
        assert_eq!(w.outstanding(), 0);
        assert!(w.take_failure().is_none());
    }

    #[test]
    fn a_dropped_ack_is_a_failure_and_holds_the_watermark() {
        let w = Arc::new(Watermark::default());
        let mut acks = w.register(None, (1..=2).map(at));
        let second = acks.pop().unwrap();
        drop(acks);
        second.done();
        assert!(w.take_failure().is_some());
        assert_eq!(
            w.position(Some(&at(2))),
            None,
            "nothing before 1 was delivered"
        );
        assert_eq!(w.outstanding(), 1);
    }

    #[test]
    fn an_ack_outliving_its_watermark_does_nothing() {
        let w = Arc::new(Watermark::default());
        let acks = w.register(None, std::iter::once(at(1)));
        drop(w);
        drop(acks);
    }
}
