//! Which part of a failing batch goes next: the batch path of the failure policy.
//!
//! The parts still to deliver are a stack of index ranges, left of the batch on top. A part
//! that succeeded is finished and never delivered again. A part that failed is cut first at
//! the processor's own checkpoint (records it checkpointed are processed), then:
//! - at the record a [`BatchFailed`](super::BatchFailed) names: the records before it are
//!   processed, and the failure is that record's try;
//! - otherwise, a part of several records is split in two halves (not a try of anyone);
//! - a part of one record: the failure is its try.
//!
//! A try that leaves the record tries to spare delivers it again, with the rest of its part,
//! after the policy's wait; one that spends them gives the record up (the caller dead-letters
//! or skips it) and goes on after it.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use super::{FailurePolicy, Next, Reason, Tries};
use crate::error::BoxError;
use crate::mutation::{self, Mutation};
use crate::types::Record;

/// What follows a failed part.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Then {
    /// The part was split in two, delivered next (left first).
    Split,
    /// The record at this index is tried again, after the wait.
    Retry(usize, Duration),
    /// The record at this index is given up on.
    GiveUp(usize, Reason),
    /// Restart the shard (the policy blocks).
    Block,
}

/// A failed part's outcome: the records it processed after all, and what follows.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Failed {
    pub(crate) processed: Range<usize>,
    pub(crate) then: Then,
}

/// The failure policy's walk through one batch; see the module docs.
#[derive(Debug)]
pub(crate) struct Bisect {
    parts: Vec<Range<usize>>,
    tries: HashMap<usize, Tries>,
}

impl Bisect {
    /// A batch of `len` records, delivered whole first.
    pub(crate) fn new(len: usize) -> Self {
        let mut parts = Vec::new();
        if len > 0 {
            parts.push(0..len);
        }
        Self {
            parts,
            tries: HashMap::new(),
        }
    }

    /// The next part to deliver, if any is left.
    pub(crate) fn next(&mut self) -> Option<Range<usize>> {
        self.parts.pop()
    }

    /// The part `part` failed with `error`, after the processor checkpointed every record
    /// before index `checkpointed` (0 if it did not); `failed_at` is the index a
    /// `BatchFailed` named, if it names one in the part.
    pub(crate) fn failed(
        &mut self,
        policy: &FailurePolicy,
        records: &[Record],
        part: Range<usize>,
        checkpointed: usize,
        failed_at: Option<usize>,
        error: &BoxError,
    ) -> Failed {
        let start = part.start.max(checkpointed).min(part.end);
        let mut processed = part.start..start;
        if start == part.end {
            return Failed {
                processed,
                then: Then::Split,
            };
        }
        let failed = match failed_at.filter(|i| (start..part.end).contains(i)) {
            Some(index) => index,
            None if part.end - start > 1 => {
                let mid = start + (part.end - start) / 2;
                if mutation::on(Mutation::BisectRedeliversSucceeded) {
                    // The bug: the whole part again, its good left half included.
                    self.parts.push(start..part.end);
                }
                self.parts.push(mid..part.end);
                self.parts.push(start..mid);
                return Failed {
                    processed,
                    then: Then::Split,
                };
            }
            None => start,
        };
        processed.end = failed;
        let Some(record) = records.get(failed) else {
            return Failed {
                processed,
                then: Then::Block,
            };
        };
        let then = match self
            .tries
            .entry(failed)
            .or_default()
            .failed(policy, record, error)
        {
            Next::Retry(wait) => {
                self.parts.push(failed..part.end);
                Then::Retry(failed, wait)
            }
            Next::GiveUp(reason) => {
                if failed + 1 < part.end {
                    self.parts.push(failed + 1..part.end);
                }
                Then::GiveUp(failed, reason)
            }
            Next::Block => Then::Block,
        };
        Failed { processed, then }
    }

    /// The tries of the record at `index` so far.
    pub(crate) fn tries(&self, index: usize) -> Tries {
        self.tries.get(&index).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    fn batch(n: u128) -> Vec<Record> {
        (0..n)
            .map(|i| Record::new(SequenceNumber::from(i), "k", "v"))
            .collect()
    }

    /// Walks a batch of `n` with one record at `poison` that always fails and reports
    /// nothing: the deliveries per record, and the parts delivered in all.
    fn walk(n: usize, poison: usize, attempts: u32) -> (Vec<u32>, usize, Vec<usize>) {
        let records = batch(n as u128);
        let policy = FailurePolicy::dead_letter(attempts);
        let mut bisect = Bisect::new(n);
        let mut delivered = vec![0u32; n];
        let (mut parts, mut given_up) = (0, Vec::new());
        let error: BoxError = "poison".into();
        while let Some(part) = bisect.next() {
            parts += 1;
            for i in part.clone() {
                delivered[i] += 1;
            }
            if part.contains(&poison) {
                let failed = bisect.failed(&policy, &records, part, 0, None, &error);
                if let Then::GiveUp(i, _) = failed.then {
                    given_up.push(i);
                }
            }
        }
        (delivered, parts, given_up)
    }

    #[test]
    fn a_bisect_isolates_the_bad_record_within_its_bound() {
        for n in [1usize, 2, 3, 7, 8, 100, 500] {
            let levels = usize::BITS - (n - 1).leading_zeros();
            for poison in [0, n / 2, n - 1] {
                let (delivered, parts, given_up) = walk(n, poison, 3);
                assert_eq!(given_up, [poison], "n={n} poison={poison}");
                // The whole batch, at most two parts a level, the poison's two more tries,
                // and at most one part of what follows it per level.
                let bound = 1 + 2 * levels as usize + 2 + levels as usize;
                assert!(
                    parts <= bound,
                    "n={n} poison={poison}: {parts} parts > {bound}"
                );
                for (i, count) in delivered.iter().enumerate() {
                    let most = if i == poison {
                        1 + levels + 2
                    } else {
                        1 + levels
                    };
                    assert!(
                        *count <= most,
                        "n={n} poison={poison} record {i}: {count} > {most}"
                    );
                    assert!(*count >= 1, "record {i} never delivered");
                }
            }
        }
    }

    #[test]
    fn a_named_record_is_retried_from_where_it_failed() {
        let records = batch(10);
        let policy = FailurePolicy::skip(2);
        let mut bisect = Bisect::new(10);
        let error: BoxError = "bad".into();
        let part = bisect.next().unwrap();
        let failed = bisect.failed(&policy, &records, part, 0, Some(4), &error);
        assert_eq!(failed.processed, 0..4);
        assert_eq!(failed.then, Then::Retry(4, Duration::from_secs(1)));
        let part = bisect.next().unwrap();
        assert_eq!(part, 4..10);
        let failed = bisect.failed(&policy, &records, part, 0, Some(4), &error);
        assert_eq!(failed.then, Then::GiveUp(4, Reason::Attempts));
        assert_eq!(bisect.next(), Some(5..10));
        assert_eq!(bisect.tries(4).failures(), 2);
    }

    #[test]
    fn records_the_processor_checkpointed_are_not_delivered_again() {
        let records = batch(8);
        let mut bisect = Bisect::new(8);
        let error: BoxError = "bad".into();
        let part = bisect.next().unwrap();
        let failed = bisect.failed(&FailurePolicy::skip(3), &records, part, 6, None, &error);
        assert_eq!(failed.processed, 0..6);
        assert_eq!(bisect.next(), Some(6..7));
        assert_eq!(bisect.next(), Some(7..8));
        assert_eq!(bisect.next(), None);
    }
}
