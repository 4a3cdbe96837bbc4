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
//! record has finished. A batch takes its place in it when it is *delivered*, not when the
//! processor gets around to it, and the batch cannot leave its hook (its
//! [`ProcessRecordsInput`](crate::ProcessRecordsInput) lives no longer than the call): records
//! finish elsewhere only through `Ack`s, so however a processor holds them (acknowledged
//! late, out of order, from other tasks, in a later hook) nothing passes them. The rules:
//! - a batch is finished when its input is dropped without `acknowledge_later` (the usual
//!   processor: it handled the records in the hook), or record by record as their `Ack`s are
//!   done. An input dropped while its task panics fails instead, as a dropped `Ack` does; an
//!   input or `Ack` passed to `std::mem::forget` never finishes (the shard stops there);
//! - every checkpoint stops at the watermark: [`Checkpointer::checkpoint`](crate::Checkpointer::checkpoint)
//!   writes it instead of the last delivered record, and a position past it is refused with
//!   [`CheckpointError::Unfinished`](crate::CheckpointError::Unfinished). Inside a hook, the
//!   batch that hook was given counts as finished for the hook's own checkpoints (calling
//!   `checkpoint` there says it is done), unless it was taken to acknowledge later;
//! - once a processor has called `acknowledge_later`, the worker checkpoints the watermark
//!   itself as records finish (after
//!   [`ack_checkpoint_every`](crate::WorkerConfig::ack_checkpoint_every) records or
//!   [`ack_checkpoint_interval`](crate::WorkerConfig::ack_checkpoint_interval)), on a
//!   graceful stop or a handoff (after `shutdown_requested`, in which a processor that keeps
//!   its `Ack`s finishes them, the worker waits for what is in flight until half the
//!   [`shutdown_timeout`](crate::WorkerConfig::shutdown_timeout) or the lease's validity
//!   ends), and writes `SHARD_END` only once every record of the shard finished;
//! - reading pauses while [`max_unacknowledged`](crate::WorkerConfig::max_unacknowledged)
//!   records are held behind the watermark, finished or not: a record that never finishes
//!   holds at most that many behind it, and one batch (read before the pause), so memory (and what a crash replays) stays bounded
//!   however slow the acknowledgements are (in records: at 1 MiB a record, the default
//!   1,000 is a GiB a shard). The shard is then reported stalled once its checkpoint has not
//!   moved for [`stalled_after`](crate::WorkerConfig::stalled_after);
//! - [`Ack::fail`], or an `Ack` dropped unacknowledged (a task that panicked or was
//!   cancelled), restarts the shard from the watermark, as a failing `process_records` does:
//!   every record after it is delivered again, but those the lease row says finished (next
//!   rule);
//! - the records past the watermark that finished go into the lease row with every checkpoint
//!   (**sparse acknowledgements**, see [`SparseAcks`]; the worker writes the checkpoint again
//!   when only they changed, as often as it checkpoints the watermark), and whoever opens
//!   the shard next — a new holder after a failover, a new processor after a failure — skips
//!   them: what comes again is what was unfinished (and what the row's bound left out);
//! - work ends with the lease's validity: an `Ack` done once another worker may hold the
//!   lease counts for nothing (the new owner delivers the record again).

mod computed;
mod sparse;

pub use self::sparse::{SparseAcks, SparseAcksError};

use std::collections::VecDeque;
use std::ops::Range;
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
    /// The record is finished: the watermark may move past it (unless the lease's validity
    /// ran out meanwhile: then the next owner delivers it again).
    pub fn done(mut self) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade()
            && watermark.valid()
        {
            watermark.finish(self.index..self.index + 1, None);
            if let Some(tally) = watermark.successes.get() {
                tally.succeeded();
            }
        }
    }

    /// The record is finished, given up on (dead-lettered or skipped): as
    /// [`done`](Self::done), but it is no success.
    pub(crate) fn given_up(mut self) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade()
            && watermark.valid()
        {
            watermark.finish(self.index..self.index + 1, None);
        }
    }

    /// The record is finished, and parks `entry` (see [`Lease::parked_keys`](crate::Lease)):
    /// the entry is registered before the record finishes, so every checkpoint that passes
    /// the record writes it (see [`Watermark::parking`]).
    pub(crate) fn done_parking(mut self, entry: String) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade()
            && watermark.valid()
        {
            watermark.lock().parking.push(entry);
            watermark.finish(self.index..self.index + 1, None);
        }
    }

    /// The record failed: the shard restarts from the watermark, so this record and every
    /// one after it is delivered again (counted toward the `failing` problem, as a failing
    /// hook is) — unless a checkpoint already covered it: one asked in its hook before
    /// `acknowledge_later`, which counts the hook's batch as processed.
    pub fn fail(mut self, error: impl Into<BoxError>) {
        self.settled = true;
        if let Some(watermark) = self.watermark.upgrade() {
            watermark.finish(self.index..self.index + 1, Some(error.into()));
        }
    }

    /// Whether an entry starting with `prefix` parks a key, as far as this record's watermark
    /// knows: in the lease row as last written or renewed, or waiting for the next checkpoint
    /// to write it (`None` if the row is unknown now).
    pub(crate) fn parks(&self, prefix: &str) -> Option<bool> {
        let watermark = self.watermark.upgrade()?;
        if watermark
            .lock()
            .parking
            .iter()
            .any(|e| e.starts_with(prefix))
        {
            return Some(true);
        }
        let row = watermark.tenure.as_ref()?.parked_now()?;
        Some(row.iter().any(|e| e.starts_with(prefix)))
    }

    /// Runs `work` on the record while the lease it was delivered under is valid (see
    /// [`RecordProcessor`](crate::RecordProcessor)'s fencing in time): `None` once another
    /// worker may hold it, and `work` is dropped.
    pub(crate) async fn while_valid<F: Future>(&self, work: F) -> Option<F::Output> {
        let tenure = self.watermark.upgrade().and_then(|w| w.tenure.clone());
        match tenure {
            Some(tenure) => tenure.while_valid(work).await,
            None => Some(work.await),
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if !self.settled
            && let Some(watermark) = self.watermark.upgrade()
        {
            watermark.finish(
                self.index..self.index + 1,
                Some("a record's Ack was dropped unacknowledged (its task panicked or was cancelled)".into()),
            );
        }
    }
}

/// A delivered batch's place in the watermark, held by its
/// [`ProcessRecordsInput`](crate::ProcessRecordsInput): the batch's records are finished when
/// it is dropped, unless it became `Ack`s first. Not `Clone`: one batch, one place.
#[derive(Debug)]
pub(crate) struct Reservation {
    watermark: Weak<Watermark>,
    first: u64,
    count: u64,
    /// Whether dropping it finishes its records: true for a batch handed to a hook; false
    /// for a batch the failure policy walks (it finishes records one part at a time).
    finish_on_drop: bool,
}

impl Reservation {
    /// One `Ack` per record of the batch, in order; the watermark's owner now checkpoints
    /// as they finish.
    pub(crate) fn into_acks(self) -> Vec<Ack> {
        let this = std::mem::ManuallyDrop::new(self);
        let watermark = this.watermark.clone();
        if let Some(w) = watermark.upgrade() {
            let mut state = w.lock();
            state.acknowledged_later = true;
            // Taken to acknowledge later: no longer finished by its hook's checkpoints.
            state.in_hook.take_if(|first| *first == this.first);
        }
        (this.first..this.first + this.count)
            .map(|index| Ack {
                watermark: watermark.clone(),
                index,
                settled: false,
            })
            .collect()
    }

    /// This batch, walked by the failure policy: dropping it finishes nothing.
    pub(crate) fn walked(mut self) -> Self {
        self.finish_on_drop = false;
        self
    }

    /// The records `range` (indices into the batch) as a batch of their own, for a hook: the
    /// batch in its hook from now on; dropping it finishes nothing (the walk decides).
    pub(crate) fn part(&self, range: Range<usize>) -> Self {
        let first = self.first + range.start as u64;
        if let Some(w) = self.watermark.upgrade() {
            w.lock().in_hook = Some(first);
        }
        Self {
            watermark: self.watermark.clone(),
            first,
            count: range.len() as u64,
            finish_on_drop: false,
        }
    }

    /// Gives up the records from index `start` of the batch on, unfinished: the newest
    /// delivered (nothing was delivered after a walked batch), so they leave the watermark as
    /// if never delivered. Returns the position before them, where delivery now ends.
    pub(crate) fn abandon_from(&self, start: usize) -> Option<Option<ExtendedSequenceNumber>> {
        let w = self.watermark.upgrade()?;
        let mut state = w.lock();
        let from = self.first + start as u64;
        let offset = usize::try_from(from.checked_sub(state.base)?).ok()?;
        let previous = state.entries.get(offset)?.previous.clone();
        let unfinished = state
            .entries
            .drain(offset..)
            .filter(|e| !e.finished)
            .count();
        state.outstanding -= unfinished;
        drop(state);
        w.progress.notify_one();
        Some(previous)
    }

    /// Finishes the records `range` (indices into the batch).
    pub(crate) fn finish(&self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        if let Some(w) = self.watermark.upgrade() {
            w.finish(
                self.first + range.start as u64..self.first + range.end as u64,
                None,
            );
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.finish_on_drop {
            return;
        }
        let Some(watermark) = self.watermark.upgrade() else {
            return;
        };
        let failure = std::thread::panicking()
            .then(|| BoxError::from("a batch was dropped by a panicking task"));
        watermark.finish(self.first..self.first + self.count, failure);
    }
}

/// One processor instance's watermark; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    state: Mutex<State>,
    progress: Notify,
    /// The tenure the records were delivered under: work on them ends with its validity.
    tenure: Option<Arc<Tenure>>,
    /// Told when a record succeeds (an `Ack` done, not given up): a failure policy's run of
    /// records given up ends ([`FailurePolicy::outage_after`](crate::failure::FailurePolicy)).
    successes: std::sync::OnceLock<Arc<crate::failure::Tally>>,
}

#[derive(Debug, Default)]
struct State {
    /// Every record delivered from the oldest unfinished one on, in delivery order.
    entries: VecDeque<Entry>,
    /// The index of `entries[0]`.
    base: u64,
    /// The index the next delivered record gets.
    next: u64,
    /// The first index of the batch whose hook runs now, while it is not taken to acknowledge
    /// later.
    in_hook: Option<u64>,
    /// Records not finished.
    outstanding: usize,
    /// Records the watermark passed, ever.
    passed: u64,
    /// The first failure, until the shard task takes it.
    failed: Option<BoxError>,
    /// Whether the processor took any batch to acknowledge later.
    acknowledged_later: bool,
    /// Parked-key entries not yet written with a checkpoint ([`Ack::done_parking`]).
    parking: Vec<String>,
    /// No checkpoint of the watermark while set ([`Watermark::hold_back`]).
    held_back: bool,
    /// Records finished, ever, past the watermark or not.
    finished_ever: u64,
    /// What the lease row said finished past its checkpoint when the shard was opened
    /// ([`sparse`](self::sparse)): not delivered again.
    inherited: SparseAcks,
    /// Records skipped as finished before since the newest entry ([`Watermark::skipped`]).
    skipped_trailing: u64,
}

impl State {
    /// Records held behind the watermark: from the oldest unfinished on, delivered or
    /// skipped as finished before (those before it are behind the watermark's position).
    fn held(&self) -> usize {
        if self.entries.is_empty() {
            return 0;
        }
        let skipped: u64 = self.entries.iter().skip(1).map(|e| e.skipped).sum();
        let skipped = skipped + self.skipped_trailing;
        self.entries.len() + usize::try_from(skipped).unwrap_or(usize::MAX)
    }
}

#[derive(Debug)]
struct Entry {
    /// The record delivered just before this one, if any: the watermark while this one waits.
    /// With records skipped as finished before ([`Watermark::finished_before`]), the last of
    /// them before this one.
    previous: Option<ExtendedSequenceNumber>,
    /// This record's own position.
    position: ExtendedSequenceNumber,
    /// Records skipped as finished before between the entry before this one and this one:
    /// held behind the watermark as much as delivered ones ([`Watermark::held`]).
    skipped: u64,
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

    /// Tells `tally` of every record that succeeds from now on.
    pub(crate) fn count_successes(&self, tally: Arc<crate::failure::Tally>) {
        let _ = self.successes.set(tally);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether work on the records may still count: the lease they came under is valid.
    /// Once it is not, the tenure ends here as it does for a hook (marked lost), so that the
    /// shard stops and is taken again rather than wait for a record whose `Ack` counted for
    /// nothing.
    fn valid(&self) -> bool {
        if mutation::on(Mutation::HooksOutliveLease) || mutation::on(Mutation::SkipValidityCheck) {
            return true;
        }
        match &self.tenure {
            Some(tenure) if !tenure.is_valid() => {
                tenure.mark_lost();
                false
            }
            _ => true,
        }
    }

    /// Reserves the places of a batch being delivered, in order, the first after `previous`.
    /// Until [`hook_returned`](Self::hook_returned), it is the batch in its hook.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        previous: Option<ExtendedSequenceNumber>,
        positions: impl Iterator<Item = ExtendedSequenceNumber>,
    ) -> Reservation {
        let pairs = positions.scan(previous, |previous, position| {
            Some((previous.replace(position.clone()), position, 0))
        });
        self.reserve_each(pairs)
    }

    /// As [`reserve`](Self::reserve), each position with the record before it in the shard
    /// and how many records were skipped in between as finished before (`(previous,
    /// position, skipped)`).
    pub(crate) fn reserve_each(
        self: &Arc<Self>,
        pairs: impl Iterator<Item = (Option<ExtendedSequenceNumber>, ExtendedSequenceNumber, u64)>,
    ) -> Reservation {
        let mut state = self.lock();
        let delivered = Instant::now();
        let first = state.next;
        for (previous, position, skipped) in pairs {
            if state.entries.is_empty() {
                state.base = state.next;
            }
            let skipped = skipped + std::mem::take(&mut state.skipped_trailing);
            state.entries.push_back(Entry {
                previous,
                position,
                skipped,
                finished: false,
                delivered,
            });
            state.next += 1;
            state.outstanding += 1;
        }
        state.in_hook = Some(first);
        Reservation {
            watermark: Arc::downgrade(self),
            first,
            count: state.next - first,
            finish_on_drop: true,
        }
    }

    /// The hook of the last reserved batch returned. Returns whether the batch was still
    /// its own (not taken to acknowledge later).
    pub(crate) fn hook_returned(&self) -> bool {
        self.lock().in_hook.take().is_some()
    }

    /// Finishes (or, with a `failure`, fails) the records `indices`, under one lock: a whole
    /// batch dropped in its hook costs one call, not one per record.
    fn finish(&self, indices: Range<u64>, failure: Option<BoxError>) {
        let mut state = self.lock();
        if let Some(error) = failure {
            // The records stay unfinished: the watermark never passes them.
            if state.failed.is_none() {
                state.failed = Some(error);
            }
        } else {
            for index in indices {
                let offset = index
                    .checked_sub(state.base)
                    .and_then(|o| usize::try_from(o).ok());
                let Some(entry) = offset.and_then(|o| state.entries.get_mut(o)) else {
                    continue;
                };
                if !entry.finished {
                    entry.finished = true;
                    state.outstanding -= 1;
                    state.finished_ever += 1;
                }
            }
            while state.entries.front().is_some_and(|e| e.finished) {
                state.entries.pop_front();
                state.base += 1;
                state.passed += 1;
            }
        }
        drop(state);
        self.progress.notify_one();
    }

    /// The position the worker's own checkpoints may move to, given the last record
    /// delivered: the record before the oldest unfinished one, or `last_delivered` when every
    /// record finished.
    pub(crate) fn position(
        &self,
        last_delivered: Option<&ExtendedSequenceNumber>,
    ) -> Option<ExtendedSequenceNumber> {
        self.position_from(last_delivered, false)
    }

    /// The position a processor's own checkpoint may move to: as [`position`](Self::position),
    /// but the batch of the hook that runs now counts as finished unless it was taken to
    /// acknowledge later (see the module docs).
    pub(crate) fn position_in_hook(
        &self,
        last_delivered: Option<&ExtendedSequenceNumber>,
    ) -> Option<ExtendedSequenceNumber> {
        self.position_from(last_delivered, true)
    }

    fn position_from(
        &self,
        last_delivered: Option<&ExtendedSequenceNumber>,
        in_hook: bool,
    ) -> Option<ExtendedSequenceNumber> {
        let state = self.lock();
        if state.held_back {
            return None;
        }
        let Some(oldest) = state.entries.front() else {
            return last_delivered.cloned();
        };
        if mutation::on(Mutation::CheckpointPastUnfinished) {
            return last_delivered.cloned();
        }
        // Entries from the hook's batch on are all that batch's (the newest).
        match state.in_hook.filter(|_| in_hook) {
            Some(first) if state.base >= first => last_delivered.cloned(),
            _ => oldest.previous.clone(),
        }
    }

    /// Parked-key entries to write with the next checkpoint. Read after the checkpoint's
    /// position: an entry is registered before its record finishes, so a position that
    /// passes the record comes with it.
    pub(crate) fn parking(&self) -> Vec<String> {
        self.lock().parking.clone()
    }

    /// `entries` were written with a checkpoint.
    pub(crate) fn parked(&self, entries: &[String]) {
        self.lock().parking.retain(|e| !entries.contains(e));
    }

    /// Records delivered and not finished.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().outstanding
    }

    /// Records held behind the watermark, finished or not: what a crash would replay.
    pub(crate) fn held(&self) -> usize {
        self.lock().held()
    }

    /// Whether the processor took any batch to acknowledge later.
    pub(crate) fn used(&self) -> bool {
        self.lock().acknowledged_later
    }

    /// Records held behind the watermark, and when the oldest unfinished one was delivered.
    pub(crate) fn behind(&self) -> (usize, Option<Instant>) {
        let state = self.lock();
        (state.held(), state.entries.front().map(|e| e.delivered))
    }

    /// How many records the watermark passed, ever: the processor's progress.
    pub(crate) fn passed(&self) -> u64 {
        self.lock().passed
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
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn at(n: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::from(u128::from(n)))
    }

    #[test]
    fn the_watermark_stops_before_the_oldest_unfinished_record() {
        let w = Arc::new(Watermark::default());
        let mut acks = w.reserve(Some(at(0)), (1..=4).map(at)).into_acks();
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
        assert_eq!(w.passed(), 2);
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
        let mut acks = w.reserve(None, (1..=2).map(at)).into_acks();
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
        let acks = w.reserve(None, std::iter::once(at(1))).into_acks();
        drop(w);
        drop(acks);
    }

    #[test]
    fn a_reserved_batch_holds_the_watermark_until_dropped() {
        let w = Arc::new(Watermark::default());
        let first = w.reserve(Some(at(0)), (1..=2).map(at));
        w.hook_returned();
        let second = w.reserve(Some(at(2)), (3..=4).map(at));
        let last = Some(at(4));
        assert_eq!(w.position(last.as_ref()), Some(at(0)));
        assert_eq!(
            w.position_in_hook(last.as_ref()),
            Some(at(0)),
            "the hook's own batch counts as finished, not an older one still held"
        );
        drop(first);
        assert_eq!(
            w.position(last.as_ref()),
            Some(at(2)),
            "the hook's batch is held"
        );
        assert_eq!(w.position_in_hook(last.as_ref()), Some(at(4)));
        let acks = second.into_acks();
        assert_eq!(
            w.position_in_hook(last.as_ref()),
            Some(at(2)),
            "taken to acknowledge later: no longer finished by the hook"
        );
        assert_eq!(w.held(), 2);
        assert!(w.used());
        for ack in acks {
            ack.done();
        }
        assert_eq!(w.position(last.as_ref()), Some(at(4)));
        assert_eq!(w.held(), 0);
    }

    #[test]
    fn a_batch_dropped_by_a_panicking_task_fails() {
        let w = Arc::new(Watermark::default());
        let reserved = w.reserve(None, (1..=2).map(at));
        let task = std::thread::spawn(move || {
            let _held = reserved;
            panic!("the task holding the batch panicked");
        });
        assert!(task.join().is_err());
        assert!(
            w.take_failure().is_some(),
            "a failure, not finished records"
        );
        assert_eq!(w.outstanding(), 2);
        assert!(!w.used(), "never taken to acknowledge later");
    }
}
