//! The taker cycle under [`Coordination::Leader`](crate::Coordination::Leader), by role.
//!
//! - The **leader** follows the whole table (through the change feed, see
//!   [`lease::feed`](crate::lease::feed)), syncs shards, and plans for the fleet
//!   ([`lease::leader`](crate::lease::leader)): it takes leases that lost their owner itself,
//!   writes new ones to the least loaded active worker, and asks loaded owners for handoffs.
//! - The **standby** follows the table too, to observe: when it becomes the leader its
//!   observations are a failover time old already, so the old leader's leases move in its
//!   first cycle as leader. It adopts what its own view shows naming it, and hands over what
//!   its view shows requested. While it holds nothing it also plans for itself.
//! - **Followers** ask which leases name them ([`LeaseStore::owned_by`], every half failover
//!   time) and adopt those they do not hold; they hand over leases whose renewal showed a
//!   handoff request, or, under heartbeats, those a flag on their heartbeat row sends them
//!   to read (see `liveness`). The requests come from the leader, or from a worker looking for
//!   work.
//! - A follower that holds nothing reads the whole table every few cycles and plans for
//!   itself as under `EveryWorker` (without shard sync): that is how a new worker, or any
//!   worker while no leader is known, finds work and makes itself known to the leader.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::Worker;
use super::coordinator::Coordinator;
use super::problems::ProblemKind;
use super::roles::Role;
use super::shard_consumer::ShardContext;
use crate::coordination::is_coordination_key;
use crate::error::{Error, ErrorKind};
use crate::lease::leader;
use crate::lease::taker::Holder;
use crate::lease::{self, Lease, LeaseStore};
use crate::metrics;
use crate::mutation::{self, Mutation};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::{ShardId, WorkerId};

/// A follower that holds nothing reads the whole table at most once per this many taker
/// intervals.
const LOOK_FOR_WORK_EVERY: u32 = 5;

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// One cycle under `Coordination::Leader`; see the module docs.
    pub(super) async fn led_cycle(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        if state.roles.current() != Role::Leader {
            // Only the leader sees the whole fleet's plan.
            state
                .problems
                .replace(ProblemKind::Unowned, BTreeMap::new());
        }
        match state.roles.current() {
            Role::Leader => self.lead(state, ctx).await?,
            // A standby that holds nothing plans for itself, as a follower looking for work
            // does: the leader learns of a worker only from the leases it holds or asks for.
            Role::Standby if state.held.is_empty() => {
                self.cycle_for_myself(state, ctx, false).await?;
            }
            Role::Standby => {
                // The standby's own read shows which leases name it: no index query.
                if let Some(leases) = self.list(state).await? {
                    self.hand_over_listed(state, &leases);
                    let mine = lease::keys_owned_by(leases, &self.id);
                    self.adopt(state, ctx, mine).await;
                    self.cycle_done();
                }
                self.hand_over_requested(state);
            }
            Role::Follower => {
                let due = state.looked_for_work.is_none_or(|at| {
                    at.elapsed() >= self.config.taker_interval * LOOK_FOR_WORK_EVERY
                });
                if state.held.is_empty() && due {
                    state.looked_for_work = Some(Instant::now());
                    self.cycle_for_myself(state, ctx, false).await?;
                } else {
                    self.follow(state, ctx).await?;
                }
            }
        }
        Ok(())
    }

    /// The leader's cycle: read, sync, plan for the fleet, act.
    async fn lead(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        let Some(leases) = self.list_and_sync(state, true).await? else {
            return Ok(());
        };
        let (by_key, mut candidates) = self.candidates(state, &leases);
        let limits = self.limits(state);
        let (now, failover) = (Instant::now(), self.config.failover_time);
        state.moves.overlay(&leases, &mut candidates, now, failover);
        state.observer.forget_inactive(now, failover * 10);
        for c in &candidates {
            if let Holder::Expired { owner, .. } = &c.holder {
                state.observer.lapsed(owner);
            }
        }
        let (observer, moves, drained) = (&state.observer, &state.moves, &state.drained);
        let plan = leader::assign_within(
            &self.id,
            &candidates,
            limits,
            // A worker asked to drain is given nothing and asked for nothing.
            |w| {
                !drained.contains(w)
                    && (observer.is_active(w, now, failover)
                        || mutation::on(Mutation::LeaderIgnoresActivity))
            },
            |key, w| moves.refused(key, w),
        );
        let unplaced = plan.unplaced.iter().map(|key| {
            let why = "ready to be processed, but no worker has room for it (max_leases)";
            (key.to_string(), why.to_owned())
        });
        state
            .problems
            .replace(ProblemKind::Unowned, unplaced.collect());
        let mut mine = Vec::new();
        for (key, to) in &plan.take {
            let Some(observed) = by_key.get(key) else {
                continue;
            };
            if to == &self.id {
                mine.push(*observed);
            } else if let Some(owner) = observed.owner.as_ref().filter(|o| *o != &self.id)
                && !self.fence(state, owner).await
            {
                continue;
            } else if self.assign(observed, to).await {
                state.moves.record(key, to, observed, Instant::now());
            }
        }
        self.take_all(state, ctx, &mine).await;
        for (key, to) in &plan.request_handoff {
            match state.held.get(key) {
                Some(held) if !held.control.is_handing_off() => {
                    tracing::info!(shard = %key, %to, "handing off to balance the fleet");
                    held.control.hand_off(to.clone());
                    if let Some(observed) = by_key.get(key) {
                        state.moves.record(key, to, observed, Instant::now());
                    }
                }
                Some(_) => {}
                None => {
                    if let Some(observed) = by_key.get(key) {
                        state.observer.requested_for(key, to);
                        if self.ask_handoff(state, observed, to).await {
                            state.moves.record(key, to, observed, Instant::now());
                        }
                    }
                }
            }
        }
        self.hand_over_listed(state, &leases);
        self.hand_over_requested(state);
        self.flag_pending(state, &leases).await;
        self.cycle_done();
        Ok(())
    }

    /// Writes `to` as the owner of an available lease; `to` adopts it when it next looks.
    /// Returns whether the write succeeded.
    async fn assign(&self, observed: &Lease, to: &WorkerId) -> bool {
        let key = &observed.key;
        let take = self.store.take(observed, to);
        match bounded(self.config.call_timeout, "take", take).await {
            Ok(_) => {
                tracing::info!(shard = %key, from = %super::coordinator::owner_name(observed), %to, "lease assigned");
                ::metrics::counter!(metrics::LEASES_ASSIGNED).increment(1);
                return true;
            }
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::debug!(shard = %key, "lease moved before it could be assigned");
            }
            Err(error) => tracing::warn!(shard = %key, %error, "assigning lease failed"),
        }
        false
    }

    /// What a follower does each cycle: hand over what was asked for and, every
    /// [`owner_query_interval`](Self::owner_query_interval), adopt what names it.
    async fn follow(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        self.hand_over_requested(state);
        self.follow_flag(state).await;
        let due = state
            .owner_query_at
            .is_none_or(|at| at.elapsed() >= self.owner_query_interval());
        if !due {
            self.cycle_done();
            return Ok(());
        }
        let limit = self.config.call_timeout;
        let mine = match bounded(limit, "owned_by", self.store.owned_by(&self.id)).await {
            Ok(keys) => keys,
            Err(error) if error.kind().is_permanent() => return Err(Error::Store(error)),
            Err(error) => {
                tracing::warn!(%error, "reading which leases name this worker failed");
                return Ok(());
            }
        };
        state.owner_query_at = Some(Instant::now());
        self.adopt(state, ctx, mine).await;
        self.cycle_done();
        Ok(())
    }

    /// How often a follower asks which leases name it: half the failover time (5 s by
    /// default; KCL Java 3.x's workers ask every 10 s). Only handoffs the leader arranged
    /// reach a follower this way (the leader takes orphaned leases itself), so this paces
    /// balancing, not failover.
    fn owner_query_interval(&self) -> std::time::Duration {
        (self.config.failover_time / 2).max(self.config.taker_interval)
    }

    /// Takes the leases among `mine` (keys whose row names this worker) that it does not
    /// hold yet, or gives them back if it is at `max_leases`.
    async fn adopt(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        mine: Vec<ShardId>,
    ) {
        let limit = self.config.call_timeout;
        let unheld: Vec<_> = mine
            .into_iter()
            .filter(|k| !state.held.contains_key(k) && !is_coordination_key(k))
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
            if state.held.len() >= self.config.max_leases || state.drained.contains(&self.id) {
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
        let released = Lease {
            owner: None,
            ..row.clone()
        };
        let why = self.store.request_handoff(&released, Some(&self.id));
        if let Err(error) = bounded(limit, "request_handoff", why).await {
            tracing::debug!(shard = %key, %error, "marking a lease given back failed");
        }
    }

    /// Hands over held leases whose row in `leases` (this worker's read of the table) shows a
    /// handoff request to another worker: the leader and the standby see requests in their
    /// reads, before (or, under heartbeats, instead of) their renewals.
    fn hand_over_listed(&self, state: &Coordinator, leases: &[Lease]) {
        for lease in leases {
            if let Some(to) = lease.handoff_to.as_ref().filter(|to| *to != &self.id)
                && let Some(held) = state.held.get(&lease.key)
                && !held.control.is_handing_off()
            {
                tracing::info!(shard = %lease.key, %to, "handing off as asked");
                held.control.hand_off(to.clone());
            }
        }
    }

    /// Hands over held leases whose last write showed a handoff request to another worker.
    fn hand_over_requested(&self, state: &Coordinator) {
        for (key, held) in &state.held {
            if held.control.is_handing_off() {
                continue;
            }
            if let Some(to) = held.tenure.handoff_requested().filter(|to| to != &self.id) {
                tracing::info!(shard = %key, %to, "handing off as asked");
                held.control.hand_off(to);
            }
        }
    }
}
