//! Opening a shard on a worker given a sink that keeps shards' positions
//! ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)): the sink is fenced for
//! this tenure, the lease row is read back to prove the tenure still holds it, and a lease
//! checkpoint behind the sink's position is brought up to it, so that the shard resumes
//! after the later of the two. Why, and what the sink guarantees: [`Positions`](crate::outputs::Positions).

use super::{Failure, ShardContext, Stop};
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError};
use crate::mutation::{self, Mutation};
use crate::task::bounded;
use crate::types::Checkpoint;

/// Fences the worker's sink, if it has one, and brings the lease up to its position; the
/// stop when the tenure turned out to be lost.
pub(super) async fn open<S>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
) -> Result<Option<Stop>, Failure> {
    let Some(sink) = &ctx.positions else {
        return Ok(None);
    };
    let (shard, owner, fence) = (tenure.shard(), tenure.worker(), tenure.fence());
    let limit = ctx.config.call_timeout;
    let position = bounded(limit, "open_positions", sink.0.open(shard, owner, fence))
        .await
        .map_err(Failure::Positions)?;
    // Fenced now: a tenure that had already lost the lease stops before it commits.
    let row = bounded(limit, "get", tenure.store().get(shard))
        .await
        .map_err(Failure::Positions)?;
    if !row.is_some_and(|row| row.is_owned_by(owner) && row.fence == Some(fence)) {
        tenure.mark_lost();
        return Ok(Some(Stop::Lost));
    }
    let Some(position) = position else {
        return Ok(None);
    };
    let lease = tenure.snapshot().await;
    let ahead = position.progress_cmp(&lease.checkpoint) == Some(std::cmp::Ordering::Greater);
    if !ahead || mutation::on(Mutation::SinkPositionIgnored) {
        return Ok(None);
    }
    tracing::info!(
        lease_checkpoint = %lease.checkpoint,
        sink_position = %position,
        "the lease's checkpoint was behind the position of the sink: resuming after the sink's"
    );
    forward(tenure, position).await
}

/// Moves the lease's checkpoint up to the sink's `position`. Records the row listed as
/// finished past its old checkpoint are not carried over: past the sink's position, only
/// the sink knows what was written.
async fn forward(tenure: &Tenure, position: Checkpoint) -> Result<Option<Stop>, Failure> {
    let update = CheckpointUpdate::new(position);
    match tenure.checkpoint(&update).await {
        Ok(_) => Ok(None),
        Err(TenureError::Lost) => Ok(Some(Stop::Lost)),
        // Another write of this tenure moved the checkpoint past it meanwhile.
        Err(TenureError::Behind(_)) => Ok(None),
        Err(TenureError::Store(e)) => Err(Failure::Positions(e)),
    }
}
