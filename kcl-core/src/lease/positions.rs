//! Sinks that keep each shard's position themselves: exactly-once outputs into a system
//! other than the lease store (a Postgres database while the leases live in DynamoDB).
//!
//! A transaction cannot span two systems, so such a sink keeps, beside its outputs, its own
//! row per shard with the position its outputs reach and the tenure allowed to write them.
//! Outputs and position commit in one transaction of the sink, conditioned on that tenure;
//! the lease row's checkpoint follows afterwards, as a plain write. The sink is then the
//! truth about what was written, and two rules keep lease and sink in step:
//! - **Fenced on open.** Before a processor starts on a shard, the worker hands the sink its
//!   new tenure ([`Positions::open`]): the sink's row names it from then on, so a worker that
//!   lost the lease (frozen, partitioned) can no longer commit there. A commit in flight when
//!   the tenure changes either lands first, and the open sees its position, or is refused.
//!   The worker then reads the lease row once more: a tenure that was already lost when it
//!   opened (a processor restarted late on a worker the lease had left) stops there, before
//!   it commits anything, and the next open fences the sink again.
//! - **Resumed from the later of the two.** The lease's checkpoint can trail the sink's
//!   position (the plain write after a commit failed, or the worker died between the two),
//!   or lead it (an operator's reset, a processor's plain checkpoint): the shard resumes
//!   after the later one, and a sink ahead moves the lease's checkpoint up to it first, so
//!   that the next commit's condition (the checkpoint before) holds in both.
//!
//! The fence compared is equality with the tenure that opened last, not an order of fences:
//! a lease row made again (a table rebuilt, a row deleted by hand) starts its counters over,
//! and a sink that only let a higher fence in would refuse every later tenure.
//!
//! A sink implements [`Positions`] and [`Transact`](super::Transact) (with
//! [`keeps_position`](super::Transact::keeps_position) true) and is given to
//! [`WorkerBuilder::positions`](crate::WorkerBuilder::positions); committing into one the
//! worker was not given is refused before anything is written
//! ([`CheckpointError::PositionsNotOpened`](crate::CheckpointError::PositionsNotOpened)).

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::error::BackendError;
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

/// A sink that keeps each shard's position with its outputs; see the module docs.
pub trait Positions: Send + Sync + 'static {
    /// Hands `shard`'s row to the tenure of `owner` with `fence` (creating the row if the
    /// sink has none) and returns the position it holds: the checkpoint of the last commit
    /// into the sink, `None` before the first. A commit of an earlier tenure in flight
    /// either applied before this returns, and its position is returned, or is refused.
    fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> impl Future<Output = Result<Option<Checkpoint>, BackendError>> + Send;
}

impl<P: Positions> Positions for Arc<P> {
    fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> impl Future<Output = Result<Option<Checkpoint>, BackendError>> + Send {
        (**self).open(shard, owner, fence)
    }
}

/// A sink without its type, as the worker keeps it.
pub(crate) trait AnyPositions: Send + Sync {
    fn open<'a>(
        &'a self,
        shard: &'a ShardId,
        owner: &'a WorkerId,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, BackendError>>;
}

impl<P: Positions> AnyPositions for P {
    fn open<'a>(
        &'a self,
        shard: &'a ShardId,
        owner: &'a WorkerId,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<Option<Checkpoint>, BackendError>> {
        Box::pin(Positions::open(self, shard, owner, fence))
    }
}

/// The sink a worker was given ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)),
/// shared by its shards.
#[derive(Clone)]
pub(crate) struct Sink(pub(crate) Arc<dyn AnyPositions>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}
