//! How many records a reset replays or skips, for `reset --dry-run`: counted in the stream.
//!
//! Each of the two positions (the lease's checkpoint, the reset's target) is turned into the
//! first record at or after it (one `GetRecords` of one record, following empty answers a
//! few times while the stream says there is more); the earlier of the two is where reading
//! would start, and the records from there up to the later one are counted, `GetRecords` of
//! up to 1,000 at a time, for [`MAX_CALLS`] calls at most (a "more than" beyond), one a
//! second ([`PACE`]): a shard allows 5 calls a second and 2 MB, shared with the fleet that
//! reads it, and a dry run must not throttle it. If the
//! target comes first, the reset replays them; if the checkpoint does, it skips them.
//!
//! Approximate: the stream goes on (records arrive, `LATEST` moves, the oldest records
//! expire), and the holder moves its checkpoint while the count runs. A count is of stream
//! records: a KPL aggregate counts as one, however many user records it holds.

use kcl_core::admin::ResetTo;
use kcl_core::{Checkpoint, Lease, SequenceNumber, ShardId, ShardSource, StartingPosition};

/// `GetRecords` calls a count makes at most.
const MAX_CALLS: usize = 20;
/// Records asked for by each.
const BATCH: u32 = 1_000;
/// The least time between two calls on a shard.
const PACE: std::time::Duration = std::time::Duration::from_secs(1);
/// Empty answers followed while the stream says there is more, looking for a position's
/// first record.
const EMPTY_READS: usize = 5;

/// What a reset does to a shard's reading, in records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Estimate {
    /// The target is behind the checkpoint: about this many records are read again.
    Replays(Count),
    /// The target is ahead of the checkpoint: about this many records are never read.
    Skips(Count),
    /// The same place.
    Nothing,
}

/// A number of records, or at least that many (the count stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    pub(crate) records: u64,
    pub(crate) more: bool,
}

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.more {
            write!(f, "more than {} records", self.records)
        } else {
            write!(f, "about {} record(s)", self.records)
        }
    }
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Replays(n) => write!(f, "replays {n}"),
            Self::Skips(n) => write!(f, "skips {n}"),
            Self::Nothing => write!(f, "replays and skips nothing"),
        }
    }
}

/// What resetting `lease` (of `shard`) to `to` does to its reading.
pub(crate) async fn estimate(
    source: &impl ShardSource,
    shard: &ShardId,
    lease: &Lease,
    to: &ResetTo,
) -> Result<Estimate, kcl_core::BackendError> {
    let now = position_of_lease(lease);
    let target = position_of_target(to);
    let at_now = first(source, shard, &now).await?;
    let at_target = first(source, shard, &target).await?;
    Ok(match (at_now, at_target) {
        (None, None) => Estimate::Nothing,
        (Some(a), Some(b)) if a == b => Estimate::Nothing,
        (None, Some(_)) => Estimate::Replays(count(source, shard, &target, None).await?),
        (Some(_), None) => Estimate::Skips(count(source, shard, &now, None).await?),
        (Some(a), Some(b)) if b < a => {
            Estimate::Replays(count(source, shard, &target, Some(&a)).await?)
        }
        (Some(_), Some(b)) => Estimate::Skips(count(source, shard, &now, Some(&b)).await?),
    })
}

/// Where the lease's holder reads from.
fn position_of_lease(lease: &Lease) -> StartingPosition {
    match (&lease.checkpoint, lease.start_timestamp) {
        (Checkpoint::Latest | Checkpoint::AtTimestamp, Some(at)) => {
            StartingPosition::AtTimestamp(at)
        }
        (Checkpoint::Sequence(s), _) => StartingPosition::AfterSequence(s.sequence.clone()),
        (Checkpoint::TrimHorizon, _) => StartingPosition::TrimHorizon,
        // LATEST not yet pinned (and a finished shard, not reset): at the tip.
        _ => StartingPosition::Latest,
    }
}

/// Where a reset to `to` reads from.
fn position_of_target(to: &ResetTo) -> StartingPosition {
    match (&to.checkpoint, to.pin) {
        (Checkpoint::TrimHorizon, _) => StartingPosition::TrimHorizon,
        (Checkpoint::AtTimestamp, Some(at)) => StartingPosition::AtTimestamp(at),
        (Checkpoint::Sequence(s), _) => StartingPosition::AfterSequence(s.sequence.clone()),
        _ => StartingPosition::Latest,
    }
}

/// The sequence number of the first record at `position`; `None` at the shard's tip.
async fn first(
    source: &impl ShardSource,
    shard: &ShardId,
    position: &StartingPosition,
) -> Result<Option<SequenceNumber>, kcl_core::BackendError> {
    let mut iterator = source.shard_iterator(shard, position).await?;
    for read in 0..EMPTY_READS {
        if read > 0 {
            tokio::time::sleep(PACE).await;
        }
        let batch = source.get_records(&iterator, 1).await?;
        if let Some(record) = batch.records.first() {
            return Ok(Some(record.sequence_number.clone()));
        }
        match batch.next_iterator {
            Some(next) if batch.millis_behind_latest.is_some_and(|ms| ms > 0) => iterator = next,
            _ => break,
        }
    }
    Ok(None)
}

/// The records from `position` up to (not including) `until`, or to the tip.
async fn count(
    source: &impl ShardSource,
    shard: &ShardId,
    position: &StartingPosition,
    until: Option<&SequenceNumber>,
) -> Result<Count, kcl_core::BackendError> {
    let mut iterator = source.shard_iterator(shard, position).await?;
    let mut records = 0;
    for call in 0..MAX_CALLS {
        if call > 0 {
            tokio::time::sleep(PACE).await;
        }
        let batch = source.get_records(&iterator, BATCH).await?;
        let empty = batch.records.is_empty();
        for record in &batch.records {
            if until.is_some_and(|u| record.sequence_number >= *u) {
                return Ok(Count {
                    records,
                    more: false,
                });
            }
            records += 1;
        }
        let at_tip = empty && batch.millis_behind_latest.is_none_or(|ms| ms == 0);
        match batch.next_iterator {
            Some(next) if !at_tip => iterator = next,
            _ => {
                return Ok(Count {
                    records,
                    more: false,
                });
            }
        }
    }
    Ok(Count {
        records,
        more: true,
    })
}
