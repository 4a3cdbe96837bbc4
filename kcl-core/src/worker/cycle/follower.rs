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

use std::time::Duration;

use tokio::time::Instant;

use super::every_worker::{self, Scope};
use super::{Coordinator, Wiring, take::Taking};
use crate::config::WorkerConfig;
use crate::error::Error;
use crate::lease::{self, Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::processor::ProcessorFactory;
use crate::singleton::is_coordination_key;
use crate::source::ShardSource;
use crate::types::ShardId;
use crate::worker::roles::Roles;
use crate::worker::table::Table;
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
    /// Its first cycle as a follower.
    since: Option<Instant>,
}

impl Following {
    /// One cycle as a follower; see the module docs.
    pub(super) async fn cycle<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        state: &mut Coordinator,
        roles: &Roles,
    ) -> Result<(), Error> {
        let table = w.table;
        let since = *self.since.get_or_insert_with(Instant::now);
        let every = table.config.taker_interval * LOOK_FOR_WORK_EVERY;
        let look = self.looked_for_work.is_none_or(|at| at.elapsed() >= every);
        if state.shards.is_empty() && look {
            self.looked_for_work = Some(Instant::now());
            let how = Read::Whole(Some(roles));
            return every_worker::plan_for_myself(w, state, how, Scope::Itself).await;
        }
        state.shards.hand_over_requested(&table.me);
        state.heartbeat.follow_flag(table, &state.shards).await;
        let interval = owner_query_interval(&table.config, since.elapsed());
        if self
            .owner_query_at
            .is_some_and(|at| at.elapsed() < interval)
        {
            w.report.cycle_done();
            return Ok(());
        }
        let mine = match table
            .call("owned_by", table.store.owned_by(&table.me))
            .await
        {
            Ok(keys) => keys,
            Err(error) if error.kind().is_permanent() => return Err(Error::Store(error)),
            Err(error) => {
                tracing::warn!(%error, "reading which leases name this worker failed");
                w.report.reachable(false);
                return Ok(());
            }
        };
        // A follower holding leases reads the table only this way: it says the table can
        // be read again here, or a failed read of the whole table from before it held
        // them would keep it unready for as long as it holds them.
        w.report.reachable(true);
        w.report.solved();
        self.owner_query_at = Some(Instant::now());
        roles.assigned(&mine);
        adopt(w, state.taking(), mine).await;
        w.report.cycle_done();
        Ok(())
    }
}

/// One cycle as the standby; see the module docs.
pub(super) async fn stand_by<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    w: &Wiring<'_, S, L, F>,
    state: &mut Coordinator,
    roles: &Roles,
) -> Result<(), Error> {
    let (how, me) = (Read::Feed(roles), &w.table.me);
    if state.shards.is_empty() {
        // The leader learns of a worker only from the leases it holds or asks for.
        return every_worker::plan_for_myself(w, state, how, Scope::Itself).await;
    }
    // The standby's own read shows which leases name it: no index query.
    let listed = state.view.list(w.table, w.report, &mut state.problems, how);
    if let Some(leases) = listed.await? {
        // Handing over first: what leaves makes room for what is adopted.
        state.shards.hand_over_listed(me, &leases);
        state.shards.hand_over_requested(me);
        let mine = lease::keys_owned_by(leases, me);
        adopt(w, state.taking(), mine).await;
        w.report.cycle_done();
    }
    state.shards.hand_over_requested(me);
    Ok(())
}

/// How often a follower asks which leases name it: half the failover time (5 s by default;
/// KCL Java 3.x's workers ask every 10 s). Only what the leader arranged reaches a follower
/// this way (assignments, handoffs: the leader takes expired leases itself), so this paces
/// balancing, not failover. A follower that started lately (within [`NEW_FOR`] failover
/// times) asks every taker interval: that is when a rolling replace gives it the leases the
/// worker it replaces released (`lease::leader`), which would otherwise wait for its query;
/// a few dozen queries once per start cost next to nothing.
fn owner_query_interval(config: &WorkerConfig, running: Duration) -> Duration {
    if running < config.failover_time * NEW_FOR && !mutation::on(Mutation::ReleasedViaLeader) {
        return config.taker_interval;
    }
    (config.failover_time / 2).max(config.taker_interval)
}

/// How long, in failover times, a follower counts as new (see `owner_query_interval`).
const NEW_FOR: u32 = 2;

/// Takes the leases among `mine` (keys whose row names this worker) that it does not
/// hold yet, or gives them back if it is at `max_leases` (and hands none over, which would
/// make room) or asked to drain.
async fn adopt<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    w: &Wiring<'_, S, L, F>,
    mut taking: Taking<'_>,
    mine: Vec<ShardId>,
) {
    let table = w.table;
    let unheld: Vec<_> = mine
        .into_iter()
        .filter(|k| !taking.shards.holds(k) && !is_coordination_key(k))
        .collect();
    for key in &unheld {
        let row = match table.call("get", table.store.get(key)).await {
            Ok(Some(row)) if row.is_owned_by(&table.me) && !row.is_finished() => row,
            Ok(_) => continue,
            Err(error) => {
                tracing::debug!(shard = %key, %error, "reading a lease to adopt failed");
                continue;
            }
        };
        let full = taking.shards.len() >= table.config.max_leases;
        let drained = taking.view.is_drained(&table.me);
        if full && !drained && taking.shards.handing_off() > 0 {
            // Leases on their way out make room in a moment: adopt it then (the row keeps
            // naming this worker). A refusal now would tell the leader this worker takes no
            // more than what it keeps, and it would stay short for a long while.
            tracing::debug!(shard = %key, "at max_leases while handing over: adopting later");
            continue;
        }
        if full || drained {
            refuse(table, &row).await;
            continue;
        }
        taking.take(w, &row).await;
        // The leader may have moved the lease on before this worker adopted it (the take
        // kept the request): handing it over now makes room for the next ones, which wait
        // for it rather than being refused.
        taking.shards.hand_over_requested(&table.me);
    }
}

/// Gives back a lease assigned to this worker at its `max_leases`, and says why: its
/// name in the released row's `handoffTo` tells the leader this worker is full (see
/// `Moves`). The request is harmless on an unowned row, and the next take clears it.
async fn refuse<L: LeaseStore>(table: &Table<L>, row: &Lease) {
    let key = &row.key;
    tracing::info!(shard = %key, "at max_leases: giving an assigned lease back");
    if let Err(error) = table.call("release", table.store.release(row)).await {
        tracing::debug!(shard = %key, %error, "giving a lease back failed");
        return;
    }
    let mut released = row.clone();
    released.owner = None;
    let why = table.store.request_handoff(&released, Some(&table.me));
    if let Err(error) = table.call("request_handoff", why).await {
        tracing::debug!(shard = %key, %error, "marking a lease given back failed");
    }
}
