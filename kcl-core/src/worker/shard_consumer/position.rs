//! Where a processor starts reading, and the pin that makes `LATEST` and `AT_TIMESTAMP`
//! starts hold across reopens.
//!
//! A lease whose checkpoint is still `LATEST` names no position: reopening it later at
//! `LATEST` (after an expired iterator, a processor restart, or on another worker after a
//! crash) would skip everything written in between. So before the first iterator is opened,
//! the time of that open (on the stream's clock as this host sees it, less
//! [`max_clock_skew`](crate::WorkerConfig::max_clock_skew)) is written to the lease as its
//! start timestamp, through the lease's fenced writer. The first open is at `LATEST`; every
//! later one, by anyone, is at that timestamp. `AT_TIMESTAMP` leases are pinned the same way
//! (with the configured time, when the row does not carry one yet), so that all owners read
//! from the same point whatever their own configuration says. KCL Java's `checkpoint` value
//! stays `LATEST`/`AT_TIMESTAMP`; the pin is an attribute KCL Java ignores.
//!
//! A sequence checkpoint is read from *at* its sequence number, and the fetch loop drops the
//! records at or before the checkpoint (`skip_through`): a checkpoint in the middle of a KPL
//! aggregate (sub-sequence `n`) then resumes with its user record `n + 1`, and one at the
//! first user record of an aggregate (sub-sequence 0, the same number an ordinary record has)
//! does not skip the rest of the aggregate, as reading *after* the sequence number would.

use chrono::TimeDelta;

use super::{Failure, ShardContext};
use crate::lease::tenure::{Tenure, TenureError};
use crate::lease::{CheckpointUpdate, Lease};
use crate::mutation::{self, Mutation};
use crate::source::ShardSource;
use crate::types::{Checkpoint, ExtendedSequenceNumber, InitialPosition, StartingPosition};

/// Where the fetch loop opens its first iterator, and where it reopens one before it has read
/// a record (afterwards it reopens after the last record read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    pub(crate) first: StartingPosition,
    pub(crate) reopen: StartingPosition,
    /// Records at or before this position were processed already: dropped when read.
    pub(crate) skip_through: Option<ExtendedSequenceNumber>,
}

impl Start {
    fn at(position: StartingPosition) -> Self {
        Self {
            first: position.clone(),
            reopen: position,
            skip_through: None,
        }
    }
}

/// What [`open`] found.
pub(super) enum Opened {
    /// The shard is finished: nothing to read.
    Finished,
    /// The lease was lost while pinning.
    Lost,
    /// Read from here.
    At(Start),
}

/// Decides where to read `lease` from, pinning a `LATEST` or `AT_TIMESTAMP` start first.
pub(super) async fn open<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    lease: &Lease,
) -> Result<Opened, Failure> {
    let at = |p| Ok(Opened::At(Start::at(p)));
    match (&lease.checkpoint, lease.start_timestamp) {
        (Checkpoint::ShardEnd, _) => Ok(Opened::Finished),
        (Checkpoint::TrimHorizon, _) => at(StartingPosition::TrimHorizon),
        // At the checkpoint's record, skipping what it covers (see the module docs).
        (Checkpoint::Sequence(s), _) => Ok(Opened::At(Start {
            skip_through: Some(s.clone()),
            ..Start::at(StartingPosition::AtSequence(s.sequence.clone()))
        })),
        (Checkpoint::Latest, _) if mutation::on(Mutation::LatestUnpinned) => {
            at(StartingPosition::Latest)
        }
        (Checkpoint::Latest | Checkpoint::AtTimestamp, Some(t)) => {
            at(StartingPosition::AtTimestamp(t))
        }
        (Checkpoint::Latest, None) => {
            let skew = TimeDelta::from_std(ctx.config.max_clock_skew).unwrap_or(TimeDelta::MAX);
            let now = ctx.source.now(&lease.key);
            let pin = now.checked_sub_signed(skew).unwrap_or(now);
            if !write_pin(tenure, lease, pin).await? {
                return Ok(Opened::Lost);
            }
            Ok(Opened::At(Start {
                first: StartingPosition::Latest,
                reopen: StartingPosition::AtTimestamp(pin),
                skip_through: None,
            }))
        }
        (Checkpoint::AtTimestamp, None) => match ctx.config.initial_position {
            InitialPosition::AtTimestamp(t) => {
                if !write_pin(tenure, lease, t).await? {
                    return Ok(Opened::Lost);
                }
                at(StartingPosition::AtTimestamp(t))
            }
            _ => {
                tracing::warn!(
                    "the lease starts AT_TIMESTAMP but neither it nor this worker's \
                     configuration has a timestamp: reading from TRIM_HORIZON (nothing is lost)"
                );
                at(StartingPosition::TrimHorizon)
            }
        },
    }
}

/// Writes the pin; false if the lease turned out to be lost.
async fn write_pin(
    tenure: &Tenure,
    lease: &Lease,
    pin: chrono::DateTime<chrono::Utc>,
) -> Result<bool, Failure> {
    let update = CheckpointUpdate {
        checkpoint: lease.checkpoint.clone(),
        pending: lease.pending_checkpoint.clone(),
        child_shard_ids: Vec::new(),
        start_timestamp: Some(pin),
        endpoint: None,
        park: Vec::new(),
        restart_grace: None,
        carrier: None,
        signals: None,
        // The records finished past the checkpoint stay (the checkpoint does not move).
        acked: lease.acked.clone(),
    };
    match tenure.checkpoint(&update).await {
        Ok(_) => {
            tracing::debug!(%pin, "start position pinned");
            Ok(true)
        }
        Err(TenureError::Lost) => Ok(false),
        Err(TenureError::Store(e)) => Err(Failure::Pin(e)),
        // The stored checkpoint moved past the sentinel: another tenure made progress.
        Err(TenureError::Behind(_)) => Ok(false),
    }
}
