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

    /// Where the shard's letters come from and go.
    pub(crate) fn origin(&self) -> &Origin {
        &self.origin
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

    /// Whether a record whose tries are spent may be given up: not while the shard is in an
    /// outage ([`FailurePolicy::outage_after`] records given up in a row, none succeeding),
    /// when it blocks instead. Counts it otherwise.
    pub(crate) fn may_give_up(&self) -> bool {
        let Some(limit) = self.policy.outage_after else {
            return true;
        };
        if mutation::on(Mutation::OutageGivenUp) {
            return true;
        }
        let (may, began) = self.origin.tally.reserve_give_up(limit);
        if began {
            ::metrics::counter!(crate::metrics::OUTAGES, "shard" => self.shard.clone())
                .increment(1);
            tracing::error!(
                given_up_in_a_row = limit,
                "the failure policy gave up on {limit} records of this shard in a row with none \
                 succeeding between them: taken as an outage (a dependency down, a bad deploy), \
                 not as poison records. The shard gives up no more records: it blocks, \
                 restarting from its checkpoint, until a record succeeds (readiness fails \
                 meanwhile; FailurePolicy::outage_after)"
            );
        }
        may
    }

    /// Whether the shard is in an outage now (see [`may_give_up`](Self::may_give_up)): a
    /// parked key's records wait then too.
    pub(crate) fn in_outage(&self) -> bool {
        self.origin.tally.snapshot().outage
    }

    /// A record (or a part of a batch) succeeded: a run of records given up ends.
    pub(crate) fn succeeded(&self) {
        if self.origin.tally.succeeded() {
            tracing::info!(
                "a record succeeded: the outage is over, the failure policy applies again"
            );
        }
    }

    /// A record's outputs could not commit (`Parallel::with_outputs`): whether that makes
    /// more than [`FailurePolicy::outage_after`] in a row, none committing between them: an
    /// outage (every write refused: a bad deploy, a table of another shape), in which no
    /// record is given up for it. Kept across the shard's processors, as the give-ups are.
    pub(crate) fn output_refused(&self) -> bool {
        let in_row = self.origin.tally.output_refused();
        let Some(limit) = self.policy.outage_after else {
            return false;
        };
        if in_row == limit.saturating_add(1) {
            tracing::error!(
                refused_in_a_row = in_row,
                "outputs of this many records in a row could not commit, none committing \
                 between them: taken as an outage (a bad deploy, a table of another shape), not \
                 as poison records; none is given up until one commits \
                 (FailurePolicy::outage_after)"
            );
        }
        in_row > limit
    }

    /// A record's outputs committed.
    pub(crate) fn output_committed(&self) {
        self.origin.tally.output_committed();
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::types::{ShardId, WorkerId};

    fn handling(outage_after: Option<u32>) -> Handling {
        let origin = Origin {
            letters: None,
            worker: WorkerId::new("w"),
            shard: ShardId::new("shardId-1"),
            stream: None,
            row: None,
            poll: Duration::from_secs(1),
            tally: Arc::default(),
            call_timeout: Duration::from_secs(15),
        };
        let policy = FailurePolicy::skip(1).outage_after(outage_after);
        Handling::new(policy, origin)
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_gives_up_no_more_than_its_run_until_a_record_succeeds() {
        crate::mutation::set_from_env();
        let h = handling(Some(3));
        // A lone poison record among good ones never adds up.
        for _ in 0..10 {
            assert!(h.may_give_up());
            h.succeeded();
        }
        // Every record failing: three given up, then none, and the shard says so.
        let given: Vec<bool> = (0..6).map(|_| h.may_give_up()).collect();
        assert_eq!(given, [true, true, true, false, false, false]);
        assert!(h.origin.tally.snapshot().outage);
        // One record a probe interval is given up (a poison record met as it ends).
        tokio::time::advance(crate::failure::OUTAGE_PROBE).await;
        let given: Vec<bool> = (0..3).map(|_| h.may_give_up()).collect();
        assert_eq!(given, [true, false, false]);
        // A record succeeds: the outage is over.
        h.succeeded();
        assert!(!h.origin.tally.snapshot().outage);
        assert!(h.may_give_up());
        // Never, when turned off.
        let off = handling(None);
        assert!((0..100).all(|_| off.may_give_up()));
    }
}
