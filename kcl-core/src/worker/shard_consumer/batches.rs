//! One attempt's batches, top to bottom: what happens to a batch, and to everything else
//! that can happen while the processor works through the shard.
//!
//! [`run`] waits for the next [`Event`] and handles it in one `match`:
//! - **fetched**: the batch is checked (a read that failed stops the attempt, a shard the
//!   stream no longer has ends it), handed to the processor (`process_records`) and
//!   counted; the shard's last batch marks it ending;
//! - **acked**: records acknowledged later finished, so the watermark may be checkpointed;
//! - **tick**: metrics and the shard's progress are refreshed for the coordinator;
//! - **quiet**: nothing came for `empty_batch_interval`, so the processor gets an empty
//!   batch (time-based work);
//! - **stop** or **lost**: the attempt ends with a graceful stop or a lost lease, for
//!   `attempt` to finish.
//!
//! An ending shard ends once every record it was handed finished (`SHARD_END` is
//! checkpointed then). Reading pauses while `max_unacknowledged` records are held, and no
//! record is handed over past the lease's validity.

use chrono::Utc;
use tokio::time::{Instant, Interval, sleep_until};

use super::acks::Acks;
use super::prefetch::{Fetched, Prefetcher};
use super::{Control, Failure, Hook, ShardContext, Stop, hook, skip, walk};
use crate::checkpoint::Checkpointer;
use crate::error::{BackendError, ErrorKind};
use crate::failure::Handling;
use crate::lease::tenure::Tenure;
use crate::metrics::ShardMetrics;
use crate::mutation::{self, Mutation};
use crate::processor::{ProcessRecordsInput, RecordProcessor};
use crate::source::{RecordBatch, ShardSource};
use crate::task::bounded;
use crate::types::{Checkpoint, ShardId};

/// What woke the batch loop.
enum Event {
    /// The lease is gone: lost, or its validity ran out while records were out.
    Lost,
    /// A graceful stop: the worker stops, or another worker asked for the lease.
    Stop,
    /// Records acknowledged later finished (or the checkpoint interval passed).
    Acked,
    /// Time to refresh the metrics and the progress the coordinator sees.
    Tick,
    /// Nothing was fetched for `empty_batch_interval`.
    Quiet,
    /// The fetcher's next batch (or its failure; `None` if it stopped).
    Fetched(Option<Fetched>),
}

/// What the batch loop keeps between events.
struct Batches {
    metrics: ShardMetrics,
    /// The failure policy, when it handles failures in place (see [`walk`](super::walk)).
    failure: Option<Handling>,
    passed: Passed,
    refresh: Interval,
    quiet_after: Option<std::time::Duration>,
    quiet_at: Option<Instant>,
    /// The shard's last batch was delivered: it ends, with these children, once every
    /// record finished.
    ending: Option<Vec<ShardId>>,
}

/// Feeds fetched batches to the processor until the shard ends or the attempt must stop:
/// see the module docs. A graceful stop returns [`Stop::Graceful`] with records maybe still
/// out (`attempt` drains them).
pub(super) async fn run<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Tenure,
    control: &Control,
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    acks: &mut Acks,
    mut prefetch: Prefetcher,
) -> Result<Stop, Failure> {
    let mut batches = Batches::new(ctx, tenure, control);
    loop {
        if let Some(children) = batches.ending.take_if(|_| acks.all_finished()) {
            checkpointer.set_shard_end(children);
            return Ok(Stop::ShardEnd);
        }
        match batches.next(tenure, control, acks, &mut prefetch).await {
            Event::Lost => return Ok(Stop::Lost),
            Event::Stop => return Ok(Stop::Graceful),
            Event::Acked => {
                let settled = acks.settle(checkpointer).await;
                writes_seen(control, checkpointer);
                if let Some(stop) = settled? {
                    return Ok(stop);
                }
                batches.passed.note(control, checkpointer);
                observe(control, tenure, checkpointer).await;
            }
            Event::Tick => {
                batches.metrics.refresh();
                acks.report(&batches.metrics);
                writes_seen(control, checkpointer);
                observe(control, tenure, checkpointer).await;
            }
            Event::Quiet => {
                let delivered = deliver_nothing(tenure, processor, checkpointer).await;
                writes_seen(control, checkpointer);
                match delivered? {
                    Hook::Expired => return Ok(Stop::Lost),
                    Hook::Stopped => return Ok(Stop::Graceful),
                    Hook::Done => {}
                }
            }
            Event::Fetched(fetched) => {
                let batch = match received(ctx, tenure, control, checkpointer, fetched).await? {
                    Ok(batch) => batch,
                    Err(stop) => return Ok(stop),
                };
                let handed = hand_over(
                    &mut batches,
                    (tenure, control),
                    processor,
                    checkpointer,
                    batch,
                );
                let handed = handed.await;
                writes_seen(control, checkpointer);
                match handed? {
                    Handed::Lost => return Ok(Stop::Lost),
                    Handed::Stopped => return Ok(Stop::Graceful),
                    Handed::Last(children) => batches.ending = Some(children),
                    Handed::Batch => {}
                }
                batches.passed.note(control, checkpointer);
            }
        }
    }
}

impl Batches {
    fn new<S>(ctx: &ShardContext<S, impl Sized>, tenure: &Tenure, control: &Control) -> Self {
        let quiet_after = ctx.config.empty_batch_interval;
        let policy = &ctx.config.failure;
        let failure = policy
            .in_place()
            .then(|| Handling::new(policy.clone(), ctx.origin(tenure, control)));
        Self {
            metrics: ShardMetrics::new(tenure.shard()),
            failure,
            passed: Passed::default(),
            refresh: tokio::time::interval(ctx.config.taker_interval),
            quiet_after,
            quiet_at: quiet_after.map(|d| Instant::now() + d),
            ending: None,
        }
    }

    /// Waits for the next event, the first of them that is ready in the order of [`Event`].
    async fn next(
        &mut self,
        tenure: &Tenure,
        control: &Control,
        acks: &Acks,
        prefetch: &mut Prefetcher,
    ) -> Event {
        let quiet_at = self.quiet_at;
        let quiet = async {
            match quiet_at {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let reading = self.ending.is_none() && acks.room();
        let in_flight = !acks.all_finished() && !mutation::on(Mutation::SkipValidityCheck);
        let event = tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => Event::Lost,
            // Records still run between hooks: they end with the lease's validity, as hooks do.
            () = tenure.expired(), if in_flight => {
                tenure.mark_lost();
                Event::Lost
            }
            () = control.graceful.cancelled() => Event::Stop,
            () = acks.changed() => Event::Acked,
            fetched = prefetch.recv(), if reading => Event::Fetched(fetched),
            _ = self.refresh.tick() => Event::Tick,
            () = quiet => Event::Quiet,
        };
        if matches!(event, Event::Fetched(_) | Event::Quiet) {
            self.quiet_at = self.quiet_after.map(|d| Instant::now() + d);
        }
        event
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
    /// A graceful stop came while the failure policy waited.
    Stopped,
}

/// Hands one fetched batch to the processor, unless the lease's validity ran out.
async fn hand_over(
    batches: &mut Batches,
    (tenure, control): (&Tenure, &Control),
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
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
    let delivered = deliver(
        batches,
        (tenure, control),
        processor,
        checkpointer,
        (batch, bytes),
    );
    match delivered.await? {
        Hook::Expired => return Ok(Handed::Lost),
        Hook::Stopped => return Ok(Handed::Stopped),
        Hook::Done => {}
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

/// Tells `control` what became of the processor's checkpoint writes since the last look
/// (see `progress`: writes that keep failing make a shard failing however its batches go).
/// Looked at after every hook, and on every tick for writes made outside them.
fn writes_seen(control: &Control, checkpointer: &Checkpointer) {
    control.progress().writes(checkpointer.writes().take());
}

/// Tells `control` where the lease's checkpoint is, and the last record this attempt
/// delivered (see `progress`).
pub(super) async fn observe(control: &Control, tenure: &Tenure, checkpointer: &Checkpointer) {
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
pub(super) fn past_validity(tenure: &Tenure) -> bool {
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
    batches: &mut Batches,
    (tenure, control): (&Tenure, &Control),
    processor: &mut impl RecordProcessor,
    checkpointer: &mut Checkpointer,
    (batch, bytes): (RecordBatch, usize),
) -> Result<Hook, Failure> {
    let metrics = &mut batches.metrics;
    if let Some(millis) = batch.millis_behind_latest {
        metrics.behind_latest(millis);
    }
    if let Some(meter) = tenure.meter() {
        meter.delivering();
        if let Some(millis) = batch.millis_behind_latest {
            meter.behind(millis, batch.records.len());
        }
    }
    let previous = checkpointer.last_delivered().cloned();
    let (watermark, shard) = (checkpointer.watermark(), tenure.shard());
    let kept = skip::finished(watermark, shard, batch.records, previous.clone());
    // Records that finished before count as delivered: the checkpoint may pass them.
    let Some(last) = kept.last.clone() else {
        return Ok(Hook::Done);
    };
    checkpointer.set_last_delivered(last.clone());
    let Some(first) = kept.records.first() else {
        kept.skipped_after(checkpointer.watermark());
        return Ok(Hook::Done);
    };
    let count = kept.records.len();
    let delay = (Utc::now() - first.approximate_arrival)
        .to_std()
        .unwrap_or_default();
    let started = Instant::now();
    let outcome = match &batches.failure {
        Some(handling) => {
            let shard = (tenure, control);
            let millis = batch.millis_behind_latest;
            let call = walk::deliver(handling, shard, processor, checkpointer, &kept, millis);
            let outcome = call.await?;
            if let Hook::Done = outcome {
                // The walk ends at its last record; records after it finished before.
                checkpointer.set_last_delivered(last);
            }
            outcome
        }
        None => {
            // The batch takes its place in the watermark now, however the processor holds it.
            let watermark = checkpointer.watermark().clone();
            let millis = batch.millis_behind_latest;
            let input = kept.input(millis, &watermark, previous);
            let call = processor.process_records(input, checkpointer);
            let outcome = hook(tenure, "process_records", call).await;
            watermark.hook_returned();
            outcome?
        }
    };
    let took = started.elapsed();
    // Counted once processed, beside the busy time it cost: a batch of thousands handed over
    // at once is not a rate of thousands a second.
    if let Some(meter) = tenure.meter() {
        meter.read(count, bytes);
    }
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
