//! Giving a record up, as the policy says: to the dead-letter sink, or skipped.

use super::{DeadLetter, Exhausted, FailurePolicy, Origin, Reason, Tries};
use crate::error::BoxError;
use crate::mutation::{self, Mutation};
use crate::types::Record;

/// One shard's failure handling: its policy, and where its dead letters go.
#[derive(Debug, Clone)]
pub(crate) struct Handling {
    pub(crate) policy: FailurePolicy,
    origin: Origin,
    shard: String,
}

impl Handling {
    pub(crate) fn new(policy: FailurePolicy, origin: Origin) -> Self {
        let shard = origin.shard.to_string();
        Self {
            policy,
            origin,
            shard,
        }
    }

    /// The parked keys now.
    pub(crate) fn parked_keys(&self, n: usize) {
        self.origin.tally.parked_keys(n as u64);
    }

    /// The shard's label.
    pub(crate) fn shard(&self) -> &str {
        &self.shard
    }

    /// A try failed and the record gets another after `wait`.
    pub(crate) fn retrying(&self, record: &Record, tries: &Tries, wait: std::time::Duration) {
        ::metrics::counter!(crate::metrics::RETRIES, "shard" => self.shard.clone()).increment(1);
        self.origin.tally.retried();
        tracing::warn!(
            sequence_number = %record.position(),
            attempt = tries.failures(),
            error = tries.last_error(),
            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "a record failed; trying it again"
        );
    }

    /// A bisect split a failing batch.
    pub(crate) fn bisected(&self) {
        ::metrics::counter!(crate::metrics::BISECTS, "shard" => self.shard.clone()).increment(1);
    }

    /// The letter `record` would be dead-lettered with.
    pub(crate) fn letter(&self, record: Record, tries: &Tries, reason: Reason) -> DeadLetter {
        self.origin.letter(record, tries, reason)
    }

    /// Gives `record` up: dead-letters it (returns once the sink accepted it; the caller
    /// bounds the wait by the lease's validity) or skips it. `Err` if the policy blocks, or
    /// dead-letters with no sink.
    pub(crate) async fn give_up(&self, letter: DeadLetter) -> Result<(), BoxError> {
        let record = &letter.record;
        match self.policy.exhausted {
            Exhausted::Skip => {
                ::metrics::counter!(crate::metrics::SKIPPED, "shard" => self.shard.clone())
                    .increment(1);
                self.origin.tally.skipped();
                tracing::error!(
                    sequence_number = %record.position(),
                    partition_key = %record.partition_key,
                    attempts = letter.attempts,
                    reason = %letter.reason,
                    error = %letter.last_error,
                    "skipping a record that failed (the failure policy skips)"
                );
                Ok(())
            }
            Exhausted::DeadLetter => {
                let Some(sink) = &self.origin.letters else {
                    return Err("the failure policy dead-letters but the worker has no sink".into());
                };
                let (first, max) = (self.policy.backoff, self.policy.max_backoff);
                if mutation::on(Mutation::SinkRefusalIgnored) {
                    let _ = sink.sink.put(&letter).await;
                } else {
                    self.origin.put(sink, &letter, first, max).await;
                }
                ::metrics::counter!(crate::metrics::DEAD_LETTERED, "shard" => self.shard.clone())
                    .increment(1);
                self.origin.tally.dead_lettered();
                tracing::warn!(
                    sequence_number = %record.position(),
                    partition_key = %record.partition_key,
                    attempts = letter.attempts,
                    reason = %letter.reason,
                    error = %letter.last_error,
                    "dead-lettered a record"
                );
                Ok(())
            }
            Exhausted::Block => Err(letter.last_error.clone().into()),
        }
    }
}
