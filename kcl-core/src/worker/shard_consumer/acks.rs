//! The shard task's side of asynchronous acknowledgement: checkpointing the watermark as
//! records finish, pausing reads at the bound, waiting for what is in flight before a graceful
//! stop. The rules are in [`crate::ack`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::{Failure, Stop};
use crate::ack::Watermark;
use crate::checkpoint::Checkpointer;
use crate::config::WorkerConfig;
use crate::error::CheckpointError;
use crate::lease::tenure::Tenure;
use crate::metrics::ShardMetrics;
use crate::mutation::{self, Mutation};

/// What one processor instance has handed out to be acknowledged later.
#[derive(Debug)]
pub(super) struct Acks {
    watermark: Arc<Watermark>,
    max: usize,
    every: u64,
    interval: Duration,
    /// How long a graceful stop waits for records in flight: half the shutdown timeout.
    drain_within: Duration,
    /// How many records the watermark had passed ([`Watermark::passed`]) at the last
    /// checkpoint of it, and since when records passed it (or finished past it) unwritten.
    written: u64,
    since: Option<Instant>,
    /// How many records had finished ([`Watermark::finished_ever`]) at the last checkpoint:
    /// records finished past a watermark that stands are written too (sparse
    /// acknowledgements).
    written_finished: u64,
}

impl Acks {
    pub(super) fn new(config: &WorkerConfig, checkpointer: &Checkpointer) -> Self {
        Self {
            watermark: checkpointer.watermark().clone(),
            max: config.max_unacknowledged,
            every: config.ack_checkpoint_every,
            interval: config.ack_checkpoint_interval,
            drain_within: config.shutdown_timeout / 2,
            written: 0,
            since: None,
            written_finished: 0,
        }
    }

    /// Whether reading may go on: fewer than `max_unacknowledged` records are held behind
    /// the watermark, finished or not.
    pub(super) fn room(&self) -> bool {
        if mutation::on(Mutation::HeldCountsUnfinishedOnly) {
            return self.watermark.outstanding() < self.max;
        }
        self.watermark.held() < self.max
    }

    /// Whether every record handed out finished.
    pub(super) fn all_finished(&self) -> bool {
        self.watermark.outstanding() == 0
    }

    /// Resolves when an acknowledgement arrived, or when the watermark is due to be
    /// checkpointed on time.
    pub(super) async fn changed(&self) {
        let due = async {
            match self.since {
                Some(since) => sleep_until(since + self.interval).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = self.watermark.progressed() => {}
            () = due => {}
        }
    }

    /// Takes in acknowledgements: a failure restarts the shard from the watermark (written
    /// first); otherwise the watermark is checkpointed once enough records finished or enough
    /// time passed. `Some(Stop::Lost)` if the lease turned out to be gone.
    pub(super) async fn settle(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<Option<Stop>, Failure> {
        if let Some(source) = self.watermark.take_failure() {
            if let Err(error) = checkpointer.checkpoint_finished().await {
                tracing::debug!(%error, "checkpointing the watermark before a restart failed");
            }
            return Err(Failure::Processor {
                hook: "acknowledgement",
                source,
            });
        }
        let passed = self.watermark.passed();
        let finished_ever = self.watermark.finished_ever();
        if !self.watermark.used() {
            // A processor that never acknowledges later checkpoints for itself.
            self.written = passed;
            self.written_finished = finished_ever;
        } else if passed > self.written || finished_ever > self.written_finished {
            self.since.get_or_insert_with(Instant::now);
        }
        // Records the watermark passed, or that finished past it.
        let finished = (passed - self.written).max(finished_ever - self.written_finished);
        let due = self
            .since
            .is_some_and(|s| s + self.interval <= Instant::now());
        if finished >= self.every || (due && finished > 0) {
            return Ok(self.write(checkpointer).await);
        }
        Ok(None)
    }

    /// Checkpoints the watermark; a failed write is tried again an interval later.
    async fn write(&mut self, checkpointer: &mut Checkpointer) -> Option<Stop> {
        let passed = self.watermark.passed();
        let finished_ever = self.watermark.finished_ever();
        match checkpointer.checkpoint_finished().await {
            Ok(()) => {
                self.written = passed;
                self.written_finished = finished_ever;
                self.since = None;
                None
            }
            Err(CheckpointError::LeaseLost { .. }) => Some(Stop::Lost),
            Err(error) => {
                tracing::warn!(%error, "checkpointing acknowledged records failed; trying again later");
                self.since = Some(Instant::now());
                None
            }
        }
    }

    /// A graceful stop: waits for the records in flight until every one finished, one failed,
    /// half the shutdown timeout passed or the lease's validity ran out, then checkpoints the
    /// watermark. What is still in flight then is cancelled with the processor.
    pub(super) async fn drain(&mut self, tenure: &Tenure, checkpointer: &mut Checkpointer) -> Stop {
        let deadline = sleep(self.drain_within);
        tokio::pin!(deadline);
        while !self.all_finished() {
            tokio::select! {
                biased;
                () = tenure.lost_token().cancelled() => return Stop::Lost,
                () = tenure.expired() => return Stop::Lost,
                () = &mut deadline => {
                    tracing::warn!(
                        in_flight = self.watermark.outstanding(),
                        "records still in flight at shutdown: they will be delivered again"
                    );
                    break;
                }
                () = self.watermark.progressed() => {
                    if self.watermark.take_failure().is_some() {
                        break;
                    }
                }
            }
        }
        if !self.watermark.used() {
            return Stop::Graceful;
        }
        self.write(checkpointer).await.unwrap_or(Stop::Graceful)
    }

    /// Sets the shard's in-flight and watermark gauges, once records were handed out.
    pub(super) fn report(&self, metrics: &ShardMetrics) {
        if !self.watermark.used() {
            return;
        }
        let (lag_records, oldest) = self.watermark.behind();
        let lag = oldest.map(|at| at.elapsed()).unwrap_or_default();
        metrics.watermark(self.watermark.outstanding(), lag_records, lag);
    }
}
