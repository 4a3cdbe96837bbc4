//! One task per held lease: renew it, and feed its processor in order.
//!
//! The task is a small state machine — waiting on parents, initializing, processing, shutting
//! down — run next to the lease's renewer. It stops for one of four reasons: the shard ended
//! (checkpointed `SHARD_END`), the lease was lost (`lease_lost`, no checkpoint possible), the
//! worker is stopping (`shutdown_requested`, then the lease is released at once) or another
//! worker asked for the lease (`shutdown_requested`, then the lease is handed to it).
//!
//! A processor that fails or panics is dropped; after a backoff a new one starts from the
//! last checkpoint, while the lease stays held and renewed.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::Utc;
use futures_util::FutureExt;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::prefetch::{Fetched, Prefetcher};
use crate::checkpoint::Checkpointer;
use crate::config::WorkerConfig;
use crate::error::{BackendError, BoxError};
use crate::lease::renewer;
use crate::lease::tenure::Tenure;
use crate::metrics;
use crate::processor::{
    InitializationInput, ProcessRecordsInput, ProcessorFactory, RecordProcessor,
};
use crate::source::ShardSource;
use crate::types::{Checkpoint, InitialPosition, ShardId, StartingPosition, WorkerId};

/// What every shard task of a worker shares.
#[derive(Debug)]
pub(crate) struct ShardContext<S, F> {
    pub(crate) source: Arc<S>,
    pub(crate) factory: Arc<F>,
    pub(crate) config: Arc<WorkerConfig>,
}

/// How the coordinator steers a running shard task.
#[derive(Debug)]
pub(crate) struct Control {
    /// Cancelled to stop gracefully (worker shutdown, or a handoff).
    graceful: CancellationToken,
    handoff_to: Mutex<Option<WorkerId>>,
}

impl Control {
    pub(crate) fn new(graceful: CancellationToken) -> Self {
        Self {
            graceful,
            handoff_to: Mutex::new(None),
        }
    }

    /// Stops the shard gracefully and hands its lease to `to`.
    pub(crate) fn hand_off(&self, to: WorkerId) {
        *self
            .handoff_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(to);
        self.graceful.cancel();
    }

    pub(crate) fn is_handing_off(&self) -> bool {
        self.handoff_target().is_some()
    }

    fn handoff_target(&self) -> Option<WorkerId> {
        self.handoff_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Why a shard task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The shard was processed to its end.
    ShardEnd,
    /// The lease is no longer ours.
    Lost,
    /// Stopped gracefully; the lease was released or handed over.
    Released,
    /// Stopped gracefully but the release failed; the lease will expire.
    ReleaseFailed,
}

enum Stop {
    /// Nothing to do: the lease was already finished.
    Finished,
    ShardEnd,
    Lost,
    Graceful,
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("processor {hook} failed")]
    Processor {
        hook: &'static str,
        #[source]
        source: BoxError,
    },
    #[error("processor {hook} panicked: {message}")]
    Panic { hook: &'static str, message: String },
    #[error("reading the shard failed")]
    Source(#[source] BackendError),
    #[error("shard_ended returned without checkpointing SHARD_END")]
    ShardEndNotCheckpointed,
}

/// Runs the shard until it stops; see the module docs.
pub(crate) async fn run<S: ShardSource, F: ProcessorFactory>(
    ctx: Arc<ShardContext<S, F>>,
    tenure: Arc<Tenure>,
    control: Arc<Control>,
) -> Exit {
    let renew = renewer::run(tenure.clone(), ctx.config.renew_interval);
    let consume = consume(&ctx, &tenure, &control);
    tokio::pin!(renew, consume);
    let mut renewing = true;
    loop {
        tokio::select! {
            biased;
            exit = &mut consume => {
                tenure.mark_lost(); // ends the tenure: no write may follow the task
                return exit;
            }
            () = &mut renew, if renewing => renewing = false,
        }
    }
}

async fn consume<S: ShardSource, F: ProcessorFactory>(
    ctx: &ShardContext<S, F>,
    tenure: &Arc<Tenure>,
    control: &Control,
) -> Exit {
    let seed = crate::types::stable_hash((tenure.worker(), tenure.shard()));
    let mut restarts = ExponentialBuilder::default()
        .with_min_delay(ctx.config.min_backoff.max(Duration::from_millis(500)))
        .with_max_delay(ctx.config.max_backoff.max(Duration::from_secs(1)))
        .with_jitter()
        .with_jitter_seed(seed)
        .without_max_times()
        .build();
    let stop = loop {
        let processor = ctx.factory.create(tenure.shard());
        match attempt(ctx, tenure, control, processor, seed).await {
            Ok(stop) => break stop,
            Err(failure) => {
                ::metrics::counter!(metrics::PROCESSOR_FAILURES).increment(1);
                let delay = restarts.next().unwrap_or(ctx.config.max_backoff);
                tracing::warn!(error = %failure, cause = ?std::error::Error::source(&failure), ?delay, "shard failed; restarting from the last checkpoint");
                tokio::select! {
                    biased;
                    () = tenure.lost_token().cancelled() => break Stop::Lost,
                    () = control.graceful.cancelled() => break Stop::Graceful,
                    () = sleep(delay) => {}
                }
            }
        }
    };
    match stop {
        Stop::Lost => Exit::Lost,
        Stop::Finished | Stop::ShardEnd => {
            // The finished lease is never processed again; releasing it just tidies the row.
            let _ = tenure.release().await;
            Exit::ShardEnd
        }
        Stop::Graceful => {
            let result = match control.handoff_target() {
                Some(to) => {
                    tracing::info!(to = %to, "handing the lease over");
                    tenure.hand_off(&to).await
                }
                None => tenure.release().await,
            };
            match result {
                Ok(()) => Exit::Released,
                Err(error) => {
                    tracing::warn!(?error, "could not hand the lease back; it will expire");
                    Exit::ReleaseFailed
                }
            }
        }
    }
}

/// One processor instance, from waiting on parents to its last hook.
async fn attempt<S: ShardSource, F: ProcessorFactory>(
    ctx: &ShardContext<S, F>,
    tenure: &Arc<Tenure>,
    control: &Control,
    mut processor: F::Processor,
    seed: u64,
) -> Result<Stop, Failure> {
    let lease = tenure.snapshot().await;
    // Waiting on parents: a child's records come after every record of its parents.
    for parent in &lease.parent_shard_ids {
        loop {
            match tenure.store().get(parent).await {
                Ok(None) => break,
                Ok(Some(p)) if p.is_finished() => break,
                Ok(Some(_)) => {}
                Err(error) => tracing::debug!(%error, %parent, "reading parent lease failed"),
            }
            tokio::select! {
                biased;
                () = tenure.lost_token().cancelled() => return Ok(Stop::Lost),
                () = control.graceful.cancelled() => return Ok(Stop::Graceful),
                () = sleep(ctx.config.parent_poll_interval) => {}
            }
        }
    }

    // Initializing.
    let lease = tenure.snapshot().await;
    let start = match &lease.checkpoint {
        Checkpoint::ShardEnd => return Ok(Stop::Finished),
        Checkpoint::TrimHorizon => StartingPosition::TrimHorizon,
        Checkpoint::Latest => StartingPosition::Latest,
        Checkpoint::AtTimestamp => match ctx.config.initial_position {
            InitialPosition::AtTimestamp(t) => StartingPosition::AtTimestamp(t),
            _ => StartingPosition::TrimHorizon,
        },
        // A partly processed aggregated record is read again whole: at least once.
        Checkpoint::Sequence(s) if s.sub_sequence > 0 => {
            StartingPosition::AtSequence(s.sequence.clone())
        }
        Checkpoint::Sequence(s) => StartingPosition::AfterSequence(s.sequence.clone()),
    };
    let input = InitializationInput {
        shard_id: lease.key.clone(),
        checkpoint: lease.checkpoint.clone(),
        pending_checkpoint: lease.pending_checkpoint.clone(),
    };
    guard("initialize", processor.initialize(&input)).await?;
    tracing::info!(checkpoint = %lease.checkpoint, "processing shard");

    // Processing.
    let mut prefetch = Prefetcher::spawn(
        ctx.source.clone(),
        lease.key.clone(),
        start,
        &ctx.config,
        seed,
    );
    let mut checkpointer = Checkpointer::new(tenure.clone());
    let shard_label = lease.key.to_string();
    let stop = loop {
        let fetched = tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => break Stop::Lost,
            () = control.graceful.cancelled() => break Stop::Graceful,
            fetched = prefetch.recv() => fetched,
        };
        let (batch, bytes) = match fetched {
            Some(Fetched::Batch { batch, bytes, .. }) => (batch, bytes),
            Some(Fetched::Failed(e)) => return Err(Failure::Source(e)),
            None => {
                return Err(Failure::Source(BackendError::new(
                    crate::ErrorKind::Retryable,
                    "get_records",
                    "fetch task stopped",
                )));
            }
        };
        // Fencing in time: deliver nothing once another worker could have taken the lease.
        if !tenure.is_valid() {
            tenure.mark_lost();
            break Stop::Lost;
        }
        if let Some(millis) = batch.millis_behind_latest {
            #[allow(clippy::cast_precision_loss)]
            ::metrics::gauge!(metrics::MILLIS_BEHIND_LATEST, "shard" => shard_label.clone())
                .set(millis as f64);
        }
        if let (Some(first), Some(last)) = (batch.records.first(), batch.records.last()) {
            checkpointer.set_last_delivered(last.position());
            let count = batch.records.len();
            let delay = (Utc::now() - first.approximate_arrival)
                .to_std()
                .unwrap_or_default();
            let started = Instant::now();
            let input = ProcessRecordsInput {
                records: batch.records,
                millis_behind_latest: batch.millis_behind_latest,
            };
            guard(
                "process_records",
                processor.process_records(input, &mut checkpointer),
            )
            .await?;
            let took = started.elapsed();
            tracing::info!(
                records = count,
                bytes,
                processing_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                millis_behind_latest = batch.millis_behind_latest,
                "batch processed"
            );
            ::metrics::counter!(metrics::RECORDS, "shard" => shard_label.clone())
                .increment(count as u64);
            ::metrics::counter!(metrics::BYTES, "shard" => shard_label.clone())
                .increment(bytes as u64);
            ::metrics::histogram!(metrics::BATCH_DURATION).record(took.as_secs_f64());
            ::metrics::histogram!(metrics::DELIVERY_DELAY).record(delay.as_secs_f64());
        }
        if batch.next_iterator.is_none() {
            checkpointer.set_shard_end(batch.child_shards.into_iter().map(|s| s.id).collect());
            break Stop::ShardEnd;
        }
    };
    drop(prefetch);

    // Shutting down.
    match stop {
        Stop::Lost => {
            guard("lease_lost", async {
                processor.lease_lost().await;
                Ok(())
            })
            .await?;
        }
        Stop::Graceful => {
            if let Err(error) = guard(
                "shutdown_requested",
                processor.shutdown_requested(&mut checkpointer),
            )
            .await
            {
                // The lease goes back anyway: at worst, records since the last checkpoint repeat.
                tracing::warn!(%error, "shutdown_requested failed");
            }
        }
        Stop::ShardEnd => {
            guard("shard_ended", processor.shard_ended(&mut checkpointer)).await?;
            if !tenure.snapshot().await.is_finished() {
                return Err(Failure::ShardEndNotCheckpointed);
            }
            tracing::info!("shard ended");
        }
        Stop::Finished => {}
    }
    Ok(stop)
}

/// Runs a processor hook, turning its error or panic into a [`Failure`].
async fn guard(
    hook: &'static str,
    call: impl Future<Output = Result<(), BoxError>>,
) -> Result<(), Failure> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(Failure::Processor { hook, source }),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".to_owned());
            Err(Failure::Panic { hook, message })
        }
    }
}

/// The span every shard task runs in.
pub(crate) fn span(shard: &ShardId, owner: &WorkerId) -> tracing::Span {
    tracing::info_span!("shard", shard.id = %shard, lease.owner = %owner)
}
