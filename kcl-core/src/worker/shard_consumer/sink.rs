//! Opening a shard on a worker given a sink that keeps shards' positions
//! ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)): the sink is fenced for
//! this tenure, the lease row is read back to prove the tenure still holds it
//! (`Tenure::open_sink`), and a lease checkpoint behind the sink's position is brought up to
//! it, so that the shard resumes after the later of the two. Why, and what the sink
//! guarantees: [`Positions`](crate::outputs::Positions).

use super::{Failure, ShardContext, Stop};
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError};
use crate::mutation::{self, Mutation};
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::Checkpoint;

/// Fences the worker's sink, if it has one, and brings the lease up to its position; the
/// stop when the tenure turned out to be lost.
pub(super) async fn open<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
) -> Result<Option<Stop>, Failure> {
    let Some(sink) = &ctx.positions else {
        return Ok(None);
    };
    let position = match tenure.open_sink(sink).await {
        Ok(position) => position,
        Err(TenureError::Store(e)) => return Err(Failure::Positions(e)),
        Err(_) => return Ok(Some(Stop::Lost)),
    };
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
    let mut update = CheckpointUpdate::new(position);
    if update.checkpoint == Checkpoint::ShardEnd {
        update.child_shard_ids = children(ctx, tenure).await?;
    }
    forward(tenure, &update).await
}

/// The children of the tenure's shard, for a `SHARD_END` the sink has and the lease has
/// not (the lease's write after the sink's commit failed): the parent's row names them, as
/// every ended parent's does.
async fn children<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
) -> Result<Vec<crate::types::ShardId>, Failure> {
    let shards = bounded(
        ctx.config.call_timeout,
        "list_shards",
        ctx.source.list_shards(),
    )
    .await
    .map_err(Failure::Positions)?;
    let parent = tenure.shard();
    Ok(shards
        .into_iter()
        .filter(|s| s.parent_shard_ids.contains(parent))
        .map(|s| s.id)
        .collect())
}

/// Moves the lease's checkpoint up to the sink's position. Records the row listed as
/// finished past its old checkpoint are not carried over: past the sink's position, only
/// the sink knows what was written.
async fn forward(tenure: &Tenure, update: &CheckpointUpdate) -> Result<Option<Stop>, Failure> {
    match tenure.checkpoint(update).await {
        Ok(_) => Ok(None),
        Err(TenureError::Lost) => Ok(Some(Stop::Lost)),
        // Another write of this tenure moved the checkpoint past it meanwhile.
        Err(TenureError::Behind(_)) => Ok(None),
        Err(TenureError::Store(e)) => Err(Failure::Positions(e)),
    }
}
