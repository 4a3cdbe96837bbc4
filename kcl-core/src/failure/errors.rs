//! The errors a processor returns to steer the failure policy.

use std::error::Error as StdError;
use std::fmt;

use crate::error::{BackendError, BoxError};
use crate::types::{ExtendedSequenceNumber, Record};

/// A failure that trying again cannot fix (a record that does not parse, a rule it breaks):
/// the record is out of attempts at once, and goes where the policy says
/// ([`Exhausted`](super::Exhausted)). Found anywhere in an error's source chain.
///
/// ```
/// use kcl_core::failure::{Permanent, is_retryable};
/// use kcl_core::BoxError;
///
/// let error: BoxError = Permanent::new("not JSON").into();
/// assert!(!is_retryable(&*error));
/// ```
#[derive(Debug)]
pub struct Permanent(BoxError);

impl Permanent {
    /// Marks `error` as one that no retry can fix.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

impl fmt::Display for Permanent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "permanent failure: {}", self.0)
    }
}

impl StdError for Permanent {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// A failure that is no record's fault: a store the processor writes to (its database, its
/// exactly-once table) is down, throttling, or refusing every record alike. No record is
/// given up for it, whatever the policy: the shard restarts and retries, as under
/// [`Exhausted::Block`](super::Exhausted::Block), and is reported until the store is back.
/// Found anywhere in an error's source chain, as are kcl's own store errors
/// ([`BackendError`]: a checkpoint or a commit of outputs that failed in the store), which
/// count as outages without it.
///
/// ```
/// use kcl_core::failure::{Outage, is_outage};
/// use kcl_core::BoxError;
///
/// let error: BoxError = Outage::new("connection refused").into();
/// assert!(is_outage(&*error));
/// ```
#[derive(Debug)]
pub struct Outage(BoxError);

impl Outage {
    /// Marks `error` as no record's fault.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outage: {}", self.0)
    }
}

impl StdError for Outage {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// Whether `error` is no record's fault: an [`Outage`], or one of kcl's store errors
/// ([`BackendError`]), in its source chain.
pub fn is_outage(error: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<Outage>() || e.is::<BackendError>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether retrying may fix `error`: false if a [`Permanent`] is in its source chain.
pub fn is_retryable(error: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<Permanent>() {
            return false;
        }
        next = e.source();
    }
    true
}

/// A batch failed at one record: every record before it was processed, this one failed, and
/// the ones after it were not processed (Lambda's `ReportBatchItemFailures`). Return it from
/// `process_records`; the worker then retries from that record (and counts the try against
/// it alone) instead of bisecting the batch. Wrap the cause in [`Permanent`] when no retry
/// can fix it.
///
/// ```
/// use kcl_core::failure::BatchFailed;
/// use kcl_core::{BoxError, Record, SequenceNumber};
///
/// fn store(record: &Record) -> Result<(), BoxError> {
///     Err("database refused".into())
/// }
///
/// let batch = vec![Record::new(SequenceNumber::from(1u128), "k", "v")];
/// let result: Result<(), BoxError> = batch.iter().try_for_each(|record| {
///     store(record).map_err(|e| BatchFailed::at(record, e).into())
/// });
/// assert!(result.is_err());
/// ```
#[derive(Debug)]
pub struct BatchFailed {
    position: ExtendedSequenceNumber,
    source: BoxError,
}

impl BatchFailed {
    /// `record` failed with `error`; the records before it in the batch were processed.
    pub fn at(record: &Record, error: impl Into<BoxError>) -> Self {
        Self {
            position: record.position(),
            source: error.into(),
        }
    }

    /// The failed record's position.
    pub fn position(&self) -> &ExtendedSequenceNumber {
        &self.position
    }
}

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "record {} failed", self.position)
    }
}

impl StdError for BatchFailed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The record a batch failed at, if the error says (a [`BatchFailed`] at the top of it).
pub(crate) fn failed_at(error: &BoxError) -> Option<&ExtendedSequenceNumber> {
    error
        .downcast_ref::<BatchFailed>()
        .map(BatchFailed::position)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    #[test]
    fn permanence_is_found_through_the_chain() {
        let record = Record::new(SequenceNumber::from(7u128), "k", "v");
        let deep: BoxError = BatchFailed::at(&record, Permanent::new("bad")).into();
        assert!(!is_retryable(&*deep));
        let flaky: BoxError = BatchFailed::at(&record, "timeout").into();
        assert!(is_retryable(&*flaky));
        assert_eq!(failed_at(&flaky), Some(&record.position()));
    }
}
