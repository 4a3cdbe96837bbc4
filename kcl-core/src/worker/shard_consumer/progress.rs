//! A held shard's progress, as the problem reports judge it (see `worker::problems`): how long
//! its checkpoint has stood still while records past it wait (`stalled`), how many of its
//! attempts failed in a row without progress, and how long its checkpoint writes have all
//! failed (`failing`, either way).
//!
//! The clocks run for the whole tenure, across the processor's restarts: records a failed
//! attempt was handed still wait for the next one, and a shard whose every attempt fails is
//! failing however each fails.
//!
//! - **Stall age**: records wait from the moment one is handed over that the checkpoint does
//!   not cover, until the checkpoint covers every record delivered in this tenure. While they
//!   wait, the age is the time since they began waiting or since the checkpoint last moved,
//!   whichever is later: a processor that checkpoints as it goes (a window closing, every N
//!   records, the watermark of acknowledged records) is never stalled, even if its
//!   checkpoint never catches up with the last record delivered.
//! - **Progress** is the checkpoint moving, or a batch of records processed without an error.
//!   An attempt that fails (in `initialize`, `process_records`, any hook, or a read) with no
//!   progress since the previous failure counts towards [`FAILING_AFTER`]; progress resets
//!   the count. A read that retrying cannot fix does not count (it is `read_failing`).
//! - **Failed writes**: a batch processed without an error is progress only if the
//!   checkpoint can follow it. A processor whose every checkpoint write fails (the output
//!   table deleted, a permission missing, every commit refused) and that goes on regardless
//!   processes batch after batch while its position never moves durably. So the checkpoint
//!   writes are counted too (see `checkpoint::writes` for which errors are failures): once
//!   [`FAILING_AFTER`] of them failed in a row, none applying between them, and the first
//!   failed [`WRITES_FAILING_FOR`] ago or more, the shard is failing, with the first error's
//!   kind and text. A write that applies, or the checkpoint seen moving, ends it; batches
//!   processed do not.
//!
//! Why failed writes rather than "the checkpoint does not move while batches go by": a
//! processor may checkpoint rarely on purpose (every few minutes, as windows close, only at
//! shutdown). It writes nothing in between, so it has no failed write and is never failing
//! on that account, whatever its cadence; its waiting records are `stalled`'s business, after
//! `stalled_after`, which an operator can turn off for it. What tells "cannot move the
//! checkpoint" from "does not move it yet" is an attempt to move it that failed. Both bounds
//! hold: the count keeps a brief outage under a processor that commits every few
//! milliseconds from counting as failing, the time keeps the report in line with failing
//! attempts (reported 8 to 15 s after the first failure). A processor that commits every
//! `n` seconds is reported after `max(10 s, 4 n)`, at the coordinator's next look (every
//! `taker_interval`). Writes in `shutdown_requested` and `shard_ended` end the attempt and
//! are not looked at.

use std::time::Duration;

use tokio::time::Instant;

use crate::checkpoint::writes::{Failed, Writes};
use crate::mutation::{self, Mutation};
use crate::types::{Checkpoint, ExtendedSequenceNumber};

/// Attempts in a row that fail without progress before a shard is reported failing. With the
/// default backoff (0.5 s doubling, with jitter) the fifth failure comes 8 to 15 s after the
/// first, plus the time the attempts themselves took.
pub(crate) const FAILING_AFTER: u32 = 5;

/// How long checkpoint writes must all have failed (at least [`FAILING_AFTER`] of them)
/// before a shard is reported failing: about as long as failing attempts take.
pub(crate) const WRITES_FAILING_FOR: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Since when delivered records have waited for the checkpoint to cover them.
    waiting_since: Option<Instant>,
    /// The furthest record delivered in this tenure, as far as known.
    delivered: Option<ExtendedSequenceNumber>,
    /// The checkpoint as last observed.
    checkpoint: Option<Checkpoint>,
    /// When the checkpoint was last seen to move.
    moved_at: Option<Instant>,
    /// Attempts failed in a row without progress.
    failures: u32,
    /// The last of those failures, once there are [`FAILING_AFTER`].
    failing: Option<String>,
    /// Checkpoint writes failed in a row, none applying, across attempts.
    writes_failed: Option<Failed>,
    /// When the shard last progressed (for `/status`).
    progressed_at: Option<Instant>,
    /// How far behind the stream's tip the last read was, in milliseconds.
    behind_latest: Option<u64>,
}

impl Progress {
    /// A batch of records is about to be handed over: they wait, if nothing did already.
    pub(crate) fn handing_over(&mut self) {
        if mutation::on(Mutation::StallAgeFromLastDelivery) {
            self.waiting_since = Some(Instant::now());
        }
        self.waiting_since.get_or_insert_with(Instant::now);
    }

    /// The attempt's own view, after a batch: its checkpoint covers (or not) what it was
    /// handed. Ends the wait only if the checkpoint last observed covers every record of the
    /// tenure too (else the next [`observe`](Self::observe) decides).
    pub(crate) fn covered(&mut self, covered: bool) {
        if covered && self.covers(self.checkpoint.as_ref()) {
            self.waiting_since = None;
        }
    }

    /// The lease's checkpoint now, and the last record the current attempt delivered.
    pub(crate) fn observe(
        &mut self,
        checkpoint: &Checkpoint,
        delivered: Option<&ExtendedSequenceNumber>,
    ) {
        if let Some(delivered) = delivered
            && self
                .delivered
                .as_ref()
                .is_none_or(|known| delivered > known)
        {
            self.delivered = Some(delivered.clone());
        }
        match &self.checkpoint {
            Some(known) if known == checkpoint => {}
            Some(_) => {
                if !mutation::on(Mutation::StallAgeIgnoresMoves) {
                    self.moved_at = Some(Instant::now());
                }
                self.writes_failed = None;
                self.progressed();
            }
            None => {}
        }
        self.checkpoint = Some(checkpoint.clone());
        if self.covers(Some(checkpoint)) {
            self.waiting_since = None;
        } else {
            self.waiting_since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether `checkpoint` covers every record delivered in this tenure (true while nothing
    /// is known to have been delivered).
    fn covers(&self, checkpoint: Option<&Checkpoint>) -> bool {
        let Some(delivered) = &self.delivered else {
            return true;
        };
        let delivered = Checkpoint::Sequence(delivered.clone());
        checkpoint.is_some_and(|c| c.progress_cmp(&delivered).is_some_and(|o| o.is_ge()))
    }

    /// A batch of records was processed without an error.
    pub(crate) fn progressed(&mut self) {
        self.failures = 0;
        self.failing = None;
        self.progressed_at = Some(Instant::now());
    }

    /// What became of the processor's checkpoint writes since the last look.
    pub(crate) fn writes(&mut self, writes: Writes) {
        if writes.applied {
            self.writes_failed = None;
        }
        let Some(failed) = writes.failed else {
            return;
        };
        match &mut self.writes_failed {
            Some(run) => run.count = run.count.saturating_add(failed.count),
            None => {
                tracing::warn!(
                    error = %failed.first,
                    "a checkpoint write failed: the checkpoint stays where it was (the shard is \
                     reported failing if its writes keep failing)"
                );
                self.writes_failed = Some(failed);
            }
        }
    }

    /// A read was `millis` behind the stream's tip.
    pub(crate) fn behind_latest(&mut self, millis: u64) {
        self.behind_latest = Some(millis);
    }

    /// When the shard last progressed, and how far behind the tip its last read was.
    pub(crate) fn seen(&self) -> (Option<Instant>, Option<u64>) {
        (self.progressed_at, self.behind_latest)
    }

    /// An attempt failed with `error`.
    pub(crate) fn failed(&mut self, error: String) {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= FAILING_AFTER {
            self.failing = Some(error);
        }
    }

    /// How long the checkpoint has stood still while records past it wait; zero when none
    /// wait.
    pub(crate) fn stall_age(&self) -> Duration {
        let Some(since) = self.waiting_since else {
            return Duration::ZERO;
        };
        let since = self.moved_at.map_or(since, |moved| moved.max(since));
        since.elapsed()
    }

    /// Why the shard is failing, if it is: the last error of the attempts that failed in a
    /// row.
    pub(crate) fn failing(&self) -> Option<String> {
        if let Some(last) = &self.failing {
            return Some(format!(
                "{FAILING_AFTER} attempts or more in a row failed without progress; the last: \
                 {last}"
            ));
        }
        let run = self.writes_failed.as_ref()?;
        if run.count < FAILING_AFTER || run.since.elapsed() < WRITES_FAILING_FOR {
            return None;
        }
        // The same text while it lasts: a change would be logged as a new problem.
        Some(format!(
            "checkpoint writes keep failing: {FAILING_AFTER} or more in a row over \
             {WRITES_FAILING_FOR:?} or more, none applied, the checkpoint standing still while \
             batches are processed; the first: {}",
            run.first
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn at(n: u64) -> ExtendedSequenceNumber {
        let digits = format!("{n:021}");
        ExtendedSequenceNumber::new(SequenceNumber::parse(&digits).unwrap_or_else(|| {
            unreachable!("{digits} is a sequence number");
        }))
    }

    fn checkpoint(n: u64) -> Checkpoint {
        Checkpoint::Sequence(at(n))
    }

    #[tokio::test(start_paused = true)]
    async fn the_stall_age_runs_from_the_last_move_while_records_wait() {
        let step = Duration::from_secs(10);
        let mut p = Progress::default();
        p.observe(&Checkpoint::TrimHorizon, None);
        assert_eq!(p.stall_age(), Duration::ZERO, "nothing delivered");
        p.handing_over();
        p.observe(&Checkpoint::TrimHorizon, Some(&at(10)));
        tokio::time::sleep(step).await;
        assert_eq!(p.stall_age(), step);
        // The checkpoint moves, but not up to the last record: the age starts again.
        p.observe(&checkpoint(5), Some(&at(20)));
        tokio::time::sleep(step).await;
        assert_eq!(p.stall_age(), step);
        // A new attempt has delivered nothing yet: the records of the last still wait.
        p.observe(&checkpoint(5), None);
        p.covered(true);
        tokio::time::sleep(step).await;
        assert_eq!(p.stall_age(), step * 2);
        // Everything covered: nothing waits.
        p.observe(&checkpoint(20), None);
        assert_eq!(p.stall_age(), Duration::ZERO);
    }

    #[test]
    fn failures_in_a_row_without_progress_make_a_shard_failing() {
        let mut p = Progress::default();
        for _ in 1..FAILING_AFTER {
            p.failed("boom".to_owned());
        }
        assert_eq!(p.failing(), None);
        p.failed("boom".to_owned());
        assert!(
            p.failing()
                .is_some_and(|why| why.ends_with("the last: boom"))
        );
        p.progressed();
        assert_eq!(p.failing(), None);
        // A moving checkpoint is progress too.
        p.observe(&checkpoint(1), None);
        for _ in 1..FAILING_AFTER {
            p.failed("boom".to_owned());
        }
        p.observe(&checkpoint(2), None);
        p.failed("boom".to_owned());
        assert_eq!(p.failing(), None);
    }
}
