//! The cycles of the workers that do not lead, under
//! [`Coordination::Leader`](crate::Coordination::Leader).
//!
//! - **Followers** ask which leases name them ([`LeaseStore::owned_by`], every half failover
//!   time) and adopt those they do not hold; they hand over leases whose renewal showed a
//!   handoff request, or, under heartbeats, those a flag on their heartbeat row sends them
//!   to read (see `liveness`). The requests come from the leader, or from a worker looking for
//!   work. A follower that holds nothing reads the whole table every few cycles and plans for
//!   itself (see `every_worker`, without shard sync): that is how a new worker, or any worker
//!   while no leader is known, finds work and makes itself known to the leader.
//! - The **standby** follows the table as the leader does, to observe: when it becomes the
//!   leader its observations are a failover time old already, so the old leader's leases
//!   move in its first cycle as leader. It adopts what its own view shows naming it, and
//!   hands over what its view shows requested. While it holds nothing it plans for itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Coordinator;
use super::every_worker::Scope;
use crate::error::Error;
use crate::lease::{self, Lease, LeaseStore};
use crate::processor::ProcessorFactory;
use crate::singleton::is_coordination_key;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::ShardId;
use crate::worker::Worker;
use crate::worker::roles::Roles;
use crate::worker::shard_consumer::ShardContext;
use crate::worker::view::Read;

/// A follower that holds nothing reads the whole table at most once per this many taker
/// intervals.
const LOOK_FOR_WORK_EVERY: u32 = 5;

/// What a follower keeps between cycles: when it last looked.
#[derive(Default)]
pub(super) struct Following {
    /// When it last read the whole table, looking for work.
    looked_for_work: Option<Instant>,
    /// When it last asked which leases name it.
    owner_query_at: Option<Instant>,
}

impl Following {
    /// One cycle as a follower; see the module docs.
    pub(super) async fn cycle<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        worker: &Worker<S, L, F>,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        let every = worker.config.taker_interval * LOOK_FOR_WORK_EVERY;
        let look = self.looked_for_work.is_none_or(|at| at.elapsed() >= every);
        if state.shards.is_empty() && look {
            self.looked_for_work = Some(Instant::now());
            return worker
                .plan_for_myself(state, ctx, Read::Whole, Scope::Itself)
                .await;
        }
        state.shards.hand_over_requested(&worker.id);
        worker.follow_flag(state).await;
        let interval = owner_query_interval(worker);
        if self
            .owner_query_at
            .is_some_and(|at| at.elapsed() < interval)
        {
            worker.cycle_done();
            return Ok(());
        }
        let limit = worker.config.call_timeout;
        let mine = match bounded(limit, "owned_by", worker.store.owned_by(&worker.id)).await {
            Ok(keys) => keys,
            Err(error) if error.kind().is_permanent() => return Err(Error::Store(error)),
            Err(error) => {
                tracing::warn!(%error, "reading which leases name this worker failed");
                return Ok(());
            }
        };
        self.owner_query_at = Some(Instant::now());
        worker.adopt(state, ctx, mine).await;
        worker.cycle_done();
        Ok(())
    }
}

/// One cycle as the standby; see the module docs.
pub(super) async fn stand_by<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    worker: &Worker<S, L, F>,
    state: &mut Coordinator,
    roles: &Roles,
    ctx: &Arc<ShardContext<S, F>>,
) -> Result<(), Error> {
    let how = Read::Feed(roles);
    if state.shards.is_empty() {
        // The leader learns of a worker only from the leases it holds or asks for.
        return worker.plan_for_myself(state, ctx, how, Scope::Itself).await;
    }
    // The standby's own read shows which leases name it: no index query.
    if let Some(leases) = worker
        .list(&mut state.view, &mut state.problems, how)
        .await?
    {
        state.shards.hand_over_listed(&worker.id, &leases);
        let mine = lease::keys_owned_by(leases, &worker.id);
        worker.adopt(state, ctx, mine).await;
        worker.cycle_done();
    }
    state.shards.hand_over_requested(&worker.id);
    Ok(())
}

/// How often a follower asks which leases name it: half the failover time (5 s by default;
/// KCL Java 3.x's workers ask every 10 s). Only handoffs the leader arranged reach a follower
/// this way (the leader takes orphaned leases itself), so this paces balancing, not failover.
fn owner_query_interval<S, L, F>(worker: &Worker<S, L, F>) -> Duration {
    (worker.config.failover_time / 2).max(worker.config.taker_interval)
}

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// Takes the leases among `mine` (keys whose row names this worker) that it does not
    /// hold yet, or gives them back if it is at `max_leases` or asked to drain.
    async fn adopt(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        mine: Vec<ShardId>,
    ) {
        let limit = self.config.call_timeout;
        let unheld: Vec<_> = mine
            .into_iter()
            .filter(|k| !state.shards.holds(k) && !is_coordination_key(k))
            .collect();
        for key in &unheld {
            let row = match bounded(limit, "get", self.store.get(key)).await {
                Ok(Some(row)) if row.is_owned_by(&self.id) && !row.is_finished() => row,
                Ok(_) => continue,
                Err(error) => {
                    tracing::debug!(shard = %key, %error, "reading a lease to adopt failed");
                    continue;
                }
            };
            let full = state.shards.len() >= self.config.max_leases;
            if full || state.view.is_drained(&self.id) {
                self.refuse(&row).await;
                continue;
            }
            self.take(state, ctx, &row).await;
        }
    }

    /// Gives back a lease assigned to this worker at its `max_leases`, and says why: its
    /// name in the released row's `handoffTo` tells the leader this worker is full (see
    /// `Moves`). The request is harmless on an unowned row, and the next take clears it.
    async fn refuse(&self, row: &Lease) {
        let (key, limit) = (&row.key, self.config.call_timeout);
        tracing::info!(shard = %key, "at max_leases: giving an assigned lease back");
        if let Err(error) = bounded(limit, "release", self.store.release(row)).await {
            tracing::debug!(shard = %key, %error, "giving a lease back failed");
            return;
        }
        let mut released = row.clone();
        released.owner = None;
        let why = self.store.request_handoff(&released, Some(&self.id));
        if let Err(error) = bounded(limit, "request_handoff", why).await {
            tracing::debug!(shard = %key, %error, "marking a lease given back failed");
        }
    }
}
