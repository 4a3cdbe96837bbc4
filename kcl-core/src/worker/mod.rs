//! The worker: one coordinator loop plus one task per held lease.

mod builder;
mod coordinator;
mod led;
mod liveness;
mod prefetch;
mod problems;
mod roles;
mod shard_consumer;
mod shutdown;

pub use self::builder::WorkerBuilder;
pub use self::problems::{Problem, ProblemKind};
pub use self::shutdown::{ShutdownHandle, Signals};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior, sleep, sleep_until};
use tracing::Instrument;

use self::coordinator::Coordinator;
use self::shard_consumer::{Exit, ShardContext};
use crate::config::WorkerConfig;
use crate::coordination::is_coordination_key;
use crate::error::{BackendError, ConfigError, Error};
use crate::lease::{LeaseStore, TableFeatures};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::{ConsumerId, ShardId, WorkerId};

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
#[doc(alias = "WorkerStateChangeListener")]
pub struct Status {
    /// Where the worker is.
    pub phase: Phase,
    /// Leases with a running shard task.
    pub held: Vec<ShardId>,
    /// Whether the last read of the lease table succeeded.
    pub store_reachable: bool,
    /// Why the worker cannot coordinate right now (the lease table or the stream failing,
    /// with the cause and, for credentials or endpoints, a hint), until it can again; else a
    /// summary of [`problems`](Self::problems), if there are any.
    pub problem: Option<String>,
    /// Shards this worker knows to be read by nobody, and rows it cannot read: what an
    /// operator must fix (see [`ProblemKind`]). Problems about the whole fleet (unleased and
    /// unowned shards) are reported by the worker that finds them: the one that syncs shards,
    /// the leader.
    pub problems: Vec<Problem>,
    /// The coordination part of `problem`.
    coordination: Option<String>,
    /// When the coordinator loop last went round: at least once per `taker_interval` while it
    /// runs, even while a cycle waits on a slow backend. A liveness probe fails when this is
    /// old: the loop itself is stuck (a blocked thread, a bug), and a restart is the cure.
    pub heartbeat: Option<Instant>,
    /// When the last taker cycle completed with a successful read of the lease table. A
    /// readiness probe fails when this is old: the worker cannot coordinate with its fleet.
    pub last_cycle: Option<Instant>,
}

/// Consumes a stream as one member of a fleet.
///
/// Every `taker_interval` the coordinator reads the lease table once and, from that one read,
/// syncs shards to leases when due, grants handoffs other workers asked for, adopts leases
/// handed to it, takes available ones and asks loaded workers for more (see `coordinator`).
/// It owns all of that state; shard tasks own their processors and their leases' writes.
/// Under [`Coordination::Leader`](crate::Coordination::Leader) only the leader and the
/// standby read the whole table; what each worker does then depends on its role (see `led`
/// and `roles`); under [`Liveness::Heartbeat`](crate::Liveness::Heartbeat) the worker's
/// leases live on one heartbeat row (see `liveness`).
///
/// Nothing the backends do can hang the worker: every call has a deadline
/// ([`WorkerConfig::call_timeout`]), a cycle is abandoned as soon as shutdown is asked for,
/// and [`Status`] carries a heartbeat of the loop and the time of its last complete cycle, for
/// liveness and readiness probes. Shutdown cancels one root token: shard tasks let their
/// processors checkpoint, release their leases, and `run` returns — or, after
/// `shutdown_timeout` (or at once on [`ShutdownHandle::force`]), stops what is left.
#[derive(Debug)]
#[doc(alias = "Scheduler")]
pub struct Worker<S, L, F> {
    id: WorkerId,
    config: Arc<WorkerConfig>,
    source: Arc<S>,
    store: Arc<L>,
    factory: Arc<F>,
    handle: ShutdownHandle,
    status: watch::Sender<Status>,
}

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// A worker named `id` (its `leaseOwner`; unique in the fleet), after validating `config`.
    /// [`Worker::builder`] does the same with defaults and infers a closure factory's types.
    pub fn new(
        id: impl Into<WorkerId>,
        config: WorkerConfig,
        source: S,
        store: L,
        factory: F,
    ) -> Result<Self, ConfigError> {
        Worker::builder(source, store)
            .id(id)
            .config(config)
            .build_with(factory)
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

    /// Runs until shut down. Returns an error only for failures retrying cannot fix: the
    /// lease table or the stream is missing or unusable. (A shard that cannot be read is a
    /// problem in [`Status::problems`], not an error: the other shards go on.)
    pub async fn run(self) -> Result<(), Error> {
        let span = tracing::info_span!("worker", worker.id = %self.id);
        let result = self.run_inner().instrument(span).await;
        // Whatever ended the run (an error too), tasks tied to the worker's shutdown stop.
        self.handle.graceful.cancel();
        self.status.send_modify(|s| {
            s.phase = Phase::Stopped;
            s.held.clear();
        });
        result
    }

    async fn run_inner(&self) -> Result<(), Error> {
        // Every series is there from the start: help texts, counters at zero.
        crate::metrics::describe();
        crate::metrics::refresh_worker_series();
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(0.0);
        let mut beat = tokio::time::interval(self.config.taker_interval);
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let Some(table) = self.ensure_table(&mut beat).await? else {
            return Ok(());
        };
        let Some(consumer) = self.ensure_consumer(&mut beat).await? else {
            return Ok(());
        };
        self.status.send_modify(|s| s.phase = Phase::Running);
        self.log_start(table);
        self.undrain().await;
        let ctx = Arc::new(ShardContext::new(
            self.source.clone(),
            self.factory.clone(),
            self.config.clone(),
            consumer,
        ));
        let mut state = Coordinator::new();
        if self.config.coordination == crate::Coordination::Leader {
            state.roles = roles::Roles::start(&self.id, self.store.clone(), &self.config);
        }
        let outcome = self.coordinate(&mut state, &ctx, &mut beat).await;
        self.stop(state, &mut beat).await;
        outcome
    }

    /// The coordinator loop, until shutdown or a failure retrying cannot fix.
    async fn coordinate(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        beat: &mut Interval,
    ) -> Result<(), Error> {
        let mut next_cycle = Instant::now();
        loop {
            if Instant::now() >= next_cycle {
                // Boxed: a cycle's backend calls make a large future, allocated once a cycle.
                match self
                    .interruptible(beat, Box::pin(self.cycle(state, ctx)))
                    .await
                {
                    None => return Ok(()),
                    Some(Err(error)) => {
                        tracing::error!(%error, "stopping: the stream or lease table is unusable");
                        return Err(error);
                    }
                    Some(Ok(())) => {}
                }
                next_cycle = Instant::now() + self.config.taker_interval;
            }
            tokio::select! {
                biased;
                () = self.handle.graceful.cancelled() => return Ok(()),
                Some(joined) = state.tasks.join_next_with_id(), if !state.tasks.is_empty() => {
                    let exited = state.on_exit(joined);
                    self.publish(state);
                    match exited {
                        Some((_, Exit::ShardEnd)) => {
                            // Children may be ready: sync and plan now rather than a cycle later.
                            state.next_sync = Instant::now();
                            next_cycle = Instant::now();
                        }
                        Some((shard, Exit::ReleaseFailed))
                            if self.config.liveness == crate::Liveness::Heartbeat =>
                        {
                            state.unreleased.push(shard);
                        }
                        _ => {}
                    }
                }
                _ = beat.tick() => self.beat(),
                () = state.roles.promoted() => next_cycle = Instant::now(),
                () = sleep_until(next_cycle) => {}
            }
        }
    }

    /// Hands leases back: waits for shard tasks until `shutdown_timeout` (or `force`), stops
    /// what is left, then releases leases handed to this worker after its last cycle.
    async fn stop(&self, mut state: Coordinator, beat: &mut Interval) {
        self.handle.graceful.cancel();
        self.status.send_modify(|s| s.phase = Phase::ShuttingDown);
        tracing::info!(
            leases = state.held.len(),
            "shutting down: handing leases back"
        );
        let deadline = Instant::now() + self.config.shutdown_timeout;
        // The coordination rows go back while the shards stop, so that a successor leads
        // while this worker hands its leases back; within the same deadline.
        let roles = std::mem::replace(&mut state.roles, roles::Roles::none());
        let give_back = roles.stop(self.config.call_timeout.min(self.config.shutdown_timeout));
        tokio::pin!(give_back);
        let mut roles_stopped = false;
        loop {
            tokio::select! {
                biased;
                () = self.handle.force.cancelled() => break,
                () = sleep_until(deadline) => break,
                () = &mut give_back, if !roles_stopped => roles_stopped = true,
                joined = state.tasks.join_next_with_id(), if !state.tasks.is_empty() => {
                    if let Some(joined) = joined {
                        state.on_exit(joined);
                        self.publish(&mut state);
                    }
                }
                () = std::future::ready(()), if state.tasks.is_empty() && roles_stopped => break,
                _ = beat.tick() => self.beat(),
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
            // Aborted tasks stop at their next `.await`; a processor blocking its thread
            // would only then, so nobody waits for them.
            state.tasks.abort_all();
            state.tasks.detach_all();
        } else if !self.handle.force.is_cancelled() {
            tokio::select! {
                biased;
                () = self.handle.force.cancelled() => {}
                () = sleep_until(deadline) => {
                    tracing::warn!("shutdown deadline reached while releasing leases handed to us");
                }
                () = Box::pin(self.release_unheld()) => {}
            }
        }
        // Last: the heartbeat keeps the leases valid until they are handed back.
        self.end_heartbeat(&mut state).await;
        tracing::info!("worker stopped");
    }

    /// Runs `work` until it ends or shutdown is asked for (then drops it and returns `None`),
    /// keeping the heartbeat going meanwhile.
    async fn interruptible<T>(
        &self,
        beat: &mut Interval,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                () = self.handle.graceful.cancelled() => return None,
                result = &mut work => return Some(result),
                _ = beat.tick() => self.beat(),
            }
        }
    }

    /// The loop went round: says so in `Status`, and keeps the worker's metric series fresh
    /// (every `taker_interval`, even while a cycle waits on a slow backend).
    fn beat(&self) {
        crate::metrics::refresh_worker_series();
        self.status
            .send_modify(|s| s.heartbeat = Some(Instant::now()));
    }

    /// Releases leases that name this worker but that it does not hold: handed over to it by
    /// another worker after its last cycle. Without this they would wait for expiry.
    async fn release_unheld(&self) {
        let limit = self.config.call_timeout;
        let Ok(leases) = bounded(limit, "list", self.store.list()).await else {
            return;
        };
        for lease in leases
            .iter()
            .filter(|l| l.is_owned_by(&self.id) && !is_coordination_key(&l.key))
        {
            match bounded(limit, "release", self.store.release(lease)).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "released a lease handed over during shutdown");
                }
                Err(error) => tracing::debug!(shard = %lease.key, %error, "release failed"),
            }
        }
    }

    /// Creates the lease table with what the coordination uses of it, retrying transient
    /// failures. Returns the features the table serves; `None` if shut down meanwhile.
    async fn ensure_table(&self, beat: &mut Interval) -> Result<Option<TableFeatures>, Error> {
        let wanted = self.config.coordination.table_features();
        // Not bounded by the call timeout: a new table may take minutes to become usable.
        let ready = self.until_ready(beat, "the lease table is not usable yet", || {
            Box::pin(self.store.ensure_table(wanted))
        });
        ready.await.map_err(Error::Store)
    }

    /// Says once how this worker runs, and what it costs more than it should when the table
    /// lacks a feature the coordination uses.
    fn log_start(&self, table: TableFeatures) {
        let config = &self.config;
        tracing::info!(
            coordination = ?config.coordination,
            liveness = ?config.liveness,
            retrieval = ?config.retrieval,
            failover_time = ?config.failover_time,
            table.features = %table,
            "worker started"
        );
        let wanted = config.coordination.table_features();
        if wanted.owner_index && !table.owner_index {
            tracing::warn!(
                "the lease table has no owner index: this worker reads the whole table to find \
                 its leases (every half failover time while it follows), which costs read units \
                 per lease; let the store add the index, or add it where the table is managed"
            );
        }
        if wanted.change_feed && !table.change_feed {
            tracing::warn!(
                "the lease table has no change feed: as leader or standby this worker reads the \
                 whole table every taker interval; let the store enable the table's stream, or \
                 enable it where the table is managed"
            );
        }
    }

    /// Under [`Retrieval::FanOut`](crate::Retrieval::FanOut), registers the stream consumer
    /// (or finds it) and waits until it can subscribe, retrying transient failures. `Ok(None)`
    /// if shut down meanwhile; `Ok(Some(None))` when polling.
    async fn ensure_consumer(
        &self,
        beat: &mut Interval,
    ) -> Result<Option<Option<ConsumerId>>, Error> {
        let crate::Retrieval::FanOut { consumer_name } = &self.config.retrieval else {
            return Ok(Some(None));
        };
        // Not bounded by the call timeout either: registering takes seconds on Kinesis.
        let ready = self.until_ready(beat, "the stream consumer is not usable yet", || {
            Box::pin(self.source.register_consumer(consumer_name))
        });
        let consumer = ready.await.map_err(Error::Source)?;
        if let Some(id) = &consumer {
            tracing::info!(consumer = %id, "reading with enhanced fan-out");
        }
        Ok(consumer.map(Some))
    }

    /// Calls `op` until it succeeds or fails for good, with backoff between transient
    /// failures (kept in [`Status::problem`] meanwhile). `Ok(None)` if shut down meanwhile.
    async fn until_ready<'a, T>(
        &'a self,
        beat: &mut Interval,
        what: &str,
        mut op: impl FnMut() -> BoxFuture<'a, Result<T, BackendError>>,
    ) -> Result<Option<T>, BackendError> {
        let mut delays = self.backoff().build();
        loop {
            match self.interruptible(beat, op()).await {
                None => return Ok(None),
                Some(Ok(value)) => {
                    self.solved();
                    return Ok(Some(value));
                }
                Some(Err(e)) if e.kind().is_transient() => self.problem(what, &e),
                Some(Err(e)) => return Err(e),
            }
            let pause = sleep(delays.next().unwrap_or(self.config.max_backoff));
            if self.interruptible(beat, pause).await.is_none() {
                return Ok(None);
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

    /// A failure that retrying may fix. The first of a kind is logged at WARN, and it is kept
    /// in [`Status::problem`]; repeats of the same are logged at DEBUG only, so that a worker
    /// without credentials says so once instead of every few seconds.
    fn problem(&self, what: &str, error: &(dyn std::error::Error + 'static)) {
        let text = format!("{what}: {}", crate::error::error_chain(error));
        if self.status.borrow().coordination.as_ref() == Some(&text) {
            tracing::debug!(problem = %text, "still failing");
            return;
        }
        tracing::warn!(problem = %text, "retrying quietly while this lasts");
        self.status.send_modify(|s| {
            s.coordination = Some(text);
            s.problem = problems::summary(s.coordination.as_deref(), &s.problems);
        });
    }

    /// Calls to the lease table succeed again.
    fn solved(&self) {
        let mut solved = None;
        self.status.send_if_modified(|s| {
            solved = s.coordination.take();
            s.problem = problems::summary(None, &s.problems);
            solved.is_some()
        });
        if let Some(problem) = solved {
            tracing::info!(%problem, "recovered");
        }
    }

    /// A shard task started: `Status.held` says so at once, not at the end of the cycle.
    fn publish_taken(&self, key: &ShardId, held: usize) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(held as f64);
        self.status.send_modify(|s| {
            if let Err(at) = s.held.binary_search(key) {
                s.held.insert(at, key.clone());
            }
        });
    }

    /// A worker that starts takes work again: deletes the row that asked it to drain
    /// (`kcl-admin release`, before maintenance), if there is one. Best effort: a row left
    /// behind keeps this worker idle, and says so in the log.
    async fn undrain(&self) {
        let key = crate::coordination::drain_key(&self.id);
        let limit = self.config.call_timeout;
        let Ok(Some(row)) = bounded(limit, "get", self.store.get(&key)).await else {
            return;
        };
        if let Err(error) = bounded(limit, "delete", self.store.delete(&row)).await {
            let what = "this worker was asked to drain and the request could not be removed: \
                        it takes no work until it is";
            tracing::warn!(%error, row = %key, "{what}");
            return;
        }
        tracing::info!("started again after a drain (kcl-admin release): taking work");
    }

    /// Publishes the held leases and the known problems (see `problems`) in [`Status`] and
    /// their gauges.
    fn publish(&self, state: &mut Coordinator) {
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(state.held.len() as f64);
        let held: Vec<ShardId> = state.held.keys().cloned().collect();
        let failing = state.held.iter().filter_map(|(key, held)| {
            let why = held.control.read_failing()?;
            Some((key.to_string(), why))
        });
        let failing = failing.collect();
        state
            .problems
            .replace(problems::ProblemKind::ReadFailing, failing);
        let mut stalled = std::collections::BTreeMap::new();
        for (key, held) in &state.held {
            let age = held
                .control
                .uncheckpointed_since()
                .map_or(Duration::ZERO, |since| since.elapsed());
            let shard = key.to_string();
            ::metrics::gauge!(crate::metrics::CHECKPOINT_AGE, "shard" => shard.clone())
                .set(age.as_secs_f64());
            if age >= self.config.stalled_after {
                let why = format!(
                    "delivered records have waited over {:?} for a checkpoint (see \
                     kcl_checkpoint_age_seconds)",
                    self.config.stalled_after
                );
                stalled.insert(shard, why);
            }
        }
        state
            .problems
            .replace(problems::ProblemKind::Stalled, stalled);
        state.problems.refresh();
        let problems = state.problems.list();
        self.status.send_if_modified(|s| {
            let changed = s.held != held || s.problems != problems;
            s.held = held;
            s.problems = problems;
            s.problem = problems::summary(s.coordination.as_deref(), &s.problems);
            changed
        });
    }
}
