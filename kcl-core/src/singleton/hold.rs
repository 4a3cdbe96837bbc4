//! Holding a singleton: renewing its row, running the task, stopping it in time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::Singleton;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::carried;
use super::context::{FencingToken, TaskContext};
use super::messages::Registration;
use crate::lease::renewer;
use crate::lease::tenure::{Taken, Tenure, Timing};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::task::bounded;

/// Messages an instance's inbox holds before senders are told it is busy.
const INBOX_CAPACITY: usize = 64;

/// How a holding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The task returned, shutdown came, or the lease was lost.
    Ended,
    /// Health mode: the task sent no heartbeat in time.
    Unhealthy,
}

/// How long a candidate whose task was unhealthy leaves the singleton to others: the
/// failover time after the first time, doubling with each unhealthy run in a row up to 16
/// times it, so that a task broken everywhere is not restarted in a tight loop.
#[derive(Debug, Default)]
pub(super) struct Penalty {
    in_a_row: u32,
}

impl Penalty {
    pub(super) fn after(&mut self, outcome: Outcome, failover_time: Duration) -> Option<Duration> {
        match outcome {
            Outcome::Ended => {
                self.in_a_row = 0;
                None
            }
            Outcome::Unhealthy => {
                self.in_a_row = self.in_a_row.saturating_add(1);
                Some(failover_time * (1u32 << (self.in_a_row - 1).min(4)))
            }
        }
    }
}

impl<L: LeaseStore> Singleton<L> {
    pub(super) async fn hold<F, Fut>(
        &self,
        lease: Lease,
        started: Instant,
        shutdown: &CancellationToken,
        task: &mut F,
    ) -> Outcome
    where
        F: FnMut(TaskContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        let fence = if mutation::on(Mutation::FenceConstant) {
            FencingToken(1)
        } else {
            FencingToken(lease.counter)
        };
        let taken = Taken {
            lease,
            worker: self.me.clone(),
            store: self.store.clone(),
            started,
        };
        let timing = Timing {
            failover_time: self.config.failover_time,
            // Singletons have no call timeout of their own: a write may take as long as the
            // row could stay valid, and is given up then.
            call_timeout: self.config.failover_time,
        };
        let tenure = Arc::new(Tenure::new(taken, timing));
        *self
            .holding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tenure.clone());
        self.holder.send_replace(Some(self.me.clone()));
        tracing::info!(singleton = %self.key, %fence, me = %self.me, "singleton acquired");
        let outcome = {
            let _renewer = AbortOnDropHandle::new(self.keep(&tenure));
            // Advertised, then registered and started without an `.await` in between, so
            // that the inbox takes messages only once the task runs; unregistered when the
            // task ends. A sender that reads the address before the registration is told
            // "not here" and tries again.
            self.advertise(&tenure).await;
            let (inbox, messages) = self
                .messenger
                .as_ref()
                .filter(|m| m.address().is_some())
                .map(|_| mpsc::channel(INBOX_CAPACITY))
                .unzip();
            let ctx = TaskContext::new(tenure.clone(), fence, messages, self.config.health_timeout);
            let _registration = inbox.and_then(|inbox| self.register(&tenure, &ctx, inbox));
            let run = task(ctx.clone());
            self.supervise(&tenure, shutdown, &ctx, run).await
            // Dropping the renewer here aborts any write it has under way, which frees the
            // tenure for the release below.
        };
        if !tenure.is_lost() {
            if let Err(error) = tenure.release().await {
                tracing::debug!(?error, singleton = %self.key, "singleton release failed");
            }
        } else if self.carriers.is_some() {
            self.release_lapsed(&tenure).await;
        }
        tenure.mark_lost();
        *self
            .holding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        tracing::info!(singleton = %self.key, me = %self.me, "singleton given up");
        self.holder.send_replace(None);
        outcome
    }

    /// The task that keeps the row: its renewer, or for a carried row the keeper that names
    /// its carrier (see `carried`).
    fn keep(&self, tenure: &Arc<Tenure>) -> tokio::task::JoinHandle<()> {
        let interval = self.config.renew_interval;
        match &self.carriers {
            Some(carriers) => crate::task::spawn(carried::keep(
                tenure.clone(),
                carriers.clone(),
                interval,
                self.config.failover_time,
            )),
            None => crate::task::spawn(renewer::run(tenure.clone(), interval)),
        }
    }

    /// A carried row whose validity lapsed may still look alive to others while its carrier
    /// goes on: released, if nobody wrote it since (conditional), so that a successor takes
    /// it at once rather than never.
    async fn release_lapsed(&self, tenure: &Tenure) {
        let row = tenure.snapshot().await;
        let limit = self.config.failover_time;
        match bounded(limit, "release", self.store.release(&row)).await {
            Ok(()) => {
                tracing::info!(singleton = %self.key, "role row released after its validity lapsed");
            }
            Err(error) => {
                tracing::debug!(%error, singleton = %self.key, "releasing a lapsed row failed");
            }
        }
    }

    /// Runs the task until it returns, cancelling its token on shutdown, when the lease is at
    /// risk or when the task is unhealthy, and dropping the task `stop_timeout` later or when
    /// the validity runs out, whichever comes first (see the module docs).
    async fn supervise(
        &self,
        tenure: &Tenure,
        shutdown: &CancellationToken,
        ctx: &TaskContext,
        run: impl Future<Output = ()>,
    ) -> Outcome {
        let budget = self.config.stop_timeout;
        let token = ctx.cancelled();
        tokio::pin!(run);
        if mutation::on(Mutation::SingletonNeverStopped) {
            run.await;
            return Outcome::Ended;
        }
        if mutation::on(Mutation::SingletonNotDropped) {
            tokio::select! {
                biased;
                () = &mut run => return Outcome::Ended,
                () = tenure.lost_token().cancelled() => {}
                () = shutdown.cancelled() => {}
            }
            token.cancel();
            run.await;
            return Outcome::Ended;
        }
        let mut outcome = Outcome::Ended;
        tokio::select! {
            biased;
            () = tenure.expired() => {
                self.dropped();
                return outcome;
            }
            () = &mut run => return outcome,
            () = at_risk(tenure, budget) => {
                tracing::warn!(singleton = %self.key, "lease at risk: cancelling the task");
            }
            () = ctx.unhealthy() => {
                tracing::warn!(singleton = %self.key, timeout = ?self.config.health_timeout, "no heartbeat from the task in time: cancelling it");
                outcome = Outcome::Unhealthy;
            }
            () = shutdown.cancelled() => {}
        }
        token.cancel();
        let stop_by = Instant::now() + budget;
        tokio::select! {
            biased;
            () = tenure.expired() => self.dropped(),
            () = &mut run => {}
            () = sleep_until(stop_by) => self.dropped(),
        }
        outcome
    }

    /// With a messenger: writes its address in the row (fenced, keeping the rest).
    async fn advertise(&self, tenure: &Tenure) {
        let Some(address) = self.messenger.as_ref().and_then(|m| m.address()) else {
            return;
        };
        let row = tenure.snapshot().await;
        let update = CheckpointUpdate {
            checkpoint: row.checkpoint,
            pending: row.pending_checkpoint,
            child_shard_ids: Vec::new(),
            start_timestamp: None,
            endpoint: Some(address),
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        };
        if let Err(error) = tenure.checkpoint(&update).await {
            tracing::debug!(?error, singleton = %self.key, "advertising the inbox failed");
        }
    }

    /// Routes messages to the instance's inbox while its lease is valid and it has not been
    /// told to stop (a stopping instance would not read them; the sender tries the next).
    fn register(
        &self,
        tenure: &Arc<Tenure>,
        ctx: &TaskContext,
        inbox: mpsc::Sender<Bytes>,
    ) -> Option<Registration> {
        let messenger = self.messenger.as_ref()?;
        let (tenure, stopping) = (tenure.clone(), ctx.cancelled().clone());
        let open = move || {
            mutation::on(Mutation::InboxIgnoresLease)
                || (tenure.is_valid() && !stopping.is_cancelled())
        };
        Some(
            messenger
                .inboxes()
                .register(self.name(), inbox, Arc::new(open)),
        )
    }

    fn dropped(&self) {
        tracing::warn!(singleton = %self.key, "the task did not stop in time: dropped");
    }
}

/// Resolves once less than `budget` is left of the lease's validity (or it is lost).
async fn at_risk(tenure: &Tenure, budget: Duration) {
    loop {
        let until = tenure.valid_until();
        let alarm = until.checked_sub(budget).unwrap_or(until);
        tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return,
            () = sleep_until(alarm) => {
                if tenure.valid_until() == until {
                    return;
                }
            }
        }
    }
}
