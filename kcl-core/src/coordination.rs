//! Singleton tasks and leader election on the lease table, so that an application needs no
//! Redis, ZooKeeper or memcached to run "exactly one of these across the fleet".
//!
//! A [`Singleton`] is a named lease row (key `kcl-coordination/<name>`) taken, renewed and
//! released with the same conditional writes, the same observed-expiry rule and the same
//! local validity bound as shard leases. Every candidate runs [`Singleton::run`]; the one
//! holding the row runs the task, the others watch the row and take over when it is released
//! or expires. The task gets a [`CancellationToken`] that is cancelled when the lease is lost,
//! at the latest when another candidate could take it, and on shutdown.
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
//! use kcl_core::coordination::{Singleton, SingletonConfig};
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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::error::{ConfigError, Error, ErrorKind};
use crate::lease::observer::Observer;
use crate::lease::renewer;
use crate::lease::tenure::Tenure;
use crate::lease::{Lease, LeaseStore};
use crate::types::{Checkpoint, ShardId, WorkerId};

/// Lease keys of singletons start with this; no Kinesis shard id does.
pub const COORDINATION_PREFIX: &str = "kcl-coordination/";

/// True for rows that hold a singleton, not a shard.
pub fn is_coordination_key(key: &ShardId) -> bool {
    key.as_str().starts_with(COORDINATION_PREFIX)
}

/// Timing of a [`Singleton`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SingletonConfig {
    /// As [`WorkerConfig::failover_time`](crate::WorkerConfig::failover_time). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub failover_time: Duration,
    /// How often the holder renews. Default: a third of the failover time.
    #[serde(with = "humantime_serde")]
    pub renew_interval: Duration,
    /// How often candidates read the row. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
}

impl Default for SingletonConfig {
    fn default() -> Self {
        let failover_time = Duration::from_secs(10);
        Self {
            failover_time,
            renew_interval: failover_time / 3,
            poll_interval: Duration::from_secs(1),
        }
    }
}

impl SingletonConfig {
    /// Sets the failover time and a third of it as the renew interval.
    #[must_use]
    pub fn failover_time(mut self, value: Duration) -> Self {
        self.failover_time = value;
        self.renew_interval = value / 3;
        self
    }

    /// Sets the poll interval.
    #[must_use]
    pub fn poll_interval(mut self, value: Duration) -> Self {
        self.poll_interval = value;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.renew_interval.is_zero() || self.renew_interval * 2 > self.failover_time {
            return err(
                "renew_interval",
                "must be above zero and at most half of failover_time",
            );
        }
        if self.poll_interval.is_zero() {
            return err("poll_interval", "must be above zero");
        }
        Ok(())
    }
}

/// One named task that runs on exactly one candidate at a time. See the module docs.
#[derive(Debug)]
pub struct Singleton<L> {
    key: ShardId,
    me: WorkerId,
    store: Arc<L>,
    config: SingletonConfig,
    holder: watch::Sender<Option<WorkerId>>,
}

impl<L: LeaseStore> Singleton<L> {
    /// A candidate named `me` for the singleton `name`.
    pub fn new(
        name: &str,
        me: impl Into<WorkerId>,
        store: L,
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
            store: Arc::new(store),
            config,
            holder: watch::Sender::new(None),
        })
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
        loop {
            match self.store.ensure_table().await {
                Ok(()) => break,
                Err(e) if e.kind().is_transient() => {
                    tracing::debug!(error = %e, "lease table not ready");
                }
                Err(e) => return Err(Error::Store(e)),
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                () = sleep(self.config.poll_interval) => {}
            }
        }
        let mut observer = Observer::default();
        while !shutdown.is_cancelled() {
            match self.try_take(&mut observer).await {
                Ok(Some((lease, started))) => self.hold(lease, started, &shutdown, &mut task).await,
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Fatal => return Err(Error::Store(e)),
                Err(error) => {
                    tracing::debug!(%error, singleton = %self.key, "singleton poll failed");
                }
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {}
                () = sleep(self.config.poll_interval) => {}
            }
        }
        Ok(())
    }

    /// Reads the row (creating it if absent) and takes it if free, ours, or expired.
    async fn try_take(
        &self,
        observer: &mut Observer,
    ) -> Result<Option<(Lease, Instant)>, crate::BackendError> {
        let Some(row) = self.store.get(&self.key).await? else {
            let row = Lease::new(self.key.clone(), Checkpoint::TrimHorizon);
            self.store.create(&row).await?;
            return Ok(None);
        };
        let now = Instant::now();
        observer.update(std::slice::from_ref(&row), now);
        self.holder.send_if_modified(|h| {
            let changed = *h != row.owner;
            h.clone_from(&row.owner);
            changed
        });
        let free = match &row.owner {
            None => true,
            Some(o) if o == &self.me => true,
            Some(_) => observer.idle(&row, now) >= self.config.failover_time,
        };
        if !free {
            return Ok(None);
        }
        let started = Instant::now();
        match self.store.take(&row, &self.me).await {
            Ok(lease) => Ok(Some((lease, started))),
            Err(e) if e.kind() == ErrorKind::Conflict => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn hold<F, Fut>(
        &self,
        lease: Lease,
        started: Instant,
        shutdown: &CancellationToken,
        task: &mut F,
    ) where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let tenure = Arc::new(Tenure::new(
            lease,
            self.me.clone(),
            self.store.clone(),
            self.config.failover_time,
            started,
        ));
        self.holder.send_replace(Some(self.me.clone()));
        tracing::info!(singleton = %self.key, "singleton acquired");
        let token = tenure.lost_token().child_token();
        {
            // Scoped so the renewer is dropped, and with it any write it has under way, before
            // the release below (which would otherwise wait for that write's lock forever).
            let stop = shutdown.clone();
            let run = task(token.clone());
            let renew = renewer::run(tenure.clone(), self.config.renew_interval);
            let cancel_on_shutdown = async {
                stop.cancelled().await;
                token.cancel();
                std::future::pending::<()>().await;
            };
            tokio::pin!(run, renew, cancel_on_shutdown);
            let mut renewing = true;
            loop {
                tokio::select! {
                    biased;
                    () = &mut run => break,
                    () = &mut renew, if renewing => renewing = false,
                    () = &mut cancel_on_shutdown => {}
                }
            }
        }
        if !tenure.is_lost()
            && let Err(error) = tenure.release().await
        {
            tracing::debug!(?error, singleton = %self.key, "singleton release failed");
        }
        tenure.mark_lost();
        tracing::info!(singleton = %self.key, "singleton given up");
        self.holder.send_replace(None);
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests;
