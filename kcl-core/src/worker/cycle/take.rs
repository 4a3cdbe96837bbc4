//! Moving leases: taking them (and starting their shard tasks), asking their owners for
//! them, and granting or declining what others ask of this worker. Every mode's cycle does
//! these; each is one conditional write.

use std::collections::BTreeMap;

use futures_util::StreamExt as _;
use tokio::time::Instant;

use super::Wiring;
use crate::error::{BackendError, ErrorKind};
use crate::lease::taker::{self, Candidate, Holder};
use crate::lease::{Lease, LeaseStore};
use crate::metrics;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::types::{ShardId, WorkerId};
use crate::worker::liveness::HeartbeatState;
use crate::worker::shards::Shards;
use crate::worker::table::Table;
use crate::worker::view::View;

/// Takes of one cycle in flight at once (see `take_all`).
const CONCURRENT_TAKES: usize = 16;

/// What taking a lease touches: the shard tasks, the view (its owners' heartbeats, to fence)
/// and this worker's heartbeat (a lease's validity derives from it).
pub(super) struct Taking<'a> {
    pub(super) shards: &'a mut Shards,
    pub(super) view: &'a mut View,
    pub(super) heartbeat: &'a mut HeartbeatState,
}

impl Taking<'_> {
    /// Takes one lease and starts its shard task.
    pub(super) async fn take<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        observed: &Lease,
    ) {
        self.take_all(w, &[observed]).await;
    }

    /// Takes leases and starts their shard tasks. The fences and the heartbeat come first
    /// (they need the state), then the takes themselves, [`CONCURRENT_TAKES`] at a time: a
    /// worker starting on a large table takes hundreds of leases at once, and one after the
    /// other that would hold back the first records by a round trip each.
    pub(super) async fn take_all<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        observed: &[&Lease],
    ) {
        let table = w.table;
        let mut ready = Vec::with_capacity(observed.len());
        for lease in observed {
            if let Some(owner) = lease.owner.as_ref().filter(|o| *o != &table.me)
                && !self.view.heartbeats.fence(table, owner).await
            {
                continue;
            }
            ready.push(*lease);
        }
        if ready.is_empty() {
            return;
        }
        if !self.heartbeat.ensure(table).await {
            tracing::debug!(leases = ready.len(), "no heartbeat: not taking");
            return;
        }
        // The futures are made first: a stream mapping through a closure that borrows the
        // table would not be `Send` for every lifetime, as `tokio::spawn` needs.
        let takes: Vec<_> = ready.into_iter().map(|o| timed_take(table, o)).collect();
        let taken: Vec<_> = futures_util::stream::iter(takes)
            .buffer_unordered(CONCURRENT_TAKES)
            .collect()
            .await;
        for (observed, started, take) in taken {
            self.started(w, observed, started, take);
        }
    }

    /// Starts the shard task of a lease whose take succeeded; logs why one did not.
    fn started<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        observed: &Lease,
        started: Instant,
        take: Result<Lease, BackendError>,
    ) {
        let me = &w.table.me;
        let key = &observed.key;
        match take {
            Ok(lease) => {
                let [unowned, expired, handoff, restart] = metrics::TAKEN_FROM;
                let from = match &observed.owner {
                    None => unowned,
                    Some(o) if o == me && observed.restart_grace.is_some() => restart,
                    Some(o) if o == me => handoff,
                    Some(_) => expired,
                };
                match &observed.owner {
                    None => tracing::info!(shard = %key, "lease taken (it had no owner)"),
                    Some(o) if o == me && observed.restart_grace.is_some() => {
                        tracing::info!(shard = %key, "lease resumed (kept through this worker's restart)");
                    }
                    Some(o) if o == me => {
                        tracing::info!(shard = %key, "lease taken (handed over to this worker)");
                    }
                    Some(o) => tracing::info!(shard = %key, from = %o, "lease taken (expired)"),
                }
                ::metrics::counter!(metrics::LEASES_TAKEN, "from" => from).increment(1);
                let heartbeat = self.heartbeat.tenure();
                self.shards.spawn(w.table, w.ctx, lease, started, heartbeat);
                w.report.publish_taken(key, self.shards.len());
            }
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::debug!(shard = %key, "lease taken by someone else first");
            }
            Err(error) => tracing::warn!(shard = %key, %error, "taking lease failed"),
        }
    }
}

/// Takes `observed` for this worker: the lease, when the take started, and its outcome.
async fn timed_take<'a, L: LeaseStore>(
    table: &Table<L>,
    observed: &'a Lease,
) -> (&'a Lease, Instant, Result<Lease, BackendError>) {
    let started = Instant::now();
    let result = table
        .call("take", table.store.take(observed, &table.me))
        .await;
    (observed, started, result)
}

/// Asks the owner of `observed` to hand it to `to`. Returns whether the request was
/// written.
pub(super) async fn ask_handoff<L: LeaseStore>(
    table: &Table<L>,
    view: &View,
    observed: &Lease,
    to: &WorkerId,
) -> bool {
    let key = &observed.key;
    let request = table.store.request_handoff(observed, Some(to));
    match table.call("request_handoff", request).await {
        Ok(()) => {
            tracing::info!(shard = %key, from = %owner_name(observed), %to, "handoff requested");
            ::metrics::counter!(metrics::LEASES_STOLEN).increment(1);
            if let Some(owner) = &observed.owner {
                view.heartbeats.flag(table, owner).await;
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
pub(super) async fn grant_handoffs<L: LeaseStore>(
    table: &Table<L>,
    shards: &Shards,
    drained: bool,
    candidates: &[Candidate],
    by_key: &BTreeMap<&ShardId, &Lease>,
) {
    let in_progress = shards.handing_off();
    // A worker asked to drain grants every request: it is to hold nothing.
    let mut grant = if drained {
        usize::MAX
    } else {
        taker::handoffs_to_grant(&table.me, candidates, in_progress)
    };
    for c in candidates {
        let (Holder::Me, Some(to)) = (&c.holder, &c.handoff_to) else {
            continue;
        };
        let Some(held) = shards.get(&c.key) else {
            continue;
        };
        if held.control.is_handing_off() {
            continue;
        }
        if grant > 0 && to != &table.me {
            grant -= 1;
            tracing::info!(shard = %c.key, to = %to, "granting handoff");
            held.control.hand_off(to.clone());
        } else if let Some(row) = by_key.get(&c.key) {
            tracing::debug!(shard = %c.key, to = %to, "declining handoff");
            let decline = table.store.request_handoff(row, None);
            if let Err(error) = table.call("request_handoff", decline).await {
                tracing::debug!(shard = %c.key, %error, "declining handoff failed");
            }
        }
    }
}

/// A lease's owner for a log line: its id, or `nobody`.
pub(super) fn owner_name(lease: &Lease) -> &str {
    lease.owner.as_ref().map_or("nobody", WorkerId::as_str)
}

#[cfg(all(test, feature = "test-util"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::config::WorkerConfig;
    use crate::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
    use crate::types::Checkpoint;
    use crate::worker::cycle::Coordinator;
    use crate::worker::report::Report;
    use crate::worker::shard_consumer::ShardContext;

    /// `Status.held` names a shard the moment its task starts, not at the end of the cycle
    /// that took it: a follower adopting leases one by one on a slow table would otherwise
    /// report none while it already delivers records.
    #[tokio::test(start_paused = true)]
    async fn status_names_a_shard_as_soon_as_its_task_starts() {
        let table = Table {
            me: WorkerId::from("w"),
            config: Arc::new(WorkerConfig::default()),
            store: Arc::new(MemoryLeaseStore::new()),
            meters: crate::lease::load::Meters::new(1000),
        };
        let report = Report::default();
        let status = report.subscribe();
        let factory = |_: &ShardId| IdleProcessor;
        let source = Arc::new(MemoryStream::new(1));
        let ctx = Arc::new(ShardContext::new(
            source,
            Arc::new(factory),
            table.config.clone(),
            None,
        ));
        let w = Wiring {
            table: &table,
            report: &report,
            ctx: &ctx,
        };
        let mut state = Coordinator::new(CancellationToken::new(), Arc::default());
        let shard = ShardId::new("shardId-000000000000");
        let mut lease = Lease::new(shard.clone(), Checkpoint::TrimHorizon);
        lease.owner = Some(table.me.clone());
        state
            .taking()
            .started(&w, &lease.clone(), Instant::now(), Ok(lease));
        assert_eq!(status.borrow().held, vec![shard]);
        state.shards.abandon();
    }
}
