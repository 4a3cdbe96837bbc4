//! One processor instance, top to bottom: settle the last attempt's write, wait for the
//! parents, open the shard and `initialize`, process batches (`batches`), drain what is in
//! flight on a graceful stop, and the last hook (`shutdown_requested`, `shard_ended` or
//! `lease_lost`). A failure returns at once; `shard_consumer` restarts a new processor.

use std::sync::Arc;

use tokio::time::sleep;

use super::acks::Acks;
use super::batches;
use super::position::{self, Opened, Start};
use super::prefetch::Prefetcher;
use super::{Control, Failure, Hook, ShardContext, Stop, hook};
use crate::checkpoint::Checkpointer;
use crate::lease::tenure::{Tenure, TenureError};
use crate::lease::{CheckpointUpdate, Lease};
use crate::mutation::{self, Mutation};
use crate::processor::{InitializationInput, RecordProcessor};
use crate::source::ShardSource;
use crate::task::bounded;

/// Runs one processor instance; see the module docs.
pub(super) async fn run<S: ShardSource, P: RecordProcessor>(
    ctx: &ShardContext<S, impl Sized>,
    tenure: &Arc<Tenure>,
    control: &Control,
    mut processor: P,
    seed: u64,
) -> Result<Stop, Failure> {
    // 1. A write of the last attempt may have applied unanswered: settle it first, or this
    //    one would start from a checkpoint the row has left behind.
    match tenure.settle().await {
        Ok(()) => {}
        Err(TenureError::Store(e)) => return Err(Failure::Settle(e)),
        Err(_) => return Ok(Stop::Lost),
    }
    // 2. Parents first; keys they parked stay parked here.
    let inherited = match wait_for_parents(ctx, tenure, control).await {
        Ok(parked) => parked,
        Err(stop) => return Ok(stop),
    };
    if let Some(stop) = inherit(tenure, inherited).await? {
        return Ok(stop);
    }
    // 3. Where to start, and `initialize`.
    let (lease, start) = match initialize(ctx, (tenure, control), &mut processor).await? {
        Ok(opened) => opened,
        Err(stop) => return Ok(stop),
    };
    // 4. Batches, until the shard ends or something stops them.
    let mut checkpointer = Checkpointer::new(tenure.clone());
    checkpointer.sink.clone_from(&ctx.positions);
    checkpointer
        .watermark()
        .count_successes(control.failures.clone());
    checkpointer.opened.clone_from(&start.skip_through);
    super::skip::open(checkpointer.watermark(), &lease);
    let mut acks = Acks::new(&ctx.config, &checkpointer);
    let meter = tenure.shared_meter();
    let range = lease.hash_key_range;
    let prefetch = Prefetcher::spawn(ctx, lease.key.clone(), range, start, (seed, meter));
    let (held, cp) = (&mut processor, &mut checkpointer);
    let stop = match batches::run(ctx, tenure, control, held, cp, &mut acks, prefetch).await {
        // 5. A graceful stop waits for the records in flight.
        Ok(Stop::Graceful) => drain(tenure, control, held, cp, &mut acks).await?,
        Ok(stop) => stop,
        Err(Failure::Fatal(error)) => {
            // The shard waits for a fix: let the processor checkpoint what it did first.
            let call = processor.shutdown_requested(&mut checkpointer);
            let _ = hook(tenure, "shutdown_requested", call).await;
            return Err(Failure::Fatal(error));
        }
        Err(failure) => {
            // What this attempt was handed waits for the next one.
            batches::observe(control, tenure, &checkpointer).await;
            return Err(failure);
        }
    };
    // 6. The hook that goes with why it stopped.
    finish(stop, tenure, control, &mut processor, &mut checkpointer).await
}

/// Opens the shard where its lease says and calls `initialize`: the lease as read and the
/// start, or why the attempt stops before it processes anything.
async fn initialize<S: ShardSource>(
    ctx: &ShardContext<S, impl Sized>,
    (tenure, control): (&Arc<Tenure>, &Control),
    processor: &mut impl RecordProcessor,
) -> Result<Result<(Lease, Start), Stop>, Failure> {
    if let Some(stop) = super::sink::open(ctx, tenure).await? {
        return Ok(Err(stop));
    }
    let lease = tenure.snapshot().await;
    let start = match position::open(ctx, tenure, &lease).await? {
        Opened::Finished => return Ok(Err(Stop::Finished)),
        Opened::Lost => return Ok(Err(Stop::Lost)),
        Opened::At(start) => start,
    };
    let input = InitializationInput {
        shard_id: lease.key.clone(),
        checkpoint: lease.checkpoint.clone(),
        pending_checkpoint: lease.pending_checkpoint.clone(),
        fencing_token: tenure.fence(),
        origin: Some(crate::failure::Origin {
            row: Some(Arc::new(super::TenureRow(Arc::downgrade(tenure)))),
            ..ctx.origin(tenure, control)
        }),
        parked_keys: lease.parked_keys.clone(),
    };
    if let Hook::Expired = hook(tenure, "initialize", processor.initialize(&input)).await? {
        return lost(processor).await.map(Err);
    }
    tracing::info!(checkpoint = %lease.checkpoint, "processing shard");
    Ok(Ok((lease, start)))
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
                Ok(Hook::Done | Hook::Stopped) => Ok(Stop::Graceful),
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

/// A graceful stop or a handoff while reading, before the last hook. With records still out to be acknowledged,
/// the processor hears `shutdown_requested` first — one that keeps its `Ack`s to finish them
/// in a later hook finishes them there — and then the worker waits for what is in flight
/// and checkpoints the watermark; otherwise the worker checkpoints the watermark and the
/// hook comes last, as ever.
async fn drain(
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
) -> Result<Vec<String>, Stop> {
    let lease = tenure.snapshot().await;
    let mut parked = Vec::new();
    if mutation::on(Mutation::ForgetLineage) {
        return Ok(parked);
    }
    for parent in &lease.parent_shard_ids {
        loop {
            let read = bounded(ctx.config.call_timeout, "get", tenure.store().get(parent));
            match read.await {
                Ok(None) => break,
                Ok(Some(p)) if p.is_finished() => {
                    // The parks, not a redrive's request (the admin asks each open row).
                    let parks = p.parked_keys.into_iter().filter(|e| {
                        !matches!(
                            crate::failure::parse_entry(e),
                            Some(crate::failure::Entry::Redrive { .. })
                        )
                    });
                    parked.extend(parks);
                    break;
                }
                Ok(Some(_)) => {}
                Err(error) => tracing::debug!(%error, %parent, "reading parent lease failed"),
            }
            tokio::select! {
                biased;
                () = tenure.lost_token().cancelled() => return Err(Stop::Lost),
                () = control.graceful.cancelled() => return Err(Stop::Graceful),
                () = sleep(ctx.config.parent_poll_interval) => {}
            }
        }
    }
    Ok(parked)
}

/// Writes into this shard's row the keys its parents parked (`Parallel::park_keys`: a key
/// parked in a parent stays parked in its children), unless the row has them already.
async fn inherit(tenure: &Tenure, parked: Vec<String>) -> Result<Option<Stop>, Failure> {
    let lease = tenure.snapshot().await;
    let missing: Vec<String> = parked
        .into_iter()
        .filter(|entry| !lease.parked_keys.contains(entry))
        .collect();
    if missing.is_empty() {
        return Ok(None);
    }
    let mut update = CheckpointUpdate::new(lease.checkpoint.clone());
    update.pending = lease.pending_checkpoint.clone();
    update.park = missing;
    update.acked.clone_from(&lease.acked);
    match tenure.checkpoint(&update).await {
        Ok(_) => Ok(None),
        Err(TenureError::Store(e)) => Err(Failure::Inherit(e)),
        Err(_) => Ok(Some(Stop::Lost)),
    }
}
