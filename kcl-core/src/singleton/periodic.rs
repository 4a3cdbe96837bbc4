//! Periodic leader jobs: once per period, on whichever candidate holds the singleton.
//!
//! Periods are numbered on the wall clock (`unix time / period`), the one clock every
//! candidate shares: a new holder knows which period it is in without asking anyone. The
//! holder keeps the singleton across periods (no election per period) and, before running a
//! period's job, records the period's number in the row by a write fenced like a checkpoint
//! (owner and counter). A new holder reads it and never runs that period again. So a job runs
//! **at most once per period**; a holder that dies after recording and before finishing
//! costs that period's run, and the next period's runs on the new holder (within the
//! failover time plus one period). A job that must not be lost even then should be
//! idempotent and check its own output, with the [`FencingToken`](super::FencingToken).
//!
//! Expiry never depends on this clock: only which period it is does. A holder whose clock
//! runs ahead starts a period early; one behind, late; neither runs a period twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::{FencingToken, Singleton, TaskContext};
use crate::error::Error;
use crate::lease::{CheckpointUpdate, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::types::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

/// One period's run of a job started with [`Singleton::every`].
#[derive(Debug, Clone)]
pub struct Period {
    /// The period's number: milliseconds since the Unix epoch divided by the period.
    pub index: u64,
    ctx: TaskContext,
}

impl Period {
    /// This holder's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.ctx.fencing_token()
    }

    /// Cancelled when the job must stop (see [`TaskContext::cancelled`]).
    pub fn cancelled(&self) -> &CancellationToken {
        self.ctx.cancelled()
    }

    /// The messages sent to the singleton since the last run (with a messenger).
    pub fn messages(&self) -> Vec<bytes::Bytes> {
        self.ctx.drain_inbox()
    }

    /// Says the job is healthy (health mode: a run longer than the health timeout must call
    /// this).
    pub fn heartbeat(&self) {
        self.ctx.heartbeat();
    }
}

impl<L: LeaseStore> Singleton<L> {
    /// Runs `job` once per `period` on whichever candidate holds this singleton, until
    /// `shutdown`. Periods are numbered on the wall clock (`unix time / period`, the one clock
    /// candidates share; expiry never depends on it); the holder keeps the job across periods
    /// and records each period in the row, fenced like a checkpoint, before running it. So a
    /// job runs **at most once per period**: a holder dying after recording and before
    /// finishing costs that period's run, and the next period's runs on the new holder, within
    /// the failover time plus one period. Under health mode the holder is healthy between
    /// runs, and a run must end within the health timeout (or call [`Period::heartbeat`]).
    pub async fn every<F, Fut>(
        &self,
        period: Duration,
        shutdown: CancellationToken,
        job: F,
    ) -> Result<(), Error>
    where
        F: Fn(Period) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let millis = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        let job = Arc::new(job);
        let clock = self.clock.clone();
        self.run_with(shutdown, |ctx: TaskContext| {
            let (job, clock) = (job.clone(), clock.clone());
            async move { periodically(&ctx, millis, &*clock, &*job).await }
        })
        .await
    }
}

/// The holder's loop: run each period not yet recorded, then sleep to the next.
async fn periodically<F, Fut>(
    ctx: &TaskContext,
    millis: u64,
    clock: &(dyn Fn() -> chrono::DateTime<Utc> + Send + Sync),
    job: &F,
) where
    F: Fn(Period) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let now = u64::try_from(clock().timestamp_millis()).unwrap_or(0);
        let index = now / millis;
        let done = last_run(&ctx.tenure.snapshot().await.checkpoint);
        if done.is_none_or(|last| last < index) {
            let skip = mutation::on(Mutation::PeriodNotRecorded);
            if !skip && record(ctx, index).await.is_err() {
                return; // the row is no longer ours
            }
            ctx.heartbeat();
            let run = Period {
                index,
                ctx: ctx.clone(),
            };
            tokio::select! {
                biased;
                () = ctx.cancelled().cancelled() => return,
                () = job(run) => {}
            }
            ctx.heartbeat();
        }
        let next = (index + 1).saturating_mul(millis).saturating_sub(now);
        if !idle(ctx, Duration::from_millis(next.max(1))).await {
            return;
        }
    }
}

/// Waits `pause` between periods, healthy all along (the job is not running): in health
/// mode it says so every half timeout; false if cancelled meanwhile.
async fn idle(ctx: &TaskContext, pause: Duration) -> bool {
    let until = tokio::time::Instant::now() + pause;
    loop {
        ctx.heartbeat();
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        let step = ctx.health.map_or(left, |timeout| left.min(timeout / 2));
        tokio::select! {
            biased;
            () = ctx.cancelled().cancelled() => return false,
            () = sleep(step) => {}
        }
    }
}

/// The last period recorded in the row's checkpoint; `None` before the first.
fn last_run(checkpoint: &Checkpoint) -> Option<u64> {
    match checkpoint {
        Checkpoint::Sequence(s) => s.sequence.as_str().parse().ok(),
        _ => None,
    }
}

/// Records that period `index` is run, fenced on this holder's owner and counter.
async fn record(ctx: &TaskContext, index: u64) -> Result<(), crate::lease::tenure::TenureError> {
    let update = CheckpointUpdate {
        checkpoint: Checkpoint::Sequence(ExtendedSequenceNumber::new(SequenceNumber::from(
            u128::from(index),
        ))),
        pending: None,
        child_shard_ids: Vec::new(),
        start_timestamp: None,
        endpoint: None,
        park: Vec::new(),
        restart_grace: None,
        carrier: None,
        signals: None,
        acked: None,
    };
    ctx.tenure.checkpoint(&update).await.map(drop)
}
