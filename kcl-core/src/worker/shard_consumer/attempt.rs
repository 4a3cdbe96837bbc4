//! One processor instance, from waiting on parents to its last hook.

use std::sync::Arc;

use chrono::Utc;
use tokio::time::{Instant, sleep, sleep_until};

use super::acks::Acks;
use super::position::{self, Opened};
use super::{Control, Failure, Hook, ShardContext, Stop, hook};
use crate::checkpoint::Checkpointer;
use crate::error::{BackendError, ErrorKind};
use crate::lease::tenure::{Tenure, TenureError};
use crate::metrics::ShardMetrics;
use crate::mutation::{self, Mutation};
use crate::processor::{InitializationInput, ProcessRecordsInput, RecordProcessor};
use crate::source::{RecordBatch, ShardSource};
use crate::task::bounded;
use crate::types::{Checkpoint, ShardId};
use crate::worker::prefetch::{Fetched, Prefetcher};

/// Runs one processor instance; see the module docs of `shard_consumer`.
pub(super) async fn run<S: ShardSource, P: RecordProcessor>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Arc<Tenure>,
    control: &Control,
    mut processor: P,
    seed: u64,
) -> Result<Stop, Failure> {
    // A write of the last attempt may have applied unanswered: settle it first, or this one
    // would start from a checkpoint the row has left behind.
    match tenure.settle().await {
        Ok(()) => {}
        Err(TenureError::Store(e)) => return Err(Failure::Settle(e)),
        Err(_) => return Ok(Stop::Lost),
    }
    if let Some(stop) = wait_for_parents(ctx, tenure, control).await {
        return Ok(stop);
    }

    // Initializing.
    let lease = tenure.snapshot().await;
    let start = match position::open(ctx, tenure, &lease).await? {
        Opened::Finished => return Ok(Stop::Finished),
        Opened::Lost => return Ok(Stop::Lost),
        Opened::At(start) => start,
    };
    let input = InitializationInput {
        shard_id: lease.key.clone(),
        checkpoint: lease.checkpoint.clone(),
        pending_checkpoint: lease.pending_checkpoint.clone(),
    };
    let mut checkpointer = Checkpointer::new(tenure.clone());
    if let Hook::Expired = hook(tenure, "initialize", processor.initialize(&input)).await? {
        return lost(&mut processor).await;
    }
    tracing::info!(checkpoint = %lease.checkpoint, "processing shard");

    // Processing.
    let prefetch = Prefetcher::spawn(ctx, lease.key.clone(), lease.hash_key_range, start, seed);
    let stop = match process(
        ctx,
        tenure,
        control,
        &mut processor,
        &mut checkpointer,
        prefetch,
    )
    .await
    {
        Ok(stop) => stop,
        Err(Failure::Fatal(error)) => {
            // The shard waits for a fix: let the processor checkpoint what it did first.
            let call = processor.shutdown_requested(&mut checkpointer);
            let _ = hook(tenure, "shutdown_requested", call).await;
            return Err(Failure::Fatal(error));
        }
        Err(failure) => {
            // What this attempt was handed waits for the next one.
            observe(control, tenure, &checkpointer).await;
            return Err(failure);
        }
    };

    finish(stop, tenure, control, &mut processor, &mut checkpointer).await
}

/// Shutting down: the hook that goes with why the processor stops.
async fn finish(
    stop: Stop,
    tenure: &Tenure,
    control: &Control,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
) -> Result<Stop, Failure> {
    match stop {
        Stop::Lost => lost(processor).await,
        Stop::Graceful
            if control.is_handing_off()
                && mutation::on(Mutation::HandoffWithoutShutdownRequested) =>
        {
            Ok(Stop::Graceful)
        }
        Stop::Graceful => {
            let call = processor.shutdown_requested(checkpointer);
            match hook(tenure, "shutdown_requested", call).await {
                Ok(Hook::Done) => Ok(Stop::Graceful),
                Ok(Hook::Expired) => lost(processor).await,
                Err(error) => {
                    // The lease goes back anyway: at worst, records since the last checkpoint
                    // repeat.
                    tracing::warn!(%error, "shutdown_requested failed");
                    Ok(Stop::Graceful)
                }
            }
        }
        Stop::ShardEnd => {
            let call = processor.shard_ended(checkpointer);
            if let Hook::Expired = hook(tenure, "shard_ended", call).await? {
                return lost(processor).await;
            }
            if !tenure.snapshot().await.is_finished() {
                return Err(Failure::ShardEndNotCheckpointed);
            }
            tracing::info!("shard ended");
            Ok(Stop::ShardEnd)
        }
        Stop::Finished => Ok(Stop::Finished),
        Stop::Drained => Ok(Stop::Graceful),
    }
}

/// A graceful stop or a handoff while reading. With records still out to be acknowledged,
/// the processor hears `shutdown_requested` first — one that keeps its `Ack`s to finish them
/// in a later hook finishes them there — and then the worker waits for what is in flight
/// and checkpoints the watermark; otherwise the worker checkpoints the watermark and the
/// hook comes last, as ever.
async fn stop_gracefully(
    tenure: &Tenure,
    control: &Control,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    acks: &mut Acks,
) -> Result<Stop, Failure> {
    if acks.all_finished() {
        return Ok(acks.drain(tenure, checkpointer).await);
    }
    match finish(Stop::Graceful, tenure, control, processor, checkpointer).await? {
        Stop::Graceful => Ok(match acks.drain(tenure, checkpointer).await {
            Stop::Graceful => Stop::Drained,
            other => other,
        }),
        other => Ok(other),
    }
}

/// Tells the processor its lease is gone.
async fn lost(processor: &mut impl RecordProcessor) -> Result<Stop, Failure> {
    processor.lease_lost().await;
    Ok(Stop::Lost)
}

/// Waits until every parent has finished: a child's records come after all of its parents'.
/// Returns why the shard stopped meanwhile, if it did.
async fn wait_for_parents<S>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    control: &Control,
) -> Option<Stop> {
    let lease = tenure.snapshot().await;
    if mutation::on(Mutation::ForgetLineage) {
        return None;
    }
    for parent in &lease.parent_shard_ids {
        loop {
            let read = bounded(ctx.config.call_timeout, "get", tenure.store().get(parent));
            match read.await {
                Ok(None) => break,
                Ok(Some(p)) if p.is_finished() => break,
                Ok(Some(_)) => {}
                Err(error) => tracing::debug!(%error, %parent, "reading parent lease failed"),
            }
            tokio::select! {
                biased;
                () = tenure.lost_token().cancelled() => return Some(Stop::Lost),
                () = control.graceful.cancelled() => return Some(Stop::Graceful),
                () = sleep(ctx.config.parent_poll_interval) => {}
            }
        }
    }
    None
}

/// Feeds fetched batches to the processor until the shard ends or the task must stop.
async fn process<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    control: &Control,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    mut prefetch: Prefetcher,
) -> Result<Stop, Failure> {
    let mut metrics = ShardMetrics::new(tenure.shard());
    let mut acks = Acks::new(&ctx.config, checkpointer);
    let mut passed = Passed::default();
    let mut refresh = tokio::time::interval(ctx.config.taker_interval);
    let quiet_after = ctx.config.empty_batch_interval;
    let mut quiet_at = quiet_after.map(|d| Instant::now() + d);
    // The shard's last batch was delivered: it ends once every record finished.
    let mut ending = None;
    loop {
        if let Some(children) = ending.take_if(|_| acks.all_finished()) {
            checkpointer.set_shard_end(children);
            return Ok(Stop::ShardEnd);
        }
        let quiet = async {
            match quiet_at {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let reading = ending.is_none() && acks.room();
        let fetched = tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return Ok(Stop::Lost),
            // Records still run between hooks: they end with the lease's validity, as hooks do.
            () = tenure.expired(), if !acks.all_finished() && !mutation::on(Mutation::SkipValidityCheck) => {
                tenure.mark_lost();
                return Ok(Stop::Lost);
            }
            () = control.graceful.cancelled() => {
                return stop_gracefully(tenure, control, processor, checkpointer, &mut acks).await;
            }
            () = acks.changed() => {
                if let Some(stop) = acks.settle(checkpointer).await? {
                    return Ok(stop);
                }
                passed.note(control, checkpointer);
                observe(control, tenure, checkpointer).await;
                continue;
            }
            fetched = prefetch.recv(), if reading => fetched,
            _ = refresh.tick() => {
                metrics.refresh();
                acks.report(&metrics);
                observe(control, tenure, checkpointer).await;
                continue;
            }
            () = quiet => {
                if let Hook::Expired = deliver_nothing(tenure, processor, checkpointer).await? {
                    return Ok(Stop::Lost);
                }
                quiet_at = quiet_after.map(|d| Instant::now() + d);
                continue;
            }
        };
        quiet_at = quiet_after.map(|d| Instant::now() + d);
        let fetched = match received(ctx, tenure, control, checkpointer, fetched).await? {
            Ok(fetched) => fetched,
            Err(stop) => return Ok(stop),
        };
        let handed = hand_over(
            tenure,
            control,
            processor,
            checkpointer,
            &mut metrics,
            fetched,
        );
        match handed.await? {
            Handed::Lost => return Ok(Stop::Lost),
            Handed::Last(children) => ending = Some(children),
            Handed::Batch => {}
        }
        passed.note(control, checkpointer);
    }
}

/// What the watermark had passed when progress was last noted.
#[derive(Default)]
struct Passed(u64);

impl Passed {
    /// Progress is records finished and passed by the watermark: a batch handled in its
    /// hook, or acknowledged records up to the oldest unfinished one. A batch merely handed
    /// out to acknowledge later is not progress, so that a `Parallel` handler or an `Ack`
    /// failing every attempt is reported `failing` as a failing hook is.
    fn note(&mut self, control: &Control, checkpointer: &Checkpointer) {
        let now = checkpointer.watermark().passed();
        if now > self.0 {
            self.0 = now;
            control.progressed();
        }
    }
}

/// How handing a batch over ended.
enum Handed {
    Batch,
    /// The shard's last batch, and its children.
    Last(Vec<ShardId>),
    /// The lease's validity ran out first.
    Lost,
}

/// Hands one fetched batch to the processor, unless the lease's validity ran out.
async fn hand_over(
    tenure: &Tenure,
    control: &Control,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    metrics: &mut ShardMetrics,
    (batch, bytes): (RecordBatch, usize),
) -> Result<Handed, Failure> {
    if past_validity(tenure) {
        return Ok(Handed::Lost);
    }
    let end = batch.next_iterator.is_none();
    if let Some(millis) = batch.millis_behind_latest {
        control.behind_latest(millis);
    }
    let children: Vec<_> = batch.child_shards.iter().map(|s| s.id.clone()).collect();
    if !batch.records.is_empty() {
        control.set_covered(false);
    }
    if let Hook::Expired = deliver(tenure, processor, checkpointer, metrics, (batch, bytes)).await?
    {
        return Ok(Handed::Lost);
    }
    control.set_covered(covers_delivered(tenure, checkpointer).await);
    Ok(if end {
        Handed::Last(children)
    } else {
        Handed::Batch
    })
}

/// What the fetch loop handed over: a batch and its size, or why the shard stops (`Err`
/// inside), or a failure.
async fn received<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    control: &Control,
    checkpointer: &mut Checkpointer,
    fetched: Option<Fetched>,
) -> Result<Result<(RecordBatch, usize), Stop>, Failure> {
    match fetched {
        Some(Fetched::Batch { batch, bytes, .. }) => {
            control.set_read_failing(None);
            Ok(Ok((batch, bytes)))
        }
        Some(Fetched::Failed(e)) if e.kind() == ErrorKind::NotFound => {
            gone(ctx, tenure, checkpointer, e).await.map(Err)
        }
        Some(Fetched::Failed(e)) if e.kind().is_permanent() => Err(Failure::Fatal(e)),
        Some(Fetched::Failed(e)) => Err(Failure::Source(e)),
        None => Err(Failure::Source(BackendError::new(
            ErrorKind::Retryable,
            "get_records",
            "fetch task stopped",
        ))),
    }
}

/// Tells `control` where the lease's checkpoint is, and the last record this attempt
/// delivered (see `progress`).
async fn observe(control: &Control, tenure: &Tenure, checkpointer: &Checkpointer) {
    let committed = tenure.snapshot().await.checkpoint;
    control.observe(&committed, checkpointer.last_delivered());
}

/// Whether the lease's checkpoint covers the last record this attempt delivered.
async fn covers_delivered(tenure: &Tenure, checkpointer: &Checkpointer) -> bool {
    let Some(last) = checkpointer.last_delivered() else {
        return true;
    };
    let last = Checkpoint::Sequence(last.clone());
    let committed = tenure.snapshot().await.checkpoint;
    committed
        .progress_cmp(&last)
        .is_some_and(std::cmp::Ordering::is_ge)
}

/// Fencing in time: true (and the lease marked lost) once another worker could have taken
/// the lease, so that nothing more is delivered.
fn past_validity(tenure: &Tenure) -> bool {
    if !tenure.is_valid() && !mutation::on(Mutation::SkipValidityCheck) {
        tenure.mark_lost();
        return true;
    }
    false
}

/// An empty batch, for a processor that checkpoints on time as well as on count
/// ([`WorkerConfig::empty_batch_interval`](crate::WorkerConfig::empty_batch_interval)).
async fn deliver_nothing(
    tenure: &Tenure,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
) -> Result<Hook, Failure> {
    if past_validity(tenure) {
        return Ok(Hook::Expired);
    }
    let input = ProcessRecordsInput::new(Vec::new(), None);
    hook(
        tenure,
        "process_records",
        processor.process_records(input, checkpointer),
    )
    .await
}

/// Hands one batch to the processor.
async fn deliver(
    tenure: &Tenure,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    metrics: &mut ShardMetrics,
    (batch, bytes): (RecordBatch, usize),
) -> Result<Hook, Failure> {
    if let Some(millis) = batch.millis_behind_latest {
        metrics.behind_latest(millis);
    }
    let (Some(first), Some(last)) = (batch.records.first(), batch.records.last()) else {
        return Ok(Hook::Done);
    };
    let previous = checkpointer.last_delivered().cloned();
    checkpointer.set_last_delivered(last.position());
    let count = batch.records.len();
    let delay = (Utc::now() - first.approximate_arrival)
        .to_std()
        .unwrap_or_default();
    let started = Instant::now();
    // The batch takes its place in the watermark now, however the processor holds it.
    let watermark = checkpointer.watermark().clone();
    let input = ProcessRecordsInput::delivered(
        batch.records,
        batch.millis_behind_latest,
        &watermark,
        previous,
    );
    let outcome = hook(
        tenure,
        "process_records",
        processor.process_records(input, checkpointer),
    )
    .await;
    watermark.hook_returned();
    let outcome = outcome?;
    let took = started.elapsed();
    tracing::info!(
        records = count,
        bytes,
        processing_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        millis_behind_latest = batch.millis_behind_latest,
        "batch processed"
    );
    metrics.batch(count, bytes, took, delay);
    Ok(outcome)
}

/// The stream said the shard does not exist. If the stream still lists shards and this is not
/// one of them, its records aged out of retention (or the row never named a real shard):
/// treat it as ended, so that its children can start and the row is cleaned up. Otherwise
/// the stream itself is gone, which stops the worker.
async fn gone<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    checkpointer: &mut Checkpointer,
    error: BackendError,
) -> Result<Stop, Failure> {
    let listed = bounded(
        ctx.config.call_timeout,
        "list_shards",
        ctx.source.list_shards(),
    );
    if mutation::on(Mutation::VanishedShardRetried) {
        return Err(Failure::Source(error));
    }
    match listed.await {
        Ok(shards) if !shards.is_empty() && shards.iter().all(|s| &s.id != tenure.shard()) => {
            tracing::warn!(
                %error,
                "the stream no longer has this shard (aged out of retention?): treating it as \
                 ended; records after the checkpoint that were not read are gone"
            );
            checkpointer.set_shard_end(Vec::new());
            Ok(Stop::ShardEnd)
        }
        Ok(shards) if !shards.is_empty() => {
            // The stream has the shard: what it does not have is the position asked for.
            let checkpoint = tenure.snapshot().await.checkpoint;
            Err(Failure::Fatal(
                BackendError::new(
                    ErrorKind::Fatal,
                    "get_shard_iterator",
                    format!(
                        "the stream has shard {} but not the position its checkpoint names \
                     ({checkpoint}): a sequence number of another shard or stream, or a \
                     checkpoint written by hand",
                        tenure.shard()
                    ),
                )
                .with_source(error),
            ))
        }
        Ok(_) => Err(Failure::Source(error)),
        Err(listing) if listing.kind().is_permanent() => Err(Failure::Fatal(listing)),
        Err(listing) => Err(Failure::Source(listing)),
    }
}
