//! The worker: one coordinator loop plus one task per held lease.
//!
//! Every `taker_interval` the coordinator reads the lease table once and, from that one read,
//! syncs shards to leases when due, grants handoffs other workers asked for, adopts leases
//! handed to it, takes available ones and asks loaded workers for more. It owns all of that
//! state; shard tasks own their processors and their leases' writes. Shutdown cancels one
//! root token: shard tasks let their processors checkpoint, release their leases, and `run`
//! returns — or, after `shutdown_timeout`, stops what is left.

mod prefetch;
mod shard_consumer;

use std::collections::BTreeMap;
use std::sync::Arc;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::shard_consumer::{Control, Exit, ShardContext};
use crate::config::WorkerConfig;
use crate::coordination::is_coordination_key;
use crate::error::{ConfigError, Error, ErrorKind};
use crate::lease::observer::Observer;
use crate::lease::sync::{self, Lineage};
use crate::lease::taker::{self, Candidate, Holder, Limits};
use crate::lease::tenure::Tenure;
use crate::lease::{Lease, LeaseStore};
use crate::metrics;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::types::{ShardId, WorkerId};

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Phase {
    /// Creating or waiting for the lease table.
    #[default]
    Starting,
    /// Taking and processing leases.
    Running,
    /// Handing leases back.
    ShuttingDown,
    /// `run` has returned.
    Stopped,
}

/// A snapshot of a worker, for health checks and dashboards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// Where the worker is.
    pub phase: Phase,
    /// Leases with a running shard task.
    pub held: Vec<ShardId>,
    /// Whether the last read of the lease table succeeded.
    pub store_reachable: bool,
}

/// Stops a running [`Worker`].
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    graceful: CancellationToken,
    force: CancellationToken,
}

impl ShutdownHandle {
    /// Graceful shutdown: stop taking leases, let processors checkpoint in
    /// `shutdown_requested`, release every lease so others take them at once.
    pub fn shutdown(&self) {
        self.graceful.cancel();
    }

    /// Stops what graceful shutdown has not finished yet (e.g. on a second signal).
    pub fn force(&self) {
        self.graceful.cancel();
        self.force.cancel();
    }

    /// True once shutdown was asked for.
    pub fn is_shutdown(&self) -> bool {
        self.graceful.is_cancelled()
    }
}

/// Consumes a stream as one member of a fleet. See the module docs.
#[derive(Debug)]
pub struct Worker<S, L, F> {
    id: WorkerId,
    config: Arc<WorkerConfig>,
    source: Arc<S>,
    store: Arc<L>,
    factory: Arc<F>,
    handle: ShutdownHandle,
    status: watch::Sender<Status>,
}

struct Held {
    tenure: Arc<Tenure>,
    control: Arc<Control>,
}

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// A worker named `id` (its `leaseOwner`; unique in the fleet), after validating `config`.
    pub fn new(
        id: impl Into<WorkerId>,
        config: WorkerConfig,
        source: S,
        store: L,
        factory: F,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let id = id.into();
        if id.as_str().is_empty() {
            return Err(ConfigError {
                key: "worker_id",
                reason: "must not be empty".into(),
            });
        }
        Ok(Self {
            id,
            config: Arc::new(config),
            source: Arc::new(source),
            store: Arc::new(store),
            factory: Arc::new(factory),
            handle: ShutdownHandle {
                graceful: CancellationToken::new(),
                force: CancellationToken::new(),
            },
            status: watch::Sender::new(Status::default()),
        })
    }

    /// This worker's id.
    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// A handle that stops [`run`](Self::run) from elsewhere (a signal handler).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Follows the worker's [`Status`].
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Runs until shut down. Returns an error only for failures retrying cannot fix.
    pub async fn run(self) -> Result<(), Error> {
        let span = tracing::info_span!("worker", worker.id = %self.id);
        let result = self.run_inner().instrument(span).await;
        self.status.send_modify(|s| {
            s.phase = Phase::Stopped;
            s.held.clear();
        });
        result
    }

    async fn run_inner(&self) -> Result<(), Error> {
        if !self.ensure_table().await? {
            return Ok(());
        }
        self.status.send_modify(|s| s.phase = Phase::Running);
        tracing::info!("worker started");
        let ctx = Arc::new(ShardContext {
            source: self.source.clone(),
            factory: self.factory.clone(),
            config: self.config.clone(),
        });
        let mut state = Coordinator {
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            task_keys: BTreeMap::new(),
            observer: Observer::default(),
            next_sync: Instant::now(),
            synced_once: false,
        };
        let mut next_cycle = Instant::now();
        let outcome = loop {
            if Instant::now() >= next_cycle {
                if let Err(error) = self.cycle(&mut state, &ctx).await {
                    tracing::error!(%error, "stopping: the stream or lease table is unusable");
                    break Err(error);
                }
                next_cycle = Instant::now() + self.config.taker_interval;
            }
            tokio::select! {
                biased;
                () = self.handle.graceful.cancelled() => break Ok(()),
                Some(joined) = state.tasks.join_next_with_id(), if !state.tasks.is_empty() => {
                    if state.on_exit(joined) == Some(Exit::ShardEnd) {
                        // Children may be ready: sync and plan now rather than a cycle later.
                        state.next_sync = Instant::now();
                        next_cycle = Instant::now();
                    }
                    self.publish(&state);
                }
                () = sleep_until(next_cycle) => {}
            }
        };

        self.handle.graceful.cancel();
        self.status.send_modify(|s| s.phase = Phase::ShuttingDown);
        tracing::info!(
            leases = state.held.len(),
            "shutting down: handing leases back"
        );
        let deadline = Instant::now() + self.config.shutdown_timeout;
        loop {
            tokio::select! {
                biased;
                () = self.handle.force.cancelled() => break,
                () = sleep_until(deadline) => break,
                joined = state.tasks.join_next_with_id() => match joined {
                    Some(joined) => { state.on_exit(joined); self.publish(&state); }
                    None => break,
                },
            }
        }
        if !state.tasks.is_empty() {
            let why = if self.handle.force.is_cancelled() {
                "shutdown forced"
            } else {
                "shutdown deadline reached"
            };
            tracing::warn!(
                shards = state.tasks.len(),
                "{why}: stopping remaining shards without releasing their leases"
            );
            state.tasks.abort_all();
            while state.tasks.join_next().await.is_some() {}
        } else if !self.handle.force.is_cancelled() {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, self.release_unheld())
                .await
                .is_err()
            {
                tracing::warn!("shutdown deadline reached while releasing leases handed to us");
            }
        }
        tracing::info!("worker stopped");
        outcome
    }

    /// Releases leases that name this worker but that it does not hold: handed over to it by
    /// another worker after its last cycle. Without this they would wait for expiry.
    async fn release_unheld(&self) {
        let Ok(leases) = self.store.list().await else {
            return;
        };
        for lease in leases
            .iter()
            .filter(|l| l.is_owned_by(&self.id) && !is_coordination_key(&l.key))
        {
            match self.store.release(lease).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "released a lease handed over during shutdown");
                }
                Err(error) => tracing::debug!(shard = %lease.key, %error, "release failed"),
            }
        }
    }

    /// Creates the lease table, retrying transient failures. False if shut down meanwhile.
    async fn ensure_table(&self) -> Result<bool, Error> {
        let mut delays = self.backoff().build();
        loop {
            match self.store.ensure_table().await {
                Ok(()) => return Ok(true),
                Err(e) if e.kind().is_transient() => {
                    tracing::warn!(error = %e, "lease table not ready; retrying");
                }
                Err(e) => return Err(Error::Store(e)),
            }
            tokio::select! {
                biased;
                () = self.handle.graceful.cancelled() => return Ok(false),
                () = sleep(delays.next().unwrap_or(self.config.max_backoff)) => {}
            }
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.config.min_backoff)
            .with_max_delay(self.config.max_backoff)
            .with_jitter()
            .with_jitter_seed(crate::types::stable_hash(&self.id))
            .without_max_times()
    }

    /// One taker cycle; see the module docs.
    async fn cycle(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        let listed_at = Instant::now();
        let mut leases = match self.store.list().await {
            Ok(leases) => leases,
            Err(error) => {
                tracing::warn!(%error, "listing leases failed");
                self.status.send_modify(|s| s.store_reachable = false);
                return Ok(());
            }
        };
        self.status.send_modify(|s| s.store_reachable = true);
        leases.retain(|l| !is_coordination_key(&l.key));
        state.observer.update(&leases, Instant::now());
        if Instant::now() >= state.next_sync {
            match self.sync_shards(&leases, listed_at, &state.observer).await {
                Ok(changed) => {
                    state.synced_once = true;
                    state.next_sync = Instant::now() + self.config.shard_sync_interval;
                    if changed {
                        match self.store.list().await {
                            Ok(mut fresh) => {
                                fresh.retain(|l| !is_coordination_key(&l.key));
                                state.observer.update(&fresh, Instant::now());
                                leases = fresh;
                            }
                            Err(error) => tracing::warn!(%error, "listing leases failed"),
                        }
                    }
                }
                Err(error) => {
                    let backend = match &error {
                        Error::Source(e) | Error::Store(e) => Some(e),
                        _ => None,
                    };
                    // A stream that does not exist at start-up is a configuration error: say
                    // so instead of retrying forever. Later, keep going with what we hold.
                    if !state.synced_once && backend.is_some_and(|e| e.kind() == ErrorKind::Fatal) {
                        return Err(error);
                    }
                    tracing::warn!(error = ?backend, "shard sync failed; retrying next cycle");
                    state.next_sync = Instant::now() + self.config.taker_interval;
                }
            }
        }

        let now = Instant::now();
        let by_key: BTreeMap<&ShardId, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        let lineage = Lineage::new(&leases);
        let candidates: Vec<Candidate> = leases
            .iter()
            .filter(|l| lineage.is_ready(l))
            .map(|l| Candidate {
                key: l.key.clone(),
                holder: self.holder(l, state, now),
                handoff_to: l.handoff_to.clone(),
            })
            .collect();

        self.grant_handoffs(state, &candidates, &by_key).await;

        let limits = Limits {
            max_leases: self.config.max_leases,
            max_steal: self.config.max_leases_to_steal,
        };
        let plan = taker::plan(&self.id, &candidates, limits);
        for key in &plan.take {
            let Some(observed) = by_key.get(key) else {
                continue;
            };
            let started = Instant::now();
            match self.store.take(observed, &self.id).await {
                Ok(lease) => {
                    let from = match &observed.owner {
                        None => "unowned",
                        Some(o) if o == &self.id => "handoff",
                        Some(_) => "expired",
                    };
                    tracing::info!(shard = %key, from = ?observed.owner, "lease taken");
                    ::metrics::counter!(metrics::LEASES_TAKEN, "from" => from).increment(1);
                    state.spawn(self, ctx, lease, started);
                }
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    tracing::debug!(shard = %key, "lease taken by someone else first");
                }
                Err(error) => tracing::warn!(shard = %key, %error, "taking lease failed"),
            }
        }
        for key in &plan.request_handoff {
            let Some(observed) = by_key.get(key) else {
                continue;
            };
            match self.store.request_handoff(observed, Some(&self.id)).await {
                Ok(()) => {
                    tracing::info!(shard = %key, from = ?observed.owner, "handoff requested");
                    ::metrics::counter!(metrics::LEASES_STOLEN).increment(1);
                }
                Err(error) => tracing::debug!(shard = %key, %error, "handoff request failed"),
            }
        }
        self.publish(state);
        Ok(())
    }

    fn holder(&self, lease: &Lease, state: &Coordinator, now: Instant) -> Holder {
        if state.held.contains_key(&lease.key) {
            return Holder::Me;
        }
        match &lease.owner {
            None => Holder::Unowned,
            Some(owner) if owner == &self.id => Holder::Adoptable,
            Some(owner) => {
                let idle = state.observer.idle(lease, now);
                if idle >= self.config.failover_time {
                    Holder::Expired { idle }
                } else {
                    Holder::Other(owner.clone())
                }
            }
        }
    }

    /// Starts handoffs other workers asked for while this worker stays at or above its lower
    /// fair share, and declines the others (clears the request) so that a request from a
    /// worker that has gone away, or one the fleet no longer needs, does not linger.
    async fn grant_handoffs(
        &self,
        state: &Coordinator,
        candidates: &[Candidate],
        by_key: &BTreeMap<&ShardId, &Lease>,
    ) {
        let in_progress = state
            .held
            .values()
            .filter(|h| h.control.is_handing_off())
            .count();
        let mut grant = taker::handoffs_to_grant(&self.id, candidates, in_progress);
        for c in candidates {
            let (Holder::Me, Some(to)) = (&c.holder, &c.handoff_to) else {
                continue;
            };
            let Some(held) = state.held.get(&c.key) else {
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
                if let Err(error) = self.store.request_handoff(row, None).await {
                    tracing::debug!(shard = %c.key, %error, "declining handoff failed");
                }
            }
        }
    }

    /// Lists shards and creates or cleans up leases. True if anything was written.
    ///
    /// Creating a lease from an old view could bring back a parent that was processed and
    /// cleaned up meanwhile, so creation stops once the view of the lease table (read at
    /// `listed_at`) is older than half the failover time, and a finished parent is deleted
    /// only after it stood still for `lease_cleanup_delay`, far longer than that.
    async fn sync_shards(
        &self,
        leases: &[Lease],
        listed_at: Instant,
        observer: &Observer,
    ) -> Result<bool, Error> {
        let shards = self.source.list_shards().await.map_err(Error::Source)?;
        let plan = sync::plan(&shards, leases, &self.config.initial_position);
        let lineage = Lineage::new(leases);
        let mut changed = false;
        for lease in &plan.create {
            if listed_at.elapsed() > self.config.failover_time / 2 {
                tracing::debug!("shard sync took too long; creating the rest next time");
                return Ok(changed);
            }
            // In order, stopping at the first failure: a child never exists without its parents.
            if self.store.create(lease).await.map_err(Error::Store)? {
                tracing::info!(shard = %lease.key, checkpoint = %lease.checkpoint, "lease created");
                changed = true;
            }
        }
        let now = Instant::now();
        let due = plan.delete.iter().filter(|l| {
            lineage.is_stale(l) || observer.idle(l, now) >= self.config.lease_cleanup_delay
        });
        for lease in due {
            match self.store.delete(lease).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "finished lease cleaned up");
                    changed = true;
                }
                Err(error) => tracing::debug!(shard = %lease.key, %error, "cleanup failed"),
            }
        }
        Ok(changed)
    }

    fn publish(&self, state: &Coordinator) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(metrics::LEASES_HELD).set(state.held.len() as f64);
        let held: Vec<ShardId> = state.held.keys().cloned().collect();
        self.status.send_if_modified(|s| {
            let changed = s.held != held;
            s.held = held;
            changed
        });
    }
}

struct Coordinator {
    held: BTreeMap<ShardId, Held>,
    tasks: JoinSet<Exit>,
    task_keys: BTreeMap<tokio::task::Id, ShardId>,
    observer: Observer,
    next_sync: Instant,
    /// Whether a shard sync has succeeded since start.
    synced_once: bool,
}

impl Coordinator {
    fn spawn<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        worker: &Worker<S, L, F>,
        ctx: &Arc<ShardContext<S, F>>,
        lease: Lease,
        started: Instant,
    ) {
        let key = lease.key.clone();
        let tenure = Arc::new(Tenure::new(
            lease,
            worker.id.clone(),
            worker.store.clone(),
            worker.config.failover_time,
            started,
        ));
        let control = Arc::new(Control::new(worker.handle.graceful.child_token()));
        let task = shard_consumer::run(ctx.clone(), tenure.clone(), control.clone())
            .instrument(shard_consumer::span(&key, &worker.id));
        let handle = self.tasks.spawn(task);
        self.task_keys.insert(handle.id(), key.clone());
        self.held.insert(key, Held { tenure, control });
    }

    /// Forgets a finished shard task; returns why it ended.
    fn on_exit(
        &mut self,
        joined: Result<(tokio::task::Id, Exit), tokio::task::JoinError>,
    ) -> Option<Exit> {
        let (id, exit) = match joined {
            Ok((id, exit)) => (id, Some(exit)),
            Err(error) => {
                // Shard tasks catch processor panics: this is an abort, or a bug of ours.
                tracing::error!(%error, "shard task failed");
                (error.id(), None)
            }
        };
        if let Some(key) = self.task_keys.remove(&id) {
            tracing::debug!(shard = %key, ?exit, "shard task ended");
            if let Some(held) = self.held.remove(&key) {
                held.tenure.mark_lost();
            }
        }
        exit
    }
}
