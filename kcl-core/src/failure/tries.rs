//! One failing record's tries, and what comes after a failure.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Exhausted, FailurePolicy, Reason, is_outage, is_retryable};
use crate::error::BoxError;
use crate::mutation::{self, Mutation};
use crate::types::Record;

/// What to do with a record after it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try it again after this wait.
    Retry(Duration),
    /// Its tries are spent: dead-letter or skip it, for this reason.
    GiveUp(Reason),
    /// Restart the shard ([`Exhausted::Block`]).
    Block,
}

/// The failures of one record so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tries {
    failures: u32,
    first_error: String,
    last_error: String,
    first_failed: Option<DateTime<Utc>>,
}

impl Tries {
    /// Counts a failure of `record` with `error`, and says what comes next under `policy`.
    pub(crate) fn failed(
        &mut self,
        policy: &FailurePolicy,
        record: &Record,
        error: &BoxError,
    ) -> Next {
        self.failures += 1;
        let line = crate::error_chain(&**error);
        if self.first_failed.is_none() {
            self.first_failed = Some(Utc::now());
            self.first_error.clone_from(&line);
        }
        self.last_error = line;
        // An outage is no record's fault: none is given up for it (see `Outage`).
        if policy.exhausted == Exhausted::Block || is_outage(&**error) {
            return Next::Block;
        }
        let attempts = if mutation::on(Mutation::DeadLetterEarly) {
            policy.attempts.saturating_sub(1).max(1)
        } else {
            policy.attempts
        };
        if !is_retryable(&**error) {
            Next::GiveUp(Reason::Permanent)
        } else if self.failures >= attempts {
            Next::GiveUp(Reason::Attempts)
        } else if policy
            .max_record_age
            .is_some_and(|age| Utc::now() - record.approximate_arrival > chrono_age(age))
        {
            Next::GiveUp(Reason::Age)
        } else {
            Next::Retry(policy.wait_after(self.failures))
        }
    }

    /// Failures so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    pub(crate) fn first_error(&self) -> &str {
        &self.first_error
    }

    pub(crate) fn last_error(&self) -> &str {
        &self.last_error
    }

    pub(crate) fn first_failed(&self) -> Option<DateTime<Utc>> {
        self.first_failed
    }
}

fn chrono_age(age: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(age).unwrap_or(chrono::TimeDelta::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Permanent;
    use crate::types::SequenceNumber;

    fn record() -> Record {
        Record::new(SequenceNumber::from(1u128), "k", "v")
    }

    #[test]
    fn tries_run_out_after_the_attempts() {
        let policy = FailurePolicy::dead_letter(3);
        let mut tries = Tries::default();
        let error: BoxError = "boom".into();
        assert_eq!(
            tries.failed(&policy, &record(), &error),
            Next::Retry(Duration::from_secs(1))
        );
        assert_eq!(
            tries.failed(&policy, &record(), &error),
            Next::Retry(Duration::from_secs(2))
        );
        assert_eq!(
            tries.failed(&policy, &record(), &error),
            Next::GiveUp(Reason::Attempts)
        );
        assert_eq!(tries.failures(), 3);
        assert_eq!(tries.first_error(), "boom");
    }

    #[test]
    fn an_outage_is_no_records_fault_whatever_the_policy() {
        let policy = FailurePolicy::dead_letter(1);
        let outage: BoxError = crate::failure::Outage::new("connection refused").into();
        assert_eq!(
            Tries::default().failed(&policy, &record(), &outage),
            Next::Block
        );
        let store: BoxError = Box::new(crate::CheckpointError::Store {
            shard: crate::ShardId::new("s"),
            source: crate::BackendError::new(crate::ErrorKind::Retryable, "transact", "down"),
        });
        assert_eq!(
            Tries::default().failed(&policy, &record(), &store),
            Next::Block
        );
        let own: BoxError = "the record's own".into();
        assert_eq!(
            Tries::default().failed(&policy, &record(), &own),
            Next::GiveUp(Reason::Attempts)
        );
    }

    #[test]
    fn a_permanent_failure_or_an_old_record_is_given_up_at_once() {
        let policy = FailurePolicy::skip(5).max_record_age(Duration::from_secs(60));
        let permanent: BoxError = Permanent::new("bad").into();
        assert_eq!(
            Tries::default().failed(&policy, &record(), &permanent),
            Next::GiveUp(Reason::Permanent)
        );
        let mut old = record();
        old.approximate_arrival = Utc::now() - chrono::TimeDelta::minutes(2);
        let error: BoxError = "boom".into();
        assert_eq!(
            Tries::default().failed(&policy, &old, &error),
            Next::GiveUp(Reason::Age)
        );
        assert_eq!(
            Tries::default().failed(&FailurePolicy::block(), &old, &error),
            Next::Block
        );
    }
}
