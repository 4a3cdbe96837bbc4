//! The worker: one coordinator loop plus one task per held lease.
//!
//! - this file: [`Worker`], its [`Status`], the loop and shutdown. `Worker` is wiring: what it
//!   does lives on its parts, which each function borrows as it needs them;
//! - `table`: this worker at the lease table (id, configuration, store), lent to every part
//!   that reads or writes it;
//! - `startup`: the lease table and stream consumer made usable;
//! - `cycle`: one taker cycle, by coordination mode and role, over the state the loop owns
//!   (`shards`: the shard tasks; `view`: the last read of the table; `liveness`: heartbeats;
//!   `problems`; `roles`: leader and standby);
//! - `report`: what the worker publishes in [`Status`] and metrics;
//! - `shard_consumer`: one shard's task, from reads to processor to checkpoints.

mod builder;
mod cycle;
mod liveness;
mod problems;
mod report;
mod roles;
mod shard_consumer;
mod shards;
mod shutdown;
mod startup;
mod table;
mod view;

pub use self::builder::WorkerBuilder;
pub use self::problems::{Problem, ProblemKind};
pub use self::shutdown::{ShutdownHandle, Signals};

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior, sleep_until};
use tracing::Instrument;

use self::cycle::{Coordinator, Mode, Wiring};
use self::report::Report;
use self::shard_consumer::{Exit, ShardContext};
use self::table::Table;
use crate::config::WorkerConfig;
use crate::error::{ConfigError, Error};
use crate::failure::DeadLetters;
use crate::lease::LeaseStore;
use crate::outputs::Sink;
use crate::processor::ProcessorFactory;
use crate::singleton::is_coordination_key;
use crate::source::ShardSource;
use crate::task::bounded;
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
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Shards this worker knows to be read by nobody or to make no progress (stalled,
    /// failing), and rows it cannot read: what an operator must fix (see [`ProblemKind`]). Problems about the whole fleet (unleased and
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
    /// The worker leading the fleet (`Coordination::Leader`), as this worker last saw its
    /// row; `None` under `Coordination::EveryWorker` or while none is known.
    pub leader: Option<WorkerId>,
    /// Whether this worker leads the fleet (`Coordination::Leader`) as of its last taker
    /// cycle: it syncs shards, assigns and balances. At most one worker does, but for a
    /// deposed leader's last cycle (it steps down within a taker interval of its row being
    /// taken, deleted or recreated; see `docs/operations.md`).
    pub leading: bool,
    /// Whether this worker was asked to drain (`kcl-admin release`), as its last read of
    /// the whole table showed: it takes nothing and hands over what it holds.
    pub draining: bool,
    /// Each held shard, for an operator: checkpoint, lag, last progress.
    pub shards: Vec<ShardStatus>,
    /// The fleet's backlog and the workers it needs ([`FleetSignals`](crate::FleetSignals)):
    /// the leader's own figures on the leader (and on every worker under
    /// `Coordination::EveryWorker`); on the others, what the leader last published
    /// ([`Autoscaling::publish_interval`](crate::Autoscaling::publish_interval)), read every
    /// publish interval. `None` until known.
    pub fleet: Option<crate::FleetSignals>,
}

/// One held shard in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The shard (its lease key).
    pub shard: ShardId,
    /// The lease's checkpoint, as this worker last wrote or read it.
    pub checkpoint: Option<crate::types::Checkpoint>,
    /// How far behind the stream's tip the shard's last read was (`millisBehindLatest`).
    pub millis_behind_latest: Option<u64>,
    /// When the shard last progressed (its checkpoint moved, or a batch was processed
    /// without an error); `None` if it has not in this tenure.
    pub last_progress: Option<Instant>,
    /// What the failure policy did on the shard (see [`failure`](crate::failure)).
    pub failures: crate::failure::RecordFailures,
}

/// Consumes a stream as one member of a fleet.
///
/// Every `taker_interval` the coordinator reads the lease table once and, from that one read,
/// syncs shards to leases when due, grants handoffs other workers asked for, adopts leases
/// handed to it, takes available ones and asks loaded workers for more (see `cycle`).
/// It owns all of that state; shard tasks own their processors and their leases' writes.
/// Under [`Coordination::Leader`](crate::Coordination::Leader) only the leader and the
/// standby read the whole table; what each worker does then depends on its role (see
/// `cycle` and `roles`); under [`Liveness::Heartbeat`](crate::Liveness::Heartbeat) the worker's
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
    /// This worker at the lease table: its id, configuration and store.
    table: Table<L>,
    source: Arc<S>,
    factory: Arc<F>,
    handle: ShutdownHandle,
    report: Report,
    /// Where given-up records go ([`WorkerBuilder::dead_letters`]).
    dead_letters: Option<DeadLetters>,
    /// The sink that keeps shards' positions ([`WorkerBuilder::positions`]).
    positions: Option<Sink>,
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
        &self.table.me
    }

    /// A handle that stops [`run`](Self::run) from elsewhere (a signal handler).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Follows the worker's [`Status`].
    pub fn status(&self) -> watch::Receiver<Status> {
        self.report.subscribe()
    }

    /// Runs until shut down. Returns an error only for failures retrying cannot fix: the
    /// lease table or the stream is missing or unusable. (A shard that cannot be read is a
    /// problem in [`Status::problems`], not an error: the other shards go on.)
    pub async fn run(self) -> Result<(), Error> {
        let span = tracing::info_span!("worker", worker.id = %self.table.me);
        let result = self.run_inner().instrument(span).await;
        // Whatever ended the run (an error too), tasks tied to the worker's shutdown stop.
        self.handle.graceful.cancel();
        self.report.stopped();
        result
    }

    async fn run_inner(&self) -> Result<(), Error> {
        // Every series is there from the start: help texts, counters at zero.
        crate::metrics::describe();
        crate::metrics::refresh_worker_series();
        crate::lease::usage::refresh_series();
        ::metrics::gauge!(crate::metrics::LEASES_HELD).set(0.0);
        let mut beat = tokio::time::interval(self.table.config.taker_interval);
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let Some(table) = self.ensure_table(&mut beat).await? else {
            return Ok(());
        };
        let Some(consumer) = self.ensure_consumer(&mut beat).await? else {
            return Ok(());
        };
        if self.ensure_sink(&mut beat).await?.is_none() {
            return Ok(());
        }
        self.report.phase(Phase::Running);
        self.log_start(table);
        self.undrain().await;
        let ctx = Arc::new(
            ShardContext::new(
                self.source.clone(),
                self.factory.clone(),
                self.table.config.clone(),
                consumer,
            )
            .dead_letters(self.dead_letters.clone())
            .positions(self.positions.clone())
            .drain_on(self.handle.release.clone()),
        );
        // What this worker renews anyway, which carries its roles (see `roles`).
        let carriers = Arc::default();
        let mut state = Coordinator::new(self.handle.graceful.clone(), Arc::clone(&carriers));
        let mut mode = Mode::start(
            &self.table.me,
            self.table.store.clone(),
            &self.table.config,
            &carriers,
        );
        let outcome = self
            .coordinate(&mut state, &mut mode, &ctx, &mut beat)
            .await;
        self.stop(state, mode, &mut beat).await;
        outcome
    }

    /// The coordinator loop, until shutdown or a failure retrying cannot fix.
    async fn coordinate(
        &self,
        state: &mut Coordinator,
        mode: &mut Mode,
        ctx: &Arc<ShardContext<S, F>>,
        beat: &mut Interval,
    ) -> Result<(), Error> {
        let wiring = Wiring {
            table: &self.table,
            report: &self.report,
            ctx,
        };
        let mut next_cycle = Instant::now();
        loop {
            if Instant::now() >= next_cycle {
                // Boxed: a cycle's backend calls make a large future, allocated once a cycle.
                let cycle = Box::pin(cycle::cycle(&wiring, state, mode));
                match self.interruptible(beat, cycle).await {
                    None => return Ok(()),
                    Some(Err(error)) => {
                        tracing::error!(%error, "stopping: the stream or lease table is unusable");
                        return Err(error);
                    }
                    Some(Ok(())) => {}
                }
                next_cycle = Instant::now() + self.table.config.taker_interval;
            }
            tokio::select! {
                biased;
                () = self.handle.graceful.cancelled() => return Ok(()),
                Some((shard, exit)) = state.shards.next_exit(), if state.shards.has_tasks() => {
                    state.publish(&self.table, &self.report);
                    match exit {
                        Some(Exit::ShardEnd) => {
                            // Children may be ready: sync and plan now rather than a cycle later.
                            state.sync.now();
                            next_cycle = Instant::now();
                        }
                        Some(Exit::ReleaseFailed)
                            if self.table.config.liveness == crate::Liveness::Heartbeat =>
                        {
                            state.heartbeat.release_later([shard]);
                        }
                        _ => {}
                    }
                }
                _ = beat.tick() => self.beat(),
                () = mode.promoted() => next_cycle = Instant::now(),
                () = sleep_until(next_cycle) => {}
            }
        }
    }

    /// Hands leases back: waits for shard tasks until `shutdown_timeout` (or `force`), stops
    /// what is left, then releases leases handed to this worker after its last cycle.
    async fn stop(&self, mut state: Coordinator, mode: Mode, beat: &mut Interval) {
        self.handle.graceful.cancel();
        self.report.shutting_down();
        let kept = self.table.config.restart_grace.is_some() && !self.handle.is_draining();
        tracing::info!(
            leases = state.shards.len(),
            "{}",
            if kept {
                "shutting down: keeping leases for this worker's restart (restart_grace)"
            } else {
                "shutting down: handing leases back"
            }
        );
        let deadline = Instant::now() + self.table.config.shutdown_timeout;
        // The coordination rows go back while the shards stop, so that a successor leads
        // while this worker hands its leases back; within the same deadline.
        let give_back = mode.stop(
            self.table
                .config
                .call_timeout
                .min(self.table.config.shutdown_timeout),
        );
        tokio::pin!(give_back);
        let mut roles_stopped = false;
        loop {
            tokio::select! {
                biased;
                () = self.handle.force.cancelled() => break,
                () = sleep_until(deadline) => break,
                () = &mut give_back, if !roles_stopped => roles_stopped = true,
                _ = state.shards.next_exit(), if state.shards.has_tasks() => {
                    state.publish(&self.table, &self.report);
                }
                () = std::future::ready(()), if !state.shards.has_tasks() && roles_stopped => break,
                _ = beat.tick() => self.beat(),
            }
        }
        if state.shards.has_tasks() {
            let why = if self.handle.force.is_cancelled() {
                "shutdown forced"
            } else {
                "shutdown deadline reached"
            };
            tracing::warn!(
                shards = state.shards.tasks(),
                "{why}: stopping remaining shards without releasing their leases"
            );
            state.shards.abandon();
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
        state.heartbeat.end().await;
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
        crate::lease::usage::refresh_series();
        self.report.beat();
    }

    /// Releases leases that name this worker but that it does not hold: handed over to it by
    /// another worker after its last cycle (a shard's lease, or the standby row the leader
    /// hands on). Without this they would wait for expiry. Leases its shard tasks kept for
    /// its restart (`restart_grace`) stay its own, and so do singleton rows (their holders
    /// stop on their own).
    async fn release_unheld(&self) {
        let limit = self.table.config.call_timeout;
        let Ok(leases) = bounded(limit, "list", self.table.store.list()).await else {
            return;
        };
        for lease in leases.iter().filter(|l| {
            l.is_owned_by(&self.table.me)
                && (!is_coordination_key(&l.key) || roles::is_role_key(&l.key))
                && l.restart_grace.is_none()
        }) {
            match bounded(limit, "release", self.table.store.release(lease)).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "released a lease handed over during shutdown");
                }
                Err(error) => tracing::debug!(shard = %lease.key, %error, "release failed"),
            }
        }
    }
}
