//! The shard tasks a worker runs: one per held lease, each with the lease's writer
//! ([`Tenure`]) and a [`Control`] to steer it (hand off, stop).
//!
//! The coordinator loop owns this; shard tasks own their processors and their leases' writes.
//! Handing a lease over is asking its task to: the task lets its processor checkpoint
//! (`shutdown_requested`), then passes the lease on itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::shard_consumer::{self, Control, Exit, ShardContext};
use super::table::Table;
use crate::lease::load::{Figure, Meter};
use crate::lease::tenure::{Taken, Tenure};
use crate::lease::{Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::processor::ProcessorFactory;
use crate::singleton::Carriers;
use crate::source::ShardSource;
use crate::types::{ShardId, WorkerId};

/// The shard tasks this worker runs, by shard.
pub(super) struct Shards {
    held: BTreeMap<ShardId, Held>,
    tasks: JoinSet<Exit>,
    task_keys: BTreeMap<tokio::task::Id, ShardId>,
    /// The worker's graceful shutdown, which every shard task's own token is a child of.
    graceful: CancellationToken,
    /// Where each lease taken is offered to carry the worker's roles.
    carriers: Arc<Carriers>,
}

/// One held lease: its writer, and how to steer its task.
pub(super) struct Held {
    pub(super) tenure: Arc<Tenure>,
    pub(super) control: Arc<Control>,
}

impl Shards {
    /// No shard tasks yet; theirs stop gracefully when `graceful` is cancelled; every lease
    /// taken is offered to `carriers`.
    pub(super) fn new(graceful: CancellationToken, carriers: Arc<Carriers>) -> Self {
        Self {
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            task_keys: BTreeMap::new(),
            graceful,
            carriers,
        }
    }

    /// How many leases this worker holds.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// True if this worker holds no lease.
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// True if this worker holds `key`.
    pub(super) fn holds(&self, key: &ShardId) -> bool {
        self.held.contains_key(key)
    }

    /// The lease of `key`, if this worker holds it.
    pub(super) fn get(&self, key: &ShardId) -> Option<&Held> {
        self.held.get(key)
    }

    /// Every held lease, by shard.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&ShardId, &Held)> {
        self.held.iter()
    }

    /// How many held leases are being handed over.
    pub(super) fn handing_off(&self) -> usize {
        self.held
            .values()
            .filter(|h| h.control.is_handing_off())
            .count()
    }

    /// Whether any shard task is still running.
    pub(super) fn has_tasks(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// How many shard tasks are still running.
    pub(super) fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// The next shard task to end, with why; `None` once none is left.
    pub(super) async fn next_exit(&mut self) -> Option<(ShardId, Option<Exit>)> {
        loop {
            let joined = self.tasks.join_next_with_id().await?;
            if let Some(exit) = self.on_exit(joined) {
                return Some(exit);
            }
        }
    }

    /// Stops every shard task at its next `.await`, without waiting for any: a processor
    /// blocking its thread would only stop then.
    pub(super) fn abandon(&mut self) {
        self.tasks.abort_all();
        self.tasks.detach_all();
    }

    /// Starts the shard task of `lease`, just taken at `table` (the take sent at
    /// `started`). Under heartbeats the lease's validity is the heartbeat's.
    pub(super) fn spawn<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        table: &Table<L>,
        ctx: &Arc<ShardContext<S, F>>,
        lease: Lease,
        started: Instant,
        heartbeat: Option<&Arc<Tenure>>,
    ) {
        let key = lease.key.clone();
        let balancing = &table.config.balancing;
        let meter = Meter::new(lease.load, balancing.smoothing, balancing.capacity_milli());
        let meter = Arc::new(meter);
        table.meters.register(&meter);
        let taken = Taken {
            lease,
            worker: table.me.clone(),
            store: table.store.clone(),
            started,
        };
        let tenure = match heartbeat {
            Some(heartbeat) => Tenure::derived(taken, heartbeat.clone(), table.config.call_timeout),
            None => Tenure::new(taken, table.timing()),
        };
        let tenure = Arc::new(tenure.with_figure(Figure::Lease(meter)));
        self.carriers.offer(&tenure);
        let control = Arc::new(Control::new(self.graceful.child_token()));
        let task = shard_consumer::run(ctx.clone(), tenure.clone(), control.clone())
            .instrument(shard_consumer::span(&key, &table.me));
        let handle = crate::task::spawn_in(&mut self.tasks, task);
        self.task_keys.insert(handle.id(), key.clone());
        self.held.insert(key, Held { tenure, control });
    }

    /// Forgets a finished shard task; returns its shard and why it ended (`None` if it did
    /// not end on its own), or `None` for a task it did not know.
    fn on_exit(
        &mut self,
        joined: Result<(tokio::task::Id, Exit), tokio::task::JoinError>,
    ) -> Option<(ShardId, Option<Exit>)> {
        let (id, exit) = match joined {
            Ok((id, exit)) => (id, Some(exit)),
            Err(error) => {
                // Shard tasks catch processor panics: this is an abort, or a bug of ours.
                tracing::error!(%error, "shard task failed");
                (error.id(), None)
            }
        };
        let key = self.task_keys.remove(&id)?;
        tracing::debug!(shard = %key, ?exit, "shard task ended");
        if let Some(held) = self.held.remove(&key) {
            held.tenure.mark_lost();
        }
        crate::metrics::shard_gone(&key);
        Some((key, exit))
    }

    /// Hands over held leases whose row in `leases` (this worker's read of the table) shows a
    /// handoff request to another worker than `me`: the leader and the standby see requests
    /// in their reads, before (or, under heartbeats, instead of) their renewals. Only a row
    /// that names `me` carries a request to `me`: an unowned row naming a worker in
    /// `handoffTo` is that worker's refusal (see `follower::refuse`), which a read from before
    /// this worker took the lease still shows.
    pub(super) fn hand_over_listed(&self, me: &WorkerId, leases: &[Lease]) {
        for lease in leases {
            if let Some(to) = lease.handoff_to.as_ref().filter(|to| *to != me)
                && (lease.owner.as_ref() == Some(me)
                    || mutation::on(Mutation::RefusalTakenForRequest))
                && let Some(held) = self.held.get(&lease.key)
                && !held.control.is_handing_off()
            {
                tracing::info!(shard = %lease.key, %to, "handing off as asked");
                held.control.hand_off(to.clone());
            }
        }
    }

    /// Hands over held leases whose last write showed a handoff request to another worker
    /// than `me`.
    pub(super) fn hand_over_requested(&self, me: &WorkerId) {
        for (key, held) in &self.held {
            if held.control.is_handing_off() {
                continue;
            }
            if let Some(to) = held.tenure.handoff_requested().filter(|to| to != me) {
                tracing::info!(shard = %key, %to, "handing off as asked");
                held.control.hand_off(to);
            }
        }
    }
}
