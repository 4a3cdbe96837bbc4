//! Sparse acknowledgements: which records past the checkpoint already finished, written into
//! the lease row so that whoever opens the shard next does not deliver them again. What a
//! value says, its encoding, its size and its bound: [`SparseAcks`].

use std::fmt;

use super::Watermark;
use crate::types::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

/// Records past a checkpoint that finished, as runs of positions: sparse acknowledgements,
/// written into the lease row so that whoever opens the shard next does not deliver them
/// again.
///
/// A checkpoint is one position: everything at or before it finished. Records acknowledged
/// later (and [`Parallel`](crate::Parallel)'s) finish out of order, so one slow record — a
/// stuck key — holds the checkpoint while hundreds after it finish, and a failover delivered
/// all of those again. Now every checkpoint write also carries the records past it that
/// finished ([`Lease::acked`](crate::Lease::acked), DynamoDB attribute `kclAcked`), and the
/// next holder skips them: a failover delivers again what was unfinished at the crash, and
/// what the bound below left out, nothing else.
///
/// **What a value says.** A list of runs `[first, last]` of positions (sequence and
/// sub-sequence numbers), ascending and disjoint: every record of the shard at a position
/// inside a run finished. A run is a stretch of records delivered one after another, all
/// finished, so it covers the records between its ends that no holder is ever handed (user
/// records of a KPL aggregate outside the shard's hash-key range, dropped by every holder
/// alike).
///
/// **Encoding.** URL-safe base64 without padding of bytes: first a tag, `1` after a sequence
/// checkpoint, followed by that checkpoint (its decimal digits two to a byte behind their
/// count, then its sub-sequence number), or `2`/`3`/`4` after `TRIM_HORIZON`/`LATEST`/
/// `AT_TIMESTAMP` (nothing checkpointed yet), followed by the first run's first position in
/// full. A value is read only with the checkpoint it was written with: one moved by a writer
/// that does not know the attribute (KCL Java in a mixed fleet, which leaves it on the row)
/// makes it stale, and it is ignored, never misread. Then each run: its first position as the
/// difference from the position before (the checkpoint, or the last run's end), and unless it
/// is a single record, its last position as the difference from its first. A difference is
/// two LEB128 varints: the sequence numbers' difference, then the sub-sequence number (its own
/// difference when the sequence number is the same), the first of a run's carrying one more
/// bit that says whether the run is a single record.
///
/// **Size.** Kinesis sequence numbers are 56-digit decimals (186 bits, 47 hex digits: the
/// shard, the arrival second and its index, the record's place in its second). Two records
/// of one second differ by a few dozen, two seconds apart by 2^80 and more. Measured in
/// characters of the value (the unit test `sizes_of_real_looking_sequence_numbers`): 59 for
/// the checkpoint and one record; each further single record 17.3 and each run 34.7 when
/// records arrive one a second (every difference crosses a second: the worst case), 4.0 and
/// 8.1 at 1,000 a second; 2.7 for a user record of a KPL aggregate.
///
/// **The bound.** A value is at most [`SparseAcks::MAX_ENCODED`] characters (2,048): 115
/// isolated finished records or 57 runs at one record a second, 499 or 247 at 1,000 a
/// second, however many records the runs hold. When more runs finished than fit, those
/// nearest the checkpoint are kept and the rest are left out: those records are delivered
/// again after a failover, as every record past the checkpoint was before, so at least once
/// holds whatever is left out. The cost: DynamoDB bills a write by the item's size in 1 KB
/// units (the larger of before and after), so while records wait past the checkpoint a row
/// with a full value costs 3 write units a renewal or checkpoint instead of 1. An empty set
/// is removed from the row: a shard whose records finish in order pays nothing. The worker
/// writes a changed set as often as it checkpoints the watermark
/// ([`ack_checkpoint_every`](crate::WorkerConfig::ack_checkpoint_every) records finished,
/// or [`ack_checkpoint_interval`](crate::WorkerConfig::ack_checkpoint_interval)), even when
/// the checkpoint itself stands.
///
/// **Exactly once.** Under [`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs)
/// a record counts as finished only once its outputs committed, so a record skipped as
/// finished has its outputs in the table, and skipping it keeps them once. Under
/// [`Parallel::with_outputs`](crate::Parallel::with_outputs) a record past a stuck key is
/// computed, not finished, until a commit covers it: the set stays empty there, and such
/// records are computed again after a failover (their writes still commit once). The
/// worker's rewrite of a standing checkpoint for the set's sake is a checkpoint of the
/// watermark like any other, held back with them (`Watermark::hold_back`).
///
/// **A corrupt value** (not base64, truncated, not ascending) is logged and ignored: every
/// record past the checkpoint is delivered again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseAcks {
    /// Ascending and disjoint.
    runs: Vec<Run>,
}

/// Every record at a position from `first` to `last` (both included) finished.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    first: ExtendedSequenceNumber,
    last: ExtendedSequenceNumber,
}

/// Why a `kclAcked` value was not read (it is then ignored: everything past the checkpoint
/// is delivered again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SparseAcksError {
    /// Not URL-safe base64.
    #[error("the value is not URL-safe base64")]
    NotBase64,
    /// The bytes do not make a value.
    #[error("the value is malformed: {0}")]
    Malformed(&'static str),
    /// Written with another checkpoint than the row holds now (moved by a writer that does
    /// not know the attribute).
    #[error("the value was written with checkpoint {written}, the row holds {row}")]
    Stale {
        /// The checkpoint the value was written with.
        written: String,
        /// The checkpoint of the row.
        row: String,
    },
}

const TAG_SEQUENCE: u8 = 1;
const TAG_TRIM_HORIZON: u8 = 2;
const TAG_LATEST: u8 = 3;
const TAG_AT_TIMESTAMP: u8 = 4;
/// Kinesis sequence numbers have at most 129 digits.
const MAX_DIGITS: usize = 129;

impl SparseAcks {
    /// The longest value written, in characters: runs past it are left out (delivered again
    /// after a failover).
    pub const MAX_ENCODED: usize = 2048;

    /// Whether no record is in the set.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The runs, ascending: every record from the first position to the last (both
    /// included) finished.
    pub fn runs(
        &self,
    ) -> impl ExactSizeIterator<Item = (&ExtendedSequenceNumber, &ExtendedSequenceNumber)> {
        self.runs.iter().map(|r| (&r.first, &r.last))
    }

    /// Whether the record at `position` finished.
    pub fn contains(&self, position: &ExtendedSequenceNumber) -> bool {
        let after = self.runs.partition_point(|r| r.first <= *position);
        after > 0 && self.runs[after - 1].last >= *position
    }

    /// The last position of the last run.
    pub fn highest(&self) -> Option<&ExtendedSequenceNumber> {
        self.runs.last().map(|r| &r.last)
    }

    /// The set of `runs` (`(first, last)`, in any order, overlapping or not).
    pub(crate) fn from_runs(
        runs: impl IntoIterator<Item = (ExtendedSequenceNumber, ExtendedSequenceNumber)>,
    ) -> Self {
        let mut runs: Vec<Run> = runs
            .into_iter()
            .filter(|(first, last)| first <= last)
            .map(|(first, last)| Run { first, last })
            .collect();
        runs.sort_by(|a, b| a.first.cmp(&b.first));
        let mut merged: Vec<Run> = Vec::with_capacity(runs.len());
        for run in runs {
            match merged.last_mut() {
                // Overlapping: one run. Runs that only touch stay two (what lies between
                // their ends is unknown).
                Some(previous) if run.first <= previous.last => {
                    if run.last > previous.last {
                        previous.last = run.last;
                    }
                }
                _ => merged.push(run),
            }
        }
        Self { runs: merged }
    }

    /// Both sets in one.
    pub(crate) fn union(self, other: &Self) -> Self {
        let all = self.runs.into_iter().chain(other.runs.iter().cloned());
        Self::from_runs(all.map(|r| (r.first, r.last)))
    }

    /// The records past `checkpoint` only: those at or before it are covered by it (none at
    /// `SHARD_END`).
    pub(crate) fn past(mut self, checkpoint: &Checkpoint) -> Self {
        match checkpoint {
            Checkpoint::ShardEnd => self.runs.clear(),
            Checkpoint::Sequence(at) => {
                self.runs.retain(|r| r.last > *at);
                if let Some(first) = self.runs.first_mut()
                    && first.first < *at
                {
                    // The checkpoint's own record finished too.
                    first.first = at.clone();
                }
            }
            Checkpoint::TrimHorizon | Checkpoint::Latest | Checkpoint::AtTimestamp => {}
        }
        self
    }

    /// The value to write with `checkpoint` (at most [`MAX_ENCODED`](Self::MAX_ENCODED)
    /// characters, the runs nearest the checkpoint first); `None` when there is nothing to
    /// write (the attribute is then removed).
    pub fn encode(&self, checkpoint: &Checkpoint) -> Option<String> {
        self.encode_within(checkpoint, Self::MAX_ENCODED).0
    }

    /// As [`encode`](Self::encode), at most `max_chars` characters; also how many runs it
    /// holds (those after them are left out).
    pub(crate) fn encode_within(
        &self,
        checkpoint: &Checkpoint,
        max_chars: usize,
    ) -> (Option<String>, usize) {
        let set = self.clone().past(checkpoint);
        let Some(first) = set.runs.first() else {
            return (None, 0);
        };
        let mut out = Vec::new();
        let mut reference = match checkpoint {
            Checkpoint::ShardEnd => return (None, 0),
            Checkpoint::Sequence(base) => {
                out.push(TAG_SEQUENCE);
                base.clone()
            }
            Checkpoint::TrimHorizon => {
                out.push(TAG_TRIM_HORIZON);
                first.first.clone()
            }
            Checkpoint::Latest => {
                out.push(TAG_LATEST);
                first.first.clone()
            }
            Checkpoint::AtTimestamp => {
                out.push(TAG_AT_TIMESTAMP);
                first.first.clone()
            }
        };
        if !put_digits(&mut out, &reference.sequence) {
            return (None, 0);
        }
        put_varint(&mut out, reference.sub_sequence.into());
        // Base64 without padding: 4 characters for every 3 bytes, and a part of 4 for the rest.
        let max_bytes = max_chars / 4 * 3 + (max_chars % 4).saturating_sub(1);
        let mut kept = 0;
        for run in &set.runs {
            let mut piece = Vec::new();
            // A difference too large for 128 bits: nothing real; what follows is left out.
            if !put_run(&mut piece, &reference, run) || out.len() + piece.len() > max_bytes {
                break;
            }
            out.extend(piece);
            reference = run.last.clone();
            kept += 1;
        }
        if kept == 0 {
            return (None, 0);
        }
        (Some(base64::encode(&out)), kept)
    }

    /// Reads a value written with `checkpoint`; see the [type docs](Self).
    pub fn decode(value: &str, checkpoint: &Checkpoint) -> Result<Self, SparseAcksError> {
        let bytes = base64::decode(value).ok_or(SparseAcksError::NotBase64)?;
        let mut reader = Reader { bytes, at: 0 };
        let tag = reader.byte()?;
        if !(TAG_SEQUENCE..=TAG_AT_TIMESTAMP).contains(&tag) {
            return Err(SparseAcksError::Malformed("unknown tag"));
        }
        let written = ExtendedSequenceNumber {
            sequence: reader.digits()?,
            sub_sequence: reader.varint_u64()?,
        };
        let matches = match (tag, checkpoint) {
            (TAG_SEQUENCE, Checkpoint::Sequence(at)) => *at == written,
            (TAG_TRIM_HORIZON, Checkpoint::TrimHorizon)
            | (TAG_LATEST, Checkpoint::Latest)
            | (TAG_AT_TIMESTAMP, Checkpoint::AtTimestamp) => true,
            _ => false,
        };
        if !matches {
            let written = match tag {
                TAG_SEQUENCE => Checkpoint::Sequence(written).to_string(),
                TAG_TRIM_HORIZON => Checkpoint::TrimHorizon.to_string(),
                TAG_LATEST => Checkpoint::Latest.to_string(),
                _ => Checkpoint::AtTimestamp.to_string(),
            };
            return Err(SparseAcksError::Stale {
                written,
                row: checkpoint.to_string(),
            });
        }
        let mut runs = Vec::new();
        let mut reference = written;
        while !reader.done() {
            let run = reader.run(&reference, runs.is_empty())?;
            reference = run.last.clone();
            runs.push(run);
        }
        if runs.is_empty() {
            return Err(SparseAcksError::Malformed("no run"));
        }
        Ok(Self { runs })
    }
}

impl fmt::Display for SparseAcks {
    /// The runs, `first..=last` (or one position), comma-separated: for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, run) in self.runs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if run.first == run.last {
                write!(f, "{}", run.first)?;
            } else {
                write!(f, "{}..={}", run.first, run.last)?;
            }
        }
        Ok(())
    }
}

/// Sparse acknowledgements: what finished past the watermark, for the lease row, and what
/// the row said had finished when the shard was opened.
impl Watermark {
    /// The lease row said `acks` finished past its checkpoint: they are not delivered again
    /// ([`finished_before`](Self::finished_before)), and every checkpoint writes them on
    /// until it passes them.
    pub(crate) fn inherit(&self, acks: SparseAcks) {
        self.lock().inherited = acks;
    }

    /// Whether the record at `position` finished under an earlier holder (or processor) of
    /// the shard: skipped, never delivered again.
    pub(crate) fn finished_before(&self, position: &ExtendedSequenceNumber) -> bool {
        let state = self.lock();
        state
            .inherited
            .highest()
            .is_some_and(|highest| position <= highest)
            && state.inherited.contains(position)
    }

    /// `n` records after the newest delivered one were skipped as finished before: held
    /// behind the watermark until it passes them (see [`held`](Self::held)).
    pub(crate) fn skipped(&self, n: u64) {
        self.lock().skipped_trailing += n;
    }

    /// Records finished, ever, past the watermark or not: what a checkpoint of the sparse
    /// acknowledgements has to catch up with.
    pub(crate) fn finished_ever(&self) -> u64 {
        self.lock().finished_ever
    }

    /// Whether checkpoints of the watermark are held back ([`hold_back`](Self::hold_back)):
    /// the row's checkpoint may be further than this tenure knows, so it is not written again
    /// for the sake of the records finished past it either.
    pub(crate) fn held_back(&self) -> bool {
        self.lock().held_back
    }

    /// The records past `checkpoint` that finished: runs of finished records delivered one
    /// after another (a run takes in the skipped record right before it), and those the row
    /// said had finished, not yet passed.
    pub(crate) fn sparse(&self, checkpoint: &Checkpoint) -> SparseAcks {
        let state = self.lock();
        let mut runs = Vec::new();
        let mut run: Option<(ExtendedSequenceNumber, ExtendedSequenceNumber)> = None;
        for entry in &state.entries {
            if !entry.finished {
                runs.extend(run.take());
                continue;
            }
            match &mut run {
                Some((_, last)) => last.clone_from(&entry.position),
                None => {
                    let first = match &entry.previous {
                        Some(p) if state.inherited.contains(p) => p.clone(),
                        _ => entry.position.clone(),
                    };
                    run = Some((first, entry.position.clone()));
                }
            }
        }
        runs.extend(run);
        SparseAcks::from_runs(runs)
            .union(&state.inherited)
            .past(checkpoint)
    }
}

/// Writes `run` after `reference`; false if a difference does not fit in 128 bits.
fn put_run(out: &mut Vec<u8>, reference: &ExtendedSequenceNumber, run: &Run) -> bool {
    let Some((sequence, sub)) = difference(reference, &run.first) else {
        return false;
    };
    let single = run.first == run.last;
    put_varint(out, sequence);
    put_varint(out, (u128::from(sub) << 1) | u128::from(single));
    if !single {
        let Some((sequence, sub)) = difference(&run.first, &run.last) else {
            return false;
        };
        put_varint(out, sequence);
        put_varint(out, sub.into());
    }
    true
}

/// `to` relative to `from` (not after it): the sequence numbers' difference, and the
/// sub-sequence number's when it is 0, else `to`'s own.
fn difference(from: &ExtendedSequenceNumber, to: &ExtendedSequenceNumber) -> Option<(u128, u64)> {
    let sequence = decimal::minus(&to.sequence, &from.sequence)?;
    let sub = if sequence == 0 {
        to.sub_sequence.checked_sub(from.sub_sequence)?
    } else {
        to.sub_sequence
    };
    Some((sequence, sub))
}

/// The inverse of [`difference`].
fn apply(
    from: &ExtendedSequenceNumber,
    sequence: u128,
    sub: u64,
) -> Option<ExtendedSequenceNumber> {
    let sub_sequence = if sequence == 0 {
        from.sub_sequence.checked_add(sub)?
    } else {
        sub
    };
    Some(ExtendedSequenceNumber {
        sequence: decimal::plus(&from.sequence, sequence)?,
        sub_sequence,
    })
}

fn put_varint(out: &mut Vec<u8>, mut n: u128) {
    loop {
        let low = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

/// A sequence number in full: its digit count, then two digits a byte (the last byte's low
/// half `0xf` when the count is odd). False if it is longer than Kinesis writes.
fn put_digits(out: &mut Vec<u8>, sequence: &SequenceNumber) -> bool {
    let digits = sequence.as_str().as_bytes();
    if digits.len() > MAX_DIGITS {
        return false;
    }
    put_varint(out, digits.len() as u128);
    for pair in digits.chunks(2) {
        let high = pair[0] - b'0';
        let low = pair.get(1).map_or(0xf, |d| d - b'0');
        out.push((high << 4) | low);
    }
    true
}

struct Reader {
    bytes: Vec<u8>,
    at: usize,
}

impl Reader {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn byte(&mut self) -> Result<u8, SparseAcksError> {
        let byte = *self
            .bytes
            .get(self.at)
            .ok_or(SparseAcksError::Malformed("truncated"))?;
        self.at += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u128, SparseAcksError> {
        let mut n = 0u128;
        for shift in (0..128).step_by(7) {
            let byte = self.byte()?;
            let part = u128::from(byte & 0x7f);
            if shift > 0 && part >> (128 - shift) != 0 {
                return Err(SparseAcksError::Malformed("a number past 128 bits"));
            }
            n |= part << shift;
            if byte & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(SparseAcksError::Malformed("a number past 128 bits"))
    }

    fn varint_u64(&mut self) -> Result<u64, SparseAcksError> {
        u64::try_from(self.varint()?)
            .map_err(|_| SparseAcksError::Malformed("a sub-sequence number past 64 bits"))
    }

    fn digits(&mut self) -> Result<SequenceNumber, SparseAcksError> {
        let count = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
        if count == 0 || count > MAX_DIGITS {
            return Err(SparseAcksError::Malformed("a sequence number's length"));
        }
        let mut digits = String::with_capacity(count);
        while digits.len() < count {
            let byte = self.byte()?;
            for half in [byte >> 4, byte & 0xf] {
                if digits.len() == count {
                    if half != 0xf {
                        return Err(SparseAcksError::Malformed("a sequence number's padding"));
                    }
                } else if half > 9 {
                    return Err(SparseAcksError::Malformed("a sequence number's digit"));
                } else {
                    digits.push(char::from(b'0' + half));
                }
            }
        }
        SequenceNumber::parse(digits).ok_or(SparseAcksError::Malformed("a sequence number"))
    }

    /// A run after `reference`: strictly after it, unless it is the first run (which may
    /// start at the checkpoint's own record).
    fn run(
        &mut self,
        reference: &ExtendedSequenceNumber,
        first_run: bool,
    ) -> Result<Run, SparseAcksError> {
        let malformed = SparseAcksError::Malformed;
        let sequence = self.varint()?;
        let flagged = self.varint()?;
        let sub = u64::try_from(flagged >> 1).map_err(|_| malformed("a sub-sequence number"))?;
        let first = apply(reference, sequence, sub).ok_or(malformed("a position"))?;
        if !first_run && first <= *reference {
            return Err(malformed("runs not ascending"));
        }
        if flagged & 1 == 1 {
            return Ok(Run {
                last: first.clone(),
                first,
            });
        }
        let sequence = self.varint()?;
        let sub = self.varint_u64()?;
        let last = apply(&first, sequence, sub).ok_or(malformed("a position"))?;
        if last <= first {
            return Err(malformed("a run that ends where it starts"));
        }
        Ok(Run { first, last })
    }
}

mod base64;
mod decimal;

#[cfg(test)]
mod tests;
