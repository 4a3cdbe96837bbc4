//! One task per held lease: feed its processor in order, next to a task that renews it.
//!
//! Read it top to bottom: [`run`] starts the renewer and runs processors one after another
//! (`attempts`), then hands the lease back (`hand_back`). One processor's life is
//! [`attempt`]: settle, parents, open and `initialize`, batches, drain, last hook. What
//! happens to each batch — fetch ([`prefetch`]), deliver, acknowledgements ([`acks`]),
//! checkpoint, end of shard — is [`batches`]. The coordinator steers the task, and sees its
//! progress, through [`Control`].
//!
//! The task stops for one of four reasons: the shard ended (checkpointed `SHARD_END`), the
//! lease was lost (`lease_lost`, no checkpoint possible), the worker is stopping
//! (`shutdown_requested`, then the lease is released at once, or under a
//! [`restart_grace`](crate::WorkerConfig::restart_grace) kept for the worker's return) or
//! another worker asked for the lease (`shutdown_requested`, then the lease is handed to it).
//!
//! Why it is built this way:
//! - **The renewer is a task of its own.** A processor that blocks its thread (CPU work,
//!   synchronous I/O) stops only its own task; on a multi-thread runtime the renewer keeps
//!   the lease, so no other worker takes the shard while the batch runs.
//! - **Hooks end at the lease's validity.** Once the lease could be held elsewhere
//!   ([`Tenure::expired`]), a processor hook still running is dropped at its next `.await`
//!   and the processor gets `lease_lost`: two processors never work on one shard at once,
//!   unless one blocks its thread past that point (then only its checkpoints are refused).
//! - **A processor that fails or panics is dropped**; after a backoff a new one starts from
//!   the last checkpoint, while the lease stays held and renewed; a shard whose attempts
//!   keep failing without progress is reported ([`progress`]: `failing`, and `stalled` while
//!   records wait past a checkpoint that does not move). A read that fails is
//!   handled the same way, and counted as the stream's failure, not the processor's. A read
//!   that retrying cannot fix (access denied, a disabled key, a checkpoint the stream does
//!   not have) is retried too, at the backoff's pace, and reported as the shard's problem
//!   ([`Control::read_failing`]): the lease stays here, so no other worker fails on it as
//!   well, and a fix (`kcl-admin reset` moves the checkpoint, and takes the lease away) is
//!   picked up. A shard the stream no longer has (aged out of retention) is treated as
//!   ended, so its children start.

mod acks;
mod attempt;
mod batches;
mod control;
mod position;
mod prefetch;
mod progress;
mod sink;
mod skip;
mod walk;

pub(crate) use control::Control;
pub(crate) use position::Start;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::FutureExt;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::config::WorkerConfig;
use crate::error::{BackendError, BoxError};
use crate::failure::{DeadLetters, Origin};
use crate::lease::renewer;
use crate::lease::tenure::Tenure;
use crate::metrics;
use crate::outputs::Sink;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::types::{ConsumerId, ShardId, WorkerId};

/// What every shard task of a worker shares.
#[derive(Debug)]
pub(crate) struct ShardContext<S, F> {
    pub(crate) source: Arc<S>,
    pub(crate) factory: Arc<F>,
    pub(crate) config: Arc<WorkerConfig>,
    /// The worker's reads in flight ([`WorkerConfig::max_concurrent_reads`]).
    pub(crate) reads: Arc<tokio::sync::Semaphore>,
    /// The registered fan-out consumer, under [`Retrieval::FanOut`](crate::Retrieval).
    pub(crate) consumer: Option<ConsumerId>,
    /// Where the worker's dead letters go (see [`failure`](crate::failure)).
    pub(crate) dead_letters: Option<DeadLetters>,
    /// The sink that keeps shards' positions, fenced and read on every open.
    pub(crate) positions: Option<Sink>,
    /// Cancelled when the worker drains ([`ShutdownHandle::drain`](crate::ShutdownHandle::drain)):
    /// leases are released, never kept for a restart.
    pub(crate) drain: CancellationToken,
}

impl<S, F> ShardContext<S, F> {
    pub(crate) fn new(
        source: Arc<S>,
        factory: Arc<F>,
        config: Arc<WorkerConfig>,
        consumer: Option<ConsumerId>,
    ) -> Self {
        let reads = config
            .max_concurrent_reads
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        Self {
            source,
            factory,
            config,
            reads: Arc::new(tokio::sync::Semaphore::new(reads)),
            consumer,
            dead_letters: None,
            positions: None,
            drain: CancellationToken::new(),
        }
    }

    /// Leases are released, whatever `restart_grace` says, once `drain` is cancelled.
    pub(crate) fn drain_on(mut self, drain: CancellationToken) -> Self {
        self.drain = drain;
        self
    }

    /// The worker's shards keep their positions in `sink` too.
    pub(crate) fn positions(mut self, sink: Option<Sink>) -> Self {
        self.positions = sink;
        self
    }

    /// The worker's dead letters go to `letters`.
    pub(crate) fn dead_letters(mut self, letters: Option<DeadLetters>) -> Self {
        self.dead_letters = letters;
        self
    }

    /// Where the dead letters of `tenure`'s shard come from and go; what happens is told
    /// to `control`.
    pub(crate) fn origin(&self, tenure: &Tenure, control: &Control) -> Origin {
        if crate::mutation::on(crate::mutation::Mutation::OutageRunPerProcessor) {
            // The bug: each processor (a restart within the tenure) counts the run anew.
            control.failures.succeeded();
        }
        Origin {
            letters: self.dead_letters.clone(),
            worker: tenure.worker().clone(),
            shard: tenure.shard().clone(),
            stream: crate::multi_stream::StreamId::split_key(tenure.shard()).map(|(id, _)| id.name),
            tally: control.failures.clone(),
            call_timeout: self.config.call_timeout,
            row: None,
            poll: self.config.renew_interval,
        }
    }
}

/// Why a shard task ended.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The shard was processed to its end (or no longer exists in the stream).
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
    /// Graceful, and `shutdown_requested` was called already (before the wait for records
    /// in flight).
    Drained,
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
    #[error("pinning the start position in the lease failed")]
    Pin(#[source] BackendError),
    #[error("writing the keys its parents parked into the lease failed")]
    Inherit(#[source] BackendError),
    #[error("settling a lease write whose outcome is unknown failed")]
    Settle(#[source] BackendError),
    #[error("fencing the sink that keeps the shard's position, or reading it, failed")]
    Positions(#[source] BackendError),
    #[error("shard_ended returned without checkpointing SHARD_END")]
    ShardEndNotCheckpointed,
    /// Retrying cannot fix it: restarted at the backoff's pace, and reported.
    #[error("reading the shard failed; retrying cannot fix it")]
    Fatal(#[source] BackendError),
}

impl Failure {
    /// The metric a restart for this failure counts in.
    fn counted_in(&self) -> &'static str {
        match self {
            Self::Processor { .. } | Self::Panic { .. } | Self::ShardEndNotCheckpointed => {
                metrics::PROCESSOR_FAILURES
            }
            Self::Source(_)
            | Self::Pin(_)
            | Self::Inherit(_)
            | Self::Settle(_)
            | Self::Positions(_)
            | Self::Fatal(_) => metrics::READ_FAILURES,
        }
    }
}

/// Runs the shard until it stops; see the module docs.
pub(crate) async fn run<S: ShardSource, F: ProcessorFactory>(
    ctx: Arc<ShardContext<S, F>>,
    tenure: Arc<Tenure>,
    control: Arc<Control>,
) -> Exit {
    // A derived tenure lives on the worker's heartbeat: nothing to renew here, but its row's
    // parked keys are read back as a renewal would.
    let interval = ctx.config.renew_interval;
    let _renewer = if tenure.is_derived() {
        let limit = ctx.config.call_timeout;
        let watch = renewer::watch_parked(tenure.clone(), interval, limit).in_current_span();
        AbortOnDropHandle::new(crate::task::spawn(watch))
    } else {
        let renewer = renewer::run(tenure.clone(), interval).in_current_span();
        AbortOnDropHandle::new(crate::task::spawn(renewer))
    };
    let exit = consume(&ctx, &tenure, &control).await;
    tenure.mark_lost(); // ends the tenure: no write may follow the task
    exit
}

/// One processor after another until one stops for good, then the lease handed back.
async fn consume<S: ShardSource, F: ProcessorFactory>(
    ctx: &ShardContext<S, F>,
    tenure: &Arc<Tenure>,
    control: &Control,
) -> Exit {
    let stop = attempts(ctx, tenure, control).await;
    // Read at the handback: a drain asked for during the stop still releases.
    let grace = (ctx.config.restart_grace).filter(|_| !ctx.drain.is_cancelled());
    hand_back(stop, tenure, control, grace).await
}

/// Runs processors one after another, each from the last checkpoint, with a backoff after
/// each failure, until one stops for good (see [`Stop`]).
async fn attempts<S: ShardSource, F: ProcessorFactory>(
    ctx: &ShardContext<S, F>,
    tenure: &Arc<Tenure>,
    control: &Control,
) -> Stop {
    let seed = crate::types::stable_hash((tenure.worker(), tenure.shard()));
    let mut restarts = ExponentialBuilder::default()
        .with_min_delay(ctx.config.min_backoff.max(Duration::from_millis(500)))
        .with_max_delay(ctx.config.max_backoff.max(Duration::from_secs(1)))
        .with_jitter()
        .with_jitter_seed(seed)
        .without_max_times()
        .build();
    loop {
        let processor = ctx.factory.create(tenure.shard());
        let failure = match attempt::run(ctx, tenure, control, processor, seed).await {
            Ok(stop) => return stop,
            Err(failure) => failure,
        };
        ::metrics::counter!(failure.counted_in()).increment(1);
        let delay = restarts.next().unwrap_or(ctx.config.max_backoff);
        let error = crate::error::error_chain(&failure);
        if let Failure::Fatal(source) = &failure {
            // Logged once, as a problem, by the coordinator; then at debug level.
            control.set_read_failing(Some(source.to_string()));
            tracing::debug!(%error, ?delay, "reading the shard fails; retrying later");
        } else {
            tracing::warn!(%error, ?delay, "shard failed; restarting from the last checkpoint");
            control.progress().failed(error);
        }
        tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return Stop::Lost,
            () = control.graceful.cancelled() => return Stop::Graceful,
            () = sleep(delay) => {}
        }
    }
}

/// Hands the lease back as `stop` says: released (to its handoff target, if any; kept for
/// this worker's restart under a `restart_grace`), tidied after the shard's end, or nothing
/// when it is lost.
async fn hand_back(
    stop: Stop,
    tenure: &Tenure,
    control: &Control,
    restart_grace: Option<Duration>,
) -> Exit {
    match stop {
        Stop::Lost => Exit::Lost,
        Stop::Finished | Stop::ShardEnd => {
            // The finished lease is never processed again; releasing it just tidies the row.
            let _ = tenure.release().await;
            Exit::ShardEnd
        }
        Stop::Graceful | Stop::Drained => {
            let result = match control.handoff_target() {
                Some(to) => {
                    tracing::info!(to = %to, "handing the lease over");
                    tenure.hand_off(&to).await
                }
                None => match restart_grace {
                    Some(grace) => {
                        tracing::info!(?grace, "keeping the lease for this worker's restart");
                        tenure.keep_for_restart(grace).await
                    }
                    None => tenure.release().await,
                },
            };
            match result {
                Ok(()) => {
                    ::metrics::counter!(crate::metrics::LEASES_RELEASED).increment(1);
                    Exit::Released
                }
                Err(error) => {
                    tracing::warn!(?error, "could not hand the lease back; it will expire");
                    Exit::ReleaseFailed
                }
            }
        }
    }
}

/// How a processor hook ended.
enum Hook {
    Done,
    /// The lease's validity ran out first: the hook was dropped at its `.await`.
    Expired,
    /// A graceful stop came while the failure policy waited (a retry, a refusing sink).
    Stopped,
}

/// Runs a processor hook until it returns or the lease's validity runs out, turning its
/// error or panic into a [`Failure`].
///
/// The hook's future is boxed before anything awaits it, as backend calls are
/// (`task::bounded`): allocated while the hook runs, not kept in every shard task's state.
fn hook<'a>(
    tenure: &'a Tenure,
    name: &'static str,
    call: impl Future<Output = Result<(), BoxError>> + 'a,
) -> impl Future<Output = Result<Hook, Failure>> + 'a {
    let call = Box::pin(call);
    async move {
        match tenure
            .while_valid(AssertUnwindSafe(call).catch_unwind())
            .await
        {
            None => Ok(Hook::Expired),
            Some(Ok(Ok(()))) => Ok(Hook::Done),
            Some(Ok(Err(source))) => Err(Failure::Processor { hook: name, source }),
            Some(Err(panic)) => Err(Failure::Panic {
                hook: name,
                message: crate::task::panic_message(&*panic),
            }),
        }
    }
}

/// The span every shard task runs in.
pub(crate) fn span(shard: &ShardId, owner: &WorkerId) -> tracing::Span {
    tracing::info_span!("shard", shard.id = %shard, lease.owner = %owner)
}

/// A shard's lease row as a redrive's replay sees it ([`Row`](crate::failure::Row)): the
/// tenure, while it lasts.
#[derive(Debug)]
pub(crate) struct TenureRow(pub(crate) std::sync::Weak<Tenure>);

impl crate::failure::Row for TenureRow {
    fn entries(&self) -> Option<Vec<String>> {
        self.0.upgrade()?.parked_now()
    }

    fn unpark<'a>(
        &'a self,
        entries: &'a [String],
    ) -> futures_util::future::BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(tenure) => tenure.unpark(entries).await,
                None => Err(BackendError::new(
                    crate::ErrorKind::Conflict,
                    "unpark",
                    "the shard's tenure is over",
                )),
            }
        })
    }

    fn replace<'a>(
        &'a self,
        old: &'a str,
        new: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(tenure) => tenure.replace_entry(old, new).await,
                None => Err(BackendError::new(
                    crate::ErrorKind::Conflict,
                    "request_redrive",
                    "the shard's tenure is over",
                )),
            }
        })
    }

    fn while_valid<'a>(
        &'a self,
        work: futures_util::future::BoxFuture<'a, ()>,
    ) -> futures_util::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(tenure) => tenure.while_valid(work).await.is_some(),
                None => false,
            }
        })
    }
}
