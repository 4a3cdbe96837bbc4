//! When a record fails: retries, dead letters, and what a record that can never succeed costs.
//!
//! Without a policy, a failing `process_records` (or a failing record under
//! [`Parallel`](crate::Parallel)) restarts its shard from the last checkpoint, forever: the
//! shard stops at one bad record until it ages out of the stream. That is KCL Java's behaviour
//! and stays the default ([`Exhausted::Block`]). A [`FailurePolicy`] bounds it instead:
//! - **attempts** and **backoff**: a failing record is tried again in place, `attempts` times
//!   in all, waiting `backoff`, doubling, up to `max_backoff`, between tries. Under `Parallel`
//!   only its own key waits; every other key keeps flowing;
//! - **max record age**: no more tries once the record is older than this (by its arrival time
//!   in the stream);
//! - **when they are spent** ([`Exhausted`]): keep blocking, write the record to a
//!   [`DeadLetterSink`] (it counts as finished, and the checkpoint passes it, only once the
//!   sink accepted it: a failing sink is retried and holds the checkpoint), or skip it with an
//!   ERROR log and a metric;
//! - an error wrapped in [`Permanent`] is not retried: the record is out of attempts at once.
//!
//! A batch processor says which record failed with [`BatchFailed`] (every record before it
//! counts as processed, as Lambda's `ReportBatchItemFailures`); when it returns any other error
//! the worker **bisects** the batch: delivers its first half again, then the second, splitting
//! the half that fails until one record fails alone (Lambda's `BisectBatchOnFunctionError`).
//! Splits do not count as attempts; a part that succeeded is never delivered again, nor is a
//! record the processor checkpointed. With one bad record among `n`, a bisect costs at most
//! `2 × ⌈log2 n⌉` extra deliveries of parts, and delivers each good record at most
//! `1 + ⌈log2 n⌉` times in all.
//!
//! `docs/when-a-record-fails.md` compares the policy with Lambda's and KCL Java's.

mod bisect;
mod errors;
mod give_up;
mod letter;
mod replay;
mod tally;
mod tries;

pub(crate) use bisect::{Bisect, Then};
pub(crate) use errors::failed_at;
pub use errors::{BatchFailed, Outage, Permanent, is_outage, is_retryable};
pub(crate) use give_up::Handling;
pub use letter::{DeadLetter, DeadLetterSink, DeadLetters, RETENTION_FLOOR, Reason};
pub(crate) use letter::{Origin, park_entry, parse_park_entry};
pub(crate) use replay::{AnyReader, Entry, Reader, Row, parse_entry};
pub use replay::{Kept, LetterReader, redrive_entry};
pub(crate) use tally::Tally;
pub use tally::{OUTAGE_PROBE, RecordFailures, SINK_FAILING_AFTER};
pub(crate) use tries::{Next, Tries};

use std::time::Duration;

/// What happens to a record once its attempts (or its age) are spent.
///
/// Read from text as `block`, `dead-letter` or `skip` (any case, `_` or `-`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum Exhausted {
    /// The shard restarts from its last checkpoint and tries again, for as long as it takes
    /// (KCL Java's behaviour, and the default). Attempts and age do not apply.
    #[default]
    Block,
    /// The record is written to the worker's [`DeadLetterSink`], then counts as processed.
    DeadLetter,
    /// The record is logged at ERROR, counted (`kcl_records_skipped_total`) and passed.
    Skip,
}

/// How a failing record is retried and what happens when that is spent; see the
/// [module docs](self). Set on [`WorkerConfig::failure`](crate::WorkerConfig::failure) for batch
/// processors and with [`Parallel::on_failure`](crate::Parallel::on_failure) per record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct FailurePolicy {
    /// Tries of one record in all, the first included (at least 1). Default 3: a flaky
    /// dependency gets two more chances, a poison record costs its key about `backoff × 3`.
    pub attempts: u32,
    /// The wait before the second try; doubled before each next one. Default 1 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub backoff: Duration,
    /// The longest wait between tries. Default 30 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_backoff: Duration,
    /// No more tries once a record is older than this (since it arrived in the stream).
    /// Default none (Lambda's `MaximumRecordAgeInSeconds` default is the stream's retention).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_record_age: Option<Duration>,
    /// What happens when the tries or the age are spent. Default [`Exhausted::Block`].
    pub exhausted: Exhausted,
    /// An outage is not a poison record: once a shard gave up this many records in a row,
    /// none succeeding between them, it gives up no more (a database down or a bad deploy
    /// fails every record, and would dead-letter the stream). It blocks instead, as
    /// [`Exhausted::Block`] does (restarting from its checkpoint), until a record succeeds,
    /// reports the shard `failing` (`Status::problems`; readiness fails) and says why in the
    /// log. A lone poison record among good ones resets nothing and is given up as usual.
    /// Counted per shard while this worker holds it (a new holder counts anew). Default 10;
    /// `None`: never (every record past its tries is given up, outage or not).
    pub outage_after: Option<u32>,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_record_age: None,
            exhausted: Exhausted::Block,
            outage_after: Some(10),
        }
    }
}

impl FailurePolicy {
    /// Today's behaviour: the shard restarts from its checkpoint until the record succeeds.
    pub fn block() -> Self {
        Self::default()
    }

    /// `attempts` tries (0 is taken as 1), then the record goes to the worker's dead-letter
    /// sink.
    pub fn dead_letter(attempts: u32) -> Self {
        Self {
            attempts: attempts.max(1),
            exhausted: Exhausted::DeadLetter,
            ..Self::default()
        }
    }

    /// `attempts` tries (0 is taken as 1), then the record is skipped (logged at ERROR and
    /// counted).
    pub fn skip(attempts: u32) -> Self {
        Self {
            attempts: attempts.max(1),
            exhausted: Exhausted::Skip,
            ..Self::default()
        }
    }

    /// The wait before the second try (doubled each time, up to `max`).
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// No more tries once a record is older than `age`.
    #[must_use]
    pub fn max_record_age(mut self, age: Duration) -> Self {
        self.max_record_age = Some(age);
        self
    }

    /// Gives up at most `run` records of a shard in a row, none succeeding between them,
    /// then blocks until one does (see the field); `None` gives up every record past its
    /// tries, outage or not.
    #[must_use]
    pub fn outage_after(mut self, run: Option<u32>) -> Self {
        self.outage_after = run;
        self
    }

    /// Whether a failure is handled in place (anything but [`Exhausted::Block`]).
    pub(crate) fn in_place(&self) -> bool {
        self.exhausted != Exhausted::Block
    }

    /// The wait after the `failures`-th failure of a record.
    pub(crate) fn wait_after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff.max(self.backoff))
    }

    /// Checks the policy; the error names the field (`attempts` and `outage_after` are given
    /// as the keys of the two settings checked).
    pub(crate) fn check(
        &self,
        [attempts, outage_after]: [&'static str; 2],
    ) -> Result<(), crate::ConfigError> {
        if self.attempts == 0 {
            return Err(crate::ConfigError {
                key: attempts,
                reason: "attempts must be at least 1 (the first try counts)".to_owned(),
            });
        }
        if self.outage_after == Some(0) {
            return Err(crate::ConfigError {
                key: outage_after,
                reason: "outage_after must be at least 1 (or none, to give up every record \
                         whatever the run)"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_its_cap() {
        let policy =
            FailurePolicy::dead_letter(5).backoff(Duration::from_secs(1), Duration::from_secs(5));
        let waits: Vec<_> = (1..=5).map(|n| policy.wait_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
    }

    #[test]
    fn zero_attempts_are_refused_by_name() {
        let mut policy = FailurePolicy::skip(1);
        policy.attempts = 0;
        let keys = ["failure.attempts", "failure.outage_after"];
        let error = policy.check(keys).unwrap_err().to_string();
        assert!(error.contains("failure.attempts"), "{error}");
        policy.attempts = 1;
        policy.outage_after = Some(0);
        let error = policy.check(keys).unwrap_err().to_string();
        assert!(error.contains("failure.outage_after"), "{error}");
    }
}
