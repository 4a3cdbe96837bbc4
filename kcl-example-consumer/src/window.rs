//! One window's counts: what the processor emits and what the exactly-once table stores; and
//! [`Windows`], the counting state of one shard.
//!
//! Why a call can be undone: under a failure policy other than `block`, the records of a
//! failed `process_records` call go back to the *same* processor (the whole batch again, or
//! part by part while the worker bisects it), where `block` restarts the shard with a new
//! one. What the failed call counted must then be taken out again, and the window it closed
//! put back open, or the retried records count twice and the closed window's earlier records
//! never reach the table. [`Windows::begin`] marks the start of a call,
//! [`Windows::rollback`] puts the window the call found open back as it was (subtracting the
//! call's records, so that a call costs no copy of a window's keys), and [`Windows::settle`]
//! keeps what the call did.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use kcl_core::{ExtendedSequenceNumber, Record, ShardId};
use serde::Serialize;

/// One window's counts for one shard: the line the processor emits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowSummary {
    /// The shard counted.
    pub shard: String,
    /// First instant of the window (inclusive).
    pub window_start: DateTime<Utc>,
    /// End of the window (exclusive).
    pub window_end: DateTime<Utc>,
    /// False when emitted early (shutdown or handoff): the rest of the window follows in a
    /// line from the next owner.
    pub complete: bool,
    /// Records counted.
    pub records: u64,
    /// Payload bytes counted.
    pub bytes: u64,
    /// Distinct partition keys seen.
    pub distinct_keys: usize,
    /// The busiest partition keys, most records first.
    pub top_keys: Vec<KeyCount>,
}

/// Counts for one partition key in one window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyCount {
    /// The partition key.
    pub key: String,
    /// Records with this key.
    pub records: u64,
    /// Their payload bytes.
    pub bytes: u64,
}

/// How long past its end a window waits, on a quiet shard, for records that arrived before
/// its end and are not readable yet, before it closes on time.
pub const CLOSE_AFTER: Duration = Duration::from_secs(2);

/// A closed window and the position of its last record.
pub type Closed = (WindowSummary, ExtendedSequenceNumber);

/// The counting state of one shard, without any I/O.
#[derive(Debug)]
pub struct Windows {
    shard: String,
    length: TimeDelta,
    top_keys: usize,
    open: Option<OpenWindow>,
    /// The call under way, if [`begin`](Self::begin) marked one.
    call: Option<Call>,
}

#[derive(Debug)]
struct OpenWindow {
    start: DateTime<Utc>,
    records: u64,
    bytes: u64,
    keys: HashMap<String, (u64, u64)>,
    last: ExtendedSequenceNumber,
}

/// What a call did to the window it found open.
#[derive(Debug)]
struct Call {
    /// The last record counted in the window open when the call began (`None`: none was).
    found: Option<ExtendedSequenceNumber>,
    /// How many of the call's records were counted in it.
    added: usize,
    /// It, once the call closed it: kept until the call is settled.
    closed: Option<OpenWindow>,
}

impl OpenWindow {
    fn new(start: DateTime<Utc>, first: ExtendedSequenceNumber) -> Self {
        Self {
            start,
            records: 0,
            bytes: 0,
            keys: HashMap::new(),
            last: first,
        }
    }

    fn count(&mut self, record: &Record) {
        let bytes = record.data.len() as u64;
        self.records += 1;
        self.bytes += bytes;
        let key = self.keys.entry(record.partition_key.clone()).or_default();
        key.0 += 1;
        key.1 += bytes;
        self.last = record.position();
    }

    fn uncount(&mut self, record: &Record) {
        let bytes = record.data.len() as u64;
        self.records = self.records.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
        if let Some(key) = self.keys.get_mut(&record.partition_key) {
            key.0 = key.0.saturating_sub(1);
            key.1 = key.1.saturating_sub(bytes);
            if key.0 == 0 {
                self.keys.remove(&record.partition_key);
            }
        }
    }
}

impl Windows {
    /// Windows of `length` (at least 1 ms) for `shard`, listing up to `top_keys` keys each.
    pub fn new(shard: &ShardId, length: Duration, top_keys: usize) -> Self {
        let length = TimeDelta::from_std(length)
            .unwrap_or(TimeDelta::MAX)
            .max(TimeDelta::milliseconds(1));
        Self {
            shard: shard.to_string(),
            length,
            top_keys,
            open: None,
            call: None,
        }
    }

    /// The start of the window `at` falls in.
    pub fn window_of(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let len = self.length.num_milliseconds().max(1);
        let ms = at.timestamp_millis();
        DateTime::from_timestamp_millis(ms - ms.rem_euclid(len)).unwrap_or(at)
    }

    /// Counts `record`. If it belongs to a later window than the open one, the open window
    /// is closed first and returned with its last record's position.
    pub fn add(&mut self, record: &Record) -> Option<Closed> {
        let start = self.window_of(record.approximate_arrival);
        // Arrival times can step back slightly within a shard: such records count in the
        // open window rather than reopening an emitted one.
        let closed = match &self.open {
            Some(open) if start > open.start => self.close(true),
            _ => None,
        };
        let open = self
            .open
            .get_or_insert_with(|| OpenWindow::new(start, record.position()));
        open.count(record);
        if let Some(call) = &mut self.call
            && call.found.is_some()
            && call.closed.is_none()
        {
            // Still the window the call found open.
            call.added += 1;
        }
        closed
    }

    /// Closes the open window if `now` is [`CLOSE_AFTER`] past its end (call it only when the
    /// shard is read to its tip).
    pub fn close_due(&mut self, now: DateTime<Utc>) -> Option<Closed> {
        let open = self.open.as_ref()?;
        let due = open.start + self.length + TimeDelta::from_std(CLOSE_AFTER).unwrap_or_default();
        if now < due {
            return None;
        }
        self.close(true)
    }

    /// Closes the open window, if any.
    pub fn close(&mut self, complete: bool) -> Option<Closed> {
        let open = self.open.take()?;
        let closed = (self.summary(&open, complete), open.last.clone());
        if let Some(call) = &mut self.call
            && call.found.is_some()
            && call.closed.is_none()
        {
            // The first window a call closes is the one it found open.
            call.closed = Some(open);
        }
        Some(closed)
    }

    fn summary(&self, open: &OpenWindow, complete: bool) -> WindowSummary {
        let mut keys: Vec<(&String, &(u64, u64))> = open.keys.iter().collect();
        let distinct_keys = keys.len();
        keys.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(b.0)));
        let top_keys = keys
            .into_iter()
            .take(self.top_keys)
            .map(|(key, (records, bytes))| KeyCount {
                key: key.clone(),
                records: *records,
                bytes: *bytes,
            })
            .collect();
        WindowSummary {
            shard: self.shard.clone(),
            window_start: open.start,
            window_end: open.start + self.length,
            complete,
            records: open.records,
            bytes: open.bytes,
            distinct_keys,
            top_keys,
        }
    }

    /// Forgets the open window (the lease was lost: the next owner recounts it).
    pub fn discard(&mut self) -> Option<u64> {
        self.call = None;
        self.open.take().map(|w| w.records)
    }

    /// Marks the start of a call: what [`rollback`](Self::rollback) goes back to.
    pub fn begin(&mut self) {
        self.call = Some(Call {
            found: self.open.as_ref().map(|o| o.last.clone()),
            added: 0,
            closed: None,
        });
    }

    /// Keeps what the call did.
    pub fn settle(&mut self) {
        self.call = None;
    }

    /// Undoes the call: `counted` are the records it counted, in the order it counted them.
    /// The window it found open is open again, without them; the windows it opened are gone.
    pub fn rollback<'a>(&mut self, counted: impl IntoIterator<Item = &'a Record>) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Some(last) = call.found else {
            self.open = None;
            return;
        };
        let Some(mut window) = call.closed.or_else(|| self.open.take()) else {
            return;
        };
        for record in counted.into_iter().take(call.added) {
            window.uncount(record);
        }
        window.last = last;
        self.open = Some(window);
    }

    /// Forgets everything counted (the table holds it already: a commit that failed in the
    /// call applied after all, see `WindowCounter`), and ends the call.
    pub fn forget(&mut self) -> Option<u64> {
        self.discard()
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use std::ops::Range;

    use kcl_core::SequenceNumber;

    use super::*;

    fn record(seq: u64, key: &str, at_ms: i64) -> Record {
        let sequence = SequenceNumber::parse(seq.to_string()).unwrap_or_else(|| panic!("digits"));
        let at = DateTime::from_timestamp_millis(at_ms).unwrap_or_else(|| panic!("time"));
        Record::new(sequence, key, format!("data-{seq}")).with_approximate_arrival(at)
    }

    /// Everything `w` has closed and still holds open, as summaries.
    fn drain(w: &mut Windows, closed: &mut Vec<Closed>) -> Vec<WindowSummary> {
        closed.extend(w.close(false));
        closed.iter().map(|(s, _)| s.clone()).collect()
    }

    /// A call rolled back leaves the windows as if it never happened, whether it closed the
    /// window it found open (and opened others) or only added to it; the same records
    /// delivered again, whole or in parts, count as they would have the first time.
    #[test]
    fn a_call_rolled_back_leaves_no_trace() {
        // 1-3 in window 0, 4-6 in window 1 s, 7 in window 2 s; keys repeat.
        let records: Vec<Record> = (1..=7)
            .map(|i| {
                let at =
                    [0, 100, 200, 1_000, 1_100, 1_900, 2_000][usize::try_from(i - 1).unwrap_or(0)];
                record(i, ["a", "b"][usize::try_from(i % 2).unwrap_or(0)], at)
            })
            .collect();
        let mut straight = Windows::new(&ShardId::new("s"), Duration::from_secs(1), 5);
        let mut want = Vec::new();
        for r in &records {
            want.extend(straight.add(r));
        }
        let want = drain(&mut straight, &mut want);
        // (records before the call, the call's records, where its retry is cut in parts)
        let cases: [(usize, Range<usize>, &[usize]); 4] = [
            (2, 2..7, &[4]),
            (2, 2..3, &[]),
            (0, 0..7, &[]),
            (4, 4..6, &[5]),
        ];
        for (before, failed, cuts) in cases {
            let bounds: Vec<usize> = [failed.start]
                .into_iter()
                .chain(cuts.iter().copied())
                .chain([failed.end])
                .collect();
            let parts = bounds.windows(2).map(|b| b[0]..b[1]);
            let mut w = Windows::new(&ShardId::new("s"), Duration::from_secs(1), 5);
            let mut got = Vec::new();
            for r in &records[..before] {
                got.extend(w.add(r));
            }
            w.begin();
            for r in &records[failed.clone()] {
                let _ = w.add(r);
            }
            w.rollback(&records[failed.clone()]);
            for part in parts {
                w.begin();
                for r in &records[part] {
                    got.extend(w.add(r));
                }
                w.settle();
            }
            for r in &records[failed.end..] {
                got.extend(w.add(r));
            }
            assert_eq!(drain(&mut w, &mut got), want, "{before} {failed:?}");
        }
    }
}
