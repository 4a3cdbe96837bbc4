//! Moving leases: taking them (and starting their shard tasks), asking their owners for
//! them, and granting or declining what others ask of this worker. Every mode's cycle does
//! these; each is one conditional write.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt as _;
use tokio::time::Instant;

use super::Coordinator;
use crate::error::{BackendError, ErrorKind};
use crate::lease::taker::{self, Candidate, Holder, Limits};
use crate::lease::{Lease, LeaseStore};
use crate::metrics;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::{ShardId, WorkerId};
use crate::worker::Worker;
use crate::worker::shard_consumer::ShardContext;
use crate::worker::view::View;

/// Takes of one cycle in flight at once (see `take_all`).
const CONCURRENT_TAKES: usize = 16;

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// Takes one lease and starts its shard task.
    pub(super) async fn take(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &Lease,
    ) {
        self.take_all(state, ctx, &[observed]).await;
    }

    /// Takes leases and starts their shard tasks. The fences and the heartbeat come first
    /// (they need the state), then the takes themselves, [`CONCURRENT_TAKES`] at a time: a
    /// worker starting on a large table takes hundreds of leases at once, and one after the
    /// other that would hold back the first records by a round trip each.
    pub(super) async fn take_all(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &[&Lease],
    ) {
        let mut ready = Vec::with_capacity(observed.len());
        for lease in observed {
            if let Some(owner) = lease.owner.as_ref().filter(|o| *o != &self.id)
                && !self.fence(&mut state.view, owner).await
            {
                continue;
            }
            ready.push(*lease);
        }
        if ready.is_empty() {
            return;
        }
        if !self.ensure_heartbeat(&mut state.heartbeat).await {
            tracing::debug!(leases = ready.len(), "no heartbeat: not taking");
            return;
        }
        // The futures are made first: a stream mapping through a closure that borrows `self`
        // would not be `Send` for every lifetime, as `tokio::spawn` needs.
        let takes: Vec<_> = ready.into_iter().map(|o| self.timed_take(o)).collect();
        let taken: Vec<_> = futures_util::stream::iter(takes)
            .buffer_unordered(CONCURRENT_TAKES)
            .collect()
            .await;
        for (observed, started, take) in taken {
            self.started(state, ctx, observed, started, take);
        }
    }

    /// Takes `observed` for this worker: the lease, when the take started, and its outcome.
    async fn timed_take<'a>(
        &self,
        observed: &'a Lease,
    ) -> (&'a Lease, Instant, Result<Lease, BackendError>) {
        let started = Instant::now();
        let take = self.store.take(observed, &self.id);
        let result = bounded(self.config.call_timeout, "take", take).await;
        (observed, started, result)
    }

    /// Starts the shard task of a lease whose take succeeded; logs why one did not.
    fn started(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &Lease,
        started: Instant,
        take: Result<Lease, BackendError>,
    ) {
        let key = &observed.key;
        match take {
            Ok(lease) => {
                let [unowned, expired, handoff] = metrics::TAKEN_FROM;
                let from = match &observed.owner {
                    None => unowned,
                    Some(o) if o == &self.id => handoff,
                    Some(_) => expired,
                };
                match &observed.owner {
                    None => tracing::info!(shard = %key, "lease taken (it had no owner)"),
                    Some(o) if o == &self.id => {
                        tracing::info!(shard = %key, "lease taken (handed over to this worker)");
                    }
                    Some(o) => tracing::info!(shard = %key, from = %o, "lease taken (expired)"),
                }
                ::metrics::counter!(metrics::LEASES_TAKEN, "from" => from).increment(1);
                let heartbeat = state.heartbeat.tenure();
                state.shards.spawn(self, ctx, lease, started, heartbeat);
            }
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::debug!(shard = %key, "lease taken by someone else first");
            }
            Err(error) => tracing::warn!(shard = %key, %error, "taking lease failed"),
        }
    }

    /// Asks the owner of `observed` to hand it to `to`. Returns whether the request was
    /// written.
    pub(super) async fn ask_handoff(&self, view: &View, observed: &Lease, to: &WorkerId) -> bool {
        let key = &observed.key;
        let request = self.store.request_handoff(observed, Some(to));
        match bounded(self.config.call_timeout, "request_handoff", request).await {
            Ok(()) => {
                tracing::info!(shard = %key, from = %owner_name(observed), %to, "handoff requested");
                ::metrics::counter!(metrics::LEASES_STOLEN).increment(1);
                if let Some(owner) = &observed.owner {
                    self.flag_handoff(view, owner).await;
                }
                true
            }
            Err(error) => {
                tracing::debug!(shard = %key, %error, "handoff request failed");
                false
            }
        }
    }

    /// Starts handoffs other workers asked for while this worker stays at or above its lower
    /// fair share, and declines the others (clears the request) so that a request from a
    /// worker that has gone away, or one the fleet no longer needs, does not linger.
    pub(super) async fn grant_handoffs(
        &self,
        state: &Coordinator,
        candidates: &[Candidate],
        by_key: &BTreeMap<&ShardId, &Lease>,
    ) {
        let in_progress = state.shards.handing_off();
        // A worker asked to drain grants every request: it is to hold nothing.
        let mut grant = if state.view.is_drained(&self.id) {
            usize::MAX
        } else {
            taker::handoffs_to_grant(&self.id, candidates, in_progress)
        };
        for c in candidates {
            let (Holder::Me, Some(to)) = (&c.holder, &c.handoff_to) else {
                continue;
            };
            let Some(held) = state.shards.get(&c.key) else {
                continue;
            };
            if held.control.is_handing_off() {
                continue;
            }
            if grant > 0 && to != &self.id {
                grant -= 1;
                tracing::info!(shard = %c.key, to = %to, "granting handoff");
                held.control.hand_off(to.clone());
            } else if let Some(row) = by_key.get(&c.key) {
                tracing::debug!(shard = %c.key, to = %to, "declining handoff");
                let decline = self.store.request_handoff(row, None);
                if let Err(error) =
                    bounded(self.config.call_timeout, "request_handoff", decline).await
                {
                    tracing::debug!(shard = %c.key, %error, "declining handoff failed");
                }
            }
        }
    }

    /// The bounds of this worker's plan: none to take while it is asked to drain.
    pub(super) fn limits(&self, view: &View) -> Limits {
        if view.is_drained(&self.id) {
            return Limits {
                max_leases: 0,
                max_steal: 0,
            };
        }
        Limits {
            max_leases: self.config.max_leases,
            max_steal: self.config.max_leases_to_steal,
        }
    }
}

/// A lease's owner for a log line: its id, or `nobody`.
pub(super) fn owner_name(lease: &Lease) -> &str {
    lease.owner.as_ref().map_or("nobody", WorkerId::as_str)
}
