//! Singleton tasks and leader election on the lease table, so that an application needs no
//! Redis, ZooKeeper or memcached to run "exactly one of these across the fleet".
//!
//! A [`Singleton`] is a named lease row (key `kcl-coordination/<name>`) taken, renewed and
//! released with the same conditional writes, the same observed-expiry rule and the same
//! local validity bound as shard leases. Every candidate runs [`Singleton::run`]; the one
//! holding the row runs the task, the others watch the row and take over when it is released
//! or expires. They do not all read it every poll: by default two standbys stand in line
//! and read often, the others seldom ([`SingletonConfig::standbys`]; the bounds and costs are
//! in `standby.rs`).
//!
//! **At no instant do two instances run.** The task gets a [`CancellationToken`], cancelled
//! on shutdown or when its lease is at risk (renewals kept failing and less than
//! [`SingletonConfig::stop_timeout`] of its validity is left). It then has `stop_timeout` to
//! return; after that, and at the latest when the lease's local validity runs out (0.9 × the
//! failover time after the start of its last successful write, before any other candidate may
//! take the row), the task's future is dropped at its next `.await`. Work the task spawned
//! elsewhere must stop with the token; a task that blocks its thread cannot be dropped until
//! it yields (use `spawn_blocking` and check the token). The renewer runs as a task of its
//! own, so a busy task does not stop its renewals.
//!
//! Leader election is a singleton whose task is "be the leader until cancelled"; everyone can
//! follow who holds it with [`Singleton::holder`] (to route work to the leader, for example).
//!
//! Workers skip rows under [`COORDINATION_PREFIX`]. A KCL Java worker sharing the table would
//! not: run singletons on a table shared with KCL Java only once the migration is done.
//!
//! ```
//! # #[cfg(feature = "test-util")]
//! # async fn demo() -> Result<(), kcl_core::Error> {
//! use kcl_core::singleton::{Singleton, SingletonConfig};
//! use kcl_core::memory::MemoryLeaseStore;
//! use tokio_util::sync::CancellationToken;
//!
//! let leader = Singleton::new("leader", "worker-1", MemoryLeaseStore::new(), SingletonConfig::default())?;
//! let is_leader = leader.holder(); // watch who leads
//! let shutdown = CancellationToken::new();
//! # shutdown.cancel();
//! leader
//!     .run(shutdown, |lost: CancellationToken| async move {
//!         // Leader-only work here, until `lost` is cancelled.
//!         lost.cancelled().await;
//!     })
//!     .await?;
//! # let _ = is_leader;
//! # Ok(())
//! # }
//! ```

pub(crate) mod carried;
mod config;
mod context;
mod hold;
pub mod messages;
mod periodic;
mod standby;
mod take;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

pub(crate) use self::carried::Carriers;
pub use self::config::{MAX_STANDBYS, SingletonConfig};
pub use self::context::{FencingToken, TaskContext};
pub use self::messages::{Inboxes, Messenger, Refusal, SendError, SingletonHandle};
pub use self::periodic::Period;
pub(crate) use self::take::Sighting;
use crate::error::{BackendError, ConfigError, Error, ErrorKind};
use crate::lease::tenure::Tenure;
use crate::lease::{Lease, LeaseStore, TableFeatures};
use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

pub use crate::lease::keys::{COORDINATION_PREFIX, is_coordination_key};

/// Singleton names the worker uses itself under `Coordination::Leader`.
pub(crate) const RESERVED: [&str; 2] = ["worker-leader", "worker-standby"];

/// Singleton names under this prefix are the workers' heartbeat rows
/// ([`Liveness::Heartbeat`](crate::Liveness::Heartbeat)).
pub(crate) const HEARTBEAT_PREFIX: &str = "worker/";

/// The key of `worker`'s heartbeat row.
pub fn heartbeat_key(worker: &WorkerId) -> ShardId {
    ShardId::new(format!("{COORDINATION_PREFIX}{HEARTBEAT_PREFIX}{worker}"))
}

/// Names under this prefix are drain requests: `kcl-admin release` asks a worker to hand its
/// leases over and take no more until it starts again (see [`admin`](crate::admin)).
pub(crate) const DRAIN_PREFIX: &str = "drain/";

/// The key of the row asking `worker` to drain.
pub(crate) fn drain_key(worker: &WorkerId) -> ShardId {
    ShardId::new(format!("{COORDINATION_PREFIX}{DRAIN_PREFIX}{worker}"))
}

/// The worker that row `key` asks to drain, if it is such a row.
pub(crate) fn drained_by(key: &ShardId) -> Option<WorkerId> {
    let name = key.as_str().strip_prefix(COORDINATION_PREFIX)?;
    name.strip_prefix(DRAIN_PREFIX).map(WorkerId::new)
}

/// True for the leader's and the standby's rows (`Coordination::Leader`): their owners are
/// workers of the fleet.
pub(crate) fn is_worker_row(key: &ShardId) -> bool {
    key.as_str()
        .strip_prefix(COORDINATION_PREFIX)
        .is_some_and(|name| RESERVED.contains(&name))
}

/// The worker whose heartbeat row `key` is, if it is one.
pub(crate) fn heartbeat_of(key: &ShardId) -> Option<WorkerId> {
    let name = key.as_str().strip_prefix(COORDINATION_PREFIX)?;
    name.strip_prefix(HEARTBEAT_PREFIX).map(WorkerId::new)
}

impl<L> std::fmt::Debug for Singleton<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Singleton")
            .field("key", &self.key)
            .field("me", &self.me)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One named task that runs on exactly one candidate at a time. See the module docs.
pub struct Singleton<L> {
    key: ShardId,
    me: WorkerId,
    store: Arc<L>,
    config: SingletonConfig,
    holder: watch::Sender<Option<WorkerId>>,
    /// Whether this candidate has read the row once (the standbys wait for it, so that a
    /// candidate about to hold the row does not first take a standby row).
    polled: watch::Sender<bool>,
    /// The poll interval in force, in milliseconds (the worker's roles change it).
    poll_millis: std::sync::atomic::AtomicU64,
    /// Wakes a candidate sleeping between polls when its interval changes.
    poll_changed: tokio::sync::Notify,
    /// The wall clock that numbers the periods of [`every`](Self::every).
    clock: Clock,
    /// Where the running instance takes messages, if anywhere.
    messenger: Option<Arc<dyn Messenger>>,
    /// The row as this process last read it elsewhere (a worker's standby reads the whole
    /// table anyway): a poll uses a fresh sighting instead of reading the row again.
    sighting: Option<Arc<take::Sighting>>,
    /// For a worker's role rows: the rows that carry this one while it is held (see
    /// `carried`); candidates then read the row cheaply, with its carrier.
    carriers: Option<Arc<Carriers>>,
    /// Wakes a sleeping candidate to poll at once (it was handed the row).
    poked: tokio::sync::Notify,
    /// The next poll reads the row itself: the poke came from a read newer than any
    /// sighting (see [`poke`](Self::poke)).
    read_next: std::sync::atomic::AtomicBool,
    /// The row's tenure while this candidate holds it.
    holding: std::sync::Mutex<Option<Arc<Tenure>>>,
    /// A consistent read of the held row is under way ([`verify`](Self::verify)).
    verifying: Arc<std::sync::atomic::AtomicBool>,
}

/// A wall clock: `Utc::now` unless a test or simulation says otherwise.
pub type Clock = Arc<dyn Fn() -> chrono::DateTime<chrono::Utc> + Send + Sync>;

impl<L: LeaseStore> Singleton<L> {
    /// A candidate named `me` for the singleton `name`.
    pub fn new(
        name: &str,
        me: impl Into<WorkerId>,
        store: L,
        config: SingletonConfig,
    ) -> Result<Self, ConfigError> {
        if RESERVED.contains(&name) {
            return Err(ConfigError {
                key: "name",
                reason: format!("{name:?} is the worker's own (Coordination::Leader)"),
            });
        }
        for (prefix, rows) in [
            (HEARTBEAT_PREFIX, "the workers' heartbeat rows"),
            (DRAIN_PREFIX, "drain requests (`kcl-admin release`)"),
        ] {
            if name.starts_with(prefix) {
                return Err(ConfigError {
                    key: "name",
                    reason: format!("names starting with {prefix:?} are {rows}"),
                });
            }
        }
        Self::named(name, me, store, config)
    }

    /// As [`new`](Self::new), for the worker's own rows too.
    pub(crate) fn named(
        name: &str,
        me: impl Into<WorkerId>,
        store: L,
        config: SingletonConfig,
    ) -> Result<Self, ConfigError> {
        Self::sharing(name, me, Arc::new(store), config)
    }

    /// As [`named`](Self::named), on a store shared with other candidates of this process.
    fn sharing(
        name: &str,
        me: impl Into<WorkerId>,
        store: Arc<L>,
        config: SingletonConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        if name.is_empty() {
            return Err(ConfigError {
                key: "name",
                reason: "must not be empty".into(),
            });
        }
        Ok(Self {
            key: ShardId::new(format!("{COORDINATION_PREFIX}{name}")),
            me: me.into(),
            store,
            poll_millis: std::sync::atomic::AtomicU64::new(
                u64::try_from(config.poll_interval.as_millis()).unwrap_or(u64::MAX),
            ),
            poll_changed: tokio::sync::Notify::new(),
            config,
            holder: watch::Sender::new(None),
            polled: watch::Sender::new(false),
            clock: Arc::new(chrono::Utc::now),
            messenger: None,
            sighting: None,
            carriers: None,
            poked: tokio::sync::Notify::new(),
            read_next: std::sync::atomic::AtomicBool::new(false),
            holding: std::sync::Mutex::new(None),
            verifying: Arc::default(),
        })
    }

    /// The row is carried by one of `carriers` while held (see `carried`).
    pub(crate) fn with_carriers(mut self, carriers: Arc<Carriers>) -> Self {
        self.carriers = Some(carriers);
        self
    }

    /// Polls at once (or as soon as it next waits): the row was handed to this candidate, or
    /// seen free. That poll reads the row itself: what said so is newer than a sighting may
    /// be (a follower's sighting of its role row is from its last read of the whole table,
    /// which may be many seconds old, and would show the row's old holder until it aged out).
    pub(crate) fn poke(&self) {
        if !mutation::on(Mutation::PokeTrustsSighting) {
            self.read_next
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.poked.notify_one();
    }

    /// This process read the row as `row` elsewhere: if it holds the row and the read shows
    /// another owner (or none), the holding ends as soon as a consistent read agrees rather
    /// than at its next write (a carried row is not written while its carrier proves it). The
    /// read may be stale (an older write, at a lower counter; or, for a row deleted and
    /// created again, at a higher one, whose counter started again): [`verify`](Self::verify)
    /// decides.
    pub(crate) fn saw_held(&self, row: &Lease) {
        let Some(tenure) = self.tenure() else {
            return;
        };
        if !row.is_owned_by(&self.me) {
            self.verify(tenure);
        }
    }

    /// This process read the whole table and the row was not in it: if it holds the row,
    /// [`verify`](Self::verify) decides (the read may be stale; the row may be gone).
    pub(crate) fn saw_missing(&self) {
        if let Some(tenure) = self.tenure() {
            self.verify(tenure);
        }
    }

    fn tenure(&self) -> Option<Arc<Tenure>> {
        self.holding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the row consistently, in the background: if it is gone, or names another owner,
    /// the holding ends (deleted by hand, deleted and created again, taken): the row this
    /// holder took is no more, whoever holds one now. A row naming this holder is still its
    /// own (no other process writes this holder's name into it). One read at a time.
    fn verify(&self, tenure: Arc<Tenure>) {
        if mutation::on(Mutation::StepDownIgnored)
            || self
                .verifying
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let (store, key, me) = (self.store.clone(), self.key.clone(), self.me.clone());
        let verifying = self.verifying.clone();
        let limit = self.config.failover_time;
        crate::task::spawn(async move {
            // Bounded, so that a read that hangs cannot keep the next check from running.
            let read = match tokio::time::timeout(limit, store.get(&key)).await {
                Ok(read) => read,
                Err(_) => Err(BackendError::new(ErrorKind::Retryable, "get", "timed out")),
            };
            verifying.store(false, std::sync::atomic::Ordering::Release);
            let gone = match &read {
                Ok(Some(row)) => !row.is_owned_by(&me),
                Ok(None) => true,
                Err(error) => {
                    tracing::debug!(%error, singleton = %key, "reading the row to check it failed");
                    false
                }
            };
            if gone && !tenure.is_lost() {
                let holder = read.ok().flatten().and_then(|r| r.owner);
                tracing::warn!(singleton = %key, ?holder, "the row is gone or another's (deleted, or deleted and created again): giving up");
                tenure.mark_lost();
            }
        });
    }

    /// Gives the running instance an inbox ([`TaskContext::inbox`]) that any process reaches
    /// through a [`SingletonHandle`]: the holder registers it with `messenger` and
    /// advertises `messenger`'s address in the row. See [`messages`] for the guarantee.
    #[must_use]
    pub fn with_messenger(mut self, messenger: Arc<dyn Messenger>) -> Self {
        self.messenger = Some(messenger);
        self
    }

    /// A handle that sends to this singleton wherever it runs, through this candidate's
    /// messenger; `None` without one. `retry` is how often it reads the row again while
    /// ownership moves.
    pub fn handle(&self, retry: std::time::Duration) -> Option<SingletonHandle<Arc<L>>> {
        let messenger = self.messenger.clone()?;
        Some(SingletonHandle::new(
            self.name(),
            self.store.clone(),
            messenger,
            retry,
        ))
    }

    /// The singleton's name.
    pub fn name(&self) -> &str {
        self.key.as_str().trim_start_matches(COORDINATION_PREFIX)
    }

    /// Numbers the periods of [`every`](Self::every) with `clock` instead of the system's
    /// (a test under paused tokio time, a simulation).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Polls use what `sighting` saw of the row while it is fresh (see [`take::Sighting`]).
    pub(crate) fn with_sighting(mut self, sighting: Arc<take::Sighting>) -> Self {
        self.sighting = Some(sighting);
        self
    }

    /// Changes how often this candidate reads the row while it does not hold it (a worker's
    /// leader candidates poll often only while they stand by).
    pub(crate) fn set_poll_interval(&self, value: std::time::Duration) {
        let millis = u64::try_from(value.as_millis()).unwrap_or(u64::MAX);
        let before = self
            .poll_millis
            .swap(millis, std::sync::atomic::Ordering::Relaxed);
        if before != millis {
            // A candidate asked to poll faster should not sleep out the slow interval.
            self.poll_changed.notify_waiters();
        }
    }

    fn poll_interval(&self) -> std::time::Duration {
        let millis = self.poll_millis.load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_millis(millis)
    }

    /// Who holds the singleton, as last seen by this candidate.
    pub fn holder(&self) -> watch::Receiver<Option<WorkerId>> {
        self.holder.subscribe()
    }

    /// Competes for the singleton until `shutdown`, running `task` whenever this candidate
    /// holds it. `task` gets a token cancelled when the lease is lost or on shutdown, and
    /// should return soon after. Returns when `shutdown` is cancelled (releasing the lease
    /// if held), or with an error the store cannot recover from.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, mut task: F) -> Result<(), Error>
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run_with(shutdown, |ctx: TaskContext| task(ctx.cancelled().clone()))
            .await
    }

    /// As [`run`](Self::run), the task getting a [`TaskContext`]: its cancellation token, a
    /// [`FencingToken`] for writes to other systems, and the heartbeat of health mode
    /// ([`SingletonConfig::health_timeout`]).
    pub async fn run_with<F, Fut>(
        &self,
        shutdown: CancellationToken,
        mut task: F,
    ) -> Result<(), Error>
    where
        F: FnMut(TaskContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let ensured = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                ensured = self.store.ensure_table(TableFeatures::NONE) => ensured,
            };
            match ensured {
                Ok(_) => break,
                Err(e) if e.kind().is_transient() => {
                    tracing::debug!(error = %e, "lease table not ready");
                }
                Err(e) => return Err(Error::Store(e)),
            }
            // A candidate asked to poll faster (a worker's leader candidate, once the worker
            // stands by) should not sleep out the slow interval here either.
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                () = self.poll_changed.notified() => {}
                () = sleep(self.poll_interval()) => {}
            }
        }
        self.contend(&shutdown, &mut task).await
    }

    /// Competes for the row until `shutdown`; with standbys, also for the first standby row
    /// while not holding this one (see `standby.rs`).
    async fn contend<F, Fut>(&self, shutdown: &CancellationToken, task: &mut F) -> Result<(), Error>
    where
        F: FnMut(TaskContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        if self.config.standbys == 0 {
            return self.compete(shutdown, task).await;
        }
        let standby = self.standby()?;
        let backup_done = shutdown.child_token();
        let main = async {
            let result = self.compete(shutdown, task).await;
            backup_done.cancel();
            result
        };
        let (result, ()) = tokio::join!(main, self.back_up(&standby, &backup_done));
        result
    }

    /// Polls the row and holds it whenever it is free, until `shutdown`.
    async fn compete<F, Fut>(&self, shutdown: &CancellationToken, task: &mut F) -> Result<(), Error>
    where
        F: FnMut(TaskContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut proof = carried::Proof::default();
        let mut penalty = hold::Penalty::default();
        while !shutdown.is_cancelled() {
            let polled = self.try_take(&mut proof, shutdown).await;
            self.polled.send_replace(true);
            if shutdown.is_cancelled() {
                break;
            }
            match polled {
                Ok(Some((lease, started))) => {
                    let outcome = self.hold(lease, started, shutdown, task).await;
                    if let Some(pause) = penalty.after(outcome, self.config.failover_time) {
                        tracing::warn!(singleton = %self.key, ?pause, "the task was unhealthy: leaving it to other candidates for a while");
                        tokio::select! {
                            biased;
                            () = shutdown.cancelled() => break,
                            () = sleep(pause) => {}
                        }
                    }
                }
                Ok(None) => {}
                Err(e) if e.kind().is_permanent() => return Err(Error::Store(e)),
                Err(error) => {
                    tracing::debug!(%error, singleton = %self.key, "singleton poll failed");
                }
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {}
                () = self.poll_changed.notified() => {}
                () = self.poked.notified() => {}
                () = sleep(self.poll_interval()) => {}
            }
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "test-util"))]
mod poll_tests;
#[cfg(all(test, feature = "test-util"))]
mod tests;
