//! Fetching ahead of the processor, bounded in batches and bytes.
//!
//! A shard's fetch loop runs as its own task so that the next `GetRecords` overlaps with
//! processing. The channel holds at most `max_prefetch_batches` batches and a semaphore holds
//! `max_prefetch_bytes`: a slow processor stops the fetcher instead of growing memory. The
//! loop also owns the Kinesis failure modes of reading: throttling and transient errors back
//! off with jitter, an expired iterator is reopened after the last record read, or at the
//! pinned start before any record was read (never at `LATEST` a second time). Every call is
//! bounded by the call timeout, and holds one of the worker's `max_concurrent_reads` permits
//! while in flight: a worker holding many shards keeps as many connections and in-flight
//! responses as that, not one per shard.
//!
//! Under [`Retrieval::FanOut`](crate::Retrieval::FanOut) the same loop reads a subscription
//! instead: it pulls the next event only once the last one found room in the buffer, renews
//! the subscription after the last continuation sequence number when the source ends it (every
//! 5 minutes on Kinesis), when it fails, or when it stays silent for the call timeout (Kinesis
//! pushes an event at least every 5 seconds), and backs off when subscribing is throttled
//! (one subscription per shard and consumer every 5 seconds). `max_concurrent_reads` bounds
//! the subscribe calls, not the open subscriptions, which share the client's connections.

use std::sync::Arc;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures_util::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::sleep;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use super::{ShardContext, Start};
use crate::aggregation;
use crate::config::WorkerConfig;
use crate::error::{BackendError, ErrorKind};
use crate::lease::load::Meter;
use crate::metrics;
use crate::source::{RecordBatch, ShardIterator, ShardSource, Subscription, SubscriptionEvent};
use crate::task::bounded;
use crate::types::{
    ConsumerId, ExtendedSequenceNumber, HashKeyRange, Record, ShardId, StartingPosition,
};

/// The longest pause between throttled subscribe calls.
const SUBSCRIBE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the fetch loop hands the consumer.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// Records (never empty), or the end of the shard (`next_iterator` is `None`).
    Batch {
        batch: RecordBatch,
        bytes: usize,
        _permit: Option<OwnedSemaphorePermit>,
    },
    /// Reading failed in a way retrying here cannot fix.
    Failed(BackendError),
}

/// The receiving end; dropping it stops the fetch task.
#[derive(Debug)]
pub(crate) struct Prefetcher {
    rx: mpsc::Receiver<Fetched>,
    _task: AbortOnDropHandle<()>,
}

impl Prefetcher {
    pub(crate) fn spawn<S: ShardSource, F>(
        ctx: &ShardContext<S, F>,
        shard: ShardId,
        range: Option<HashKeyRange>,
        start: Start,
        (seed, meter): (u64, Option<Arc<Meter>>),
    ) -> Self {
        let config: &WorkerConfig = &ctx.config;
        let (tx, rx) = mpsc::channel(config.max_prefetch_batches);
        if let Some(meter) = &meter {
            meter.reads_restart();
        }
        let fetch = FetchLoop {
            source: ctx.source.clone(),
            reads: ctx.reads.clone(),
            shard,
            position: start.first,
            reopen: Some(start.reopen),
            skip_through: start.skip_through,
            range,
            tx,
            bytes: Arc::new(Semaphore::new(
                config.max_prefetch_bytes.min(Semaphore::MAX_PERMITS),
            )),
            budget: config.max_prefetch_bytes.min(u32::MAX as usize),
            max_records: config.max_records,
            idle: config.idle_time_between_reads,
            call_timeout: config.call_timeout,
            meter,
            backoff: ExponentialBuilder::default()
                .with_min_delay(config.min_backoff)
                .with_max_delay(config.max_backoff)
                .with_jitter()
                .with_jitter_seed(seed)
                .without_max_times(),
        };
        // In the shard's span, so that its logs say which shard.
        let task = match ctx.consumer.clone() {
            Some(consumer) => crate::task::spawn(fetch.subscribed(consumer).in_current_span()),
            None => crate::task::spawn(fetch.polled().in_current_span()),
        };
        Self {
            rx,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The next batch; `None` if the fetch loop is gone.
    pub(crate) async fn recv(&mut self) -> Option<Fetched> {
        self.rx.recv().await
    }
}

struct FetchLoop<S> {
    source: Arc<S>,
    /// The worker's permits for reads in flight.
    reads: Arc<Semaphore>,
    shard: ShardId,
    /// Where to open an iterator: the start, then just after the last record read.
    position: StartingPosition,
    /// Where to reopen before any record was read; taken at the first open.
    reopen: Option<StartingPosition>,
    /// Records at or before this were processed before (the checkpoint): dropped. Cleared
    /// at the first record after it.
    skip_through: Option<ExtendedSequenceNumber>,
    /// The shard's hash-key range, if the lease knows it: KPL aggregates holding user
    /// records outside it are dropped (see [`crate::aggregation`]).
    range: Option<HashKeyRange>,
    tx: mpsc::Sender<Fetched>,
    bytes: Arc<Semaphore>,
    budget: usize,
    max_records: u32,
    idle: std::time::Duration,
    call_timeout: std::time::Duration,
    /// The lease's meter: a read that came back empty while nothing waits to be delivered
    /// says the shard is at the tip with nothing arriving (its batches are not passed on).
    meter: Option<Arc<Meter>>,
    backoff: ExponentialBuilder,
}

impl<S: ShardSource> FetchLoop<S> {
    /// Reads with `GetRecords`.
    async fn polled(mut self) {
        let mut iterator: Option<ShardIterator> = None;
        let mut delays = self.backoff.build();
        loop {
            let it = match iterator.take() {
                Some(it) => it,
                None => match self.open().await {
                    Ok(it) => it,
                    Err(e) => {
                        if !self.pause_after(e, &mut delays, None).await {
                            return;
                        }
                        continue;
                    }
                },
            };
            let read = {
                let _turn = self.reads.acquire().await;
                let read = self.source.get_records(&it, self.max_records);
                bounded(self.call_timeout, "get_records", read).await
            };
            match read {
                Ok(mut batch) => {
                    delays = self.backoff.build();
                    if let Some(last) = batch.records.last() {
                        self.position =
                            StartingPosition::AfterSequence(last.sequence_number.clone());
                    }
                    batch.records = self.user_records(std::mem::take(&mut batch.records));
                    iterator = batch.next_iterator.clone();
                    let empty = batch.records.is_empty();
                    if !self.pass_on(batch).await || iterator.is_none() {
                        return;
                    }
                    if empty {
                        sleep(self.idle).await;
                    }
                }
                Err(e) if e.kind() == ErrorKind::ExpiredIterator => {
                    // Reopen after the last record read; back off in case it keeps expiring.
                    if !self.pause_after(e, &mut delays, None).await {
                        return;
                    }
                }
                Err(e) => {
                    iterator = Some(it);
                    if !self.pause_after(e, &mut delays, None).await {
                        return;
                    }
                }
            }
        }
    }

    /// Reads with `SubscribeToShard` (see the module docs).
    async fn subscribed(mut self, consumer: ConsumerId) {
        let mut delays = self.backoff.build();
        loop {
            let mut events = match self.subscribe(&consumer).await {
                Ok(events) => events,
                Err(e) => {
                    // A transient failure is most likely the shard's previous owner having
                    // subscribed less than 5 s ago, or its subscription still open (a
                    // handoff): try again every second rather than back off further.
                    let longest = e.kind().is_transient().then_some(SUBSCRIBE_RETRY);
                    if !self.pause_after(e, &mut delays, longest).await {
                        return;
                    }
                    continue;
                }
            };
            loop {
                match tokio::time::timeout(self.call_timeout, events.next()).await {
                    Ok(Some(Ok(event))) => {
                        delays = self.backoff.build();
                        let end = event.continuation.is_none();
                        let batch = self.batch_of(event);
                        if !self.pass_on(batch).await || end {
                            return;
                        }
                    }
                    Ok(Some(Err(e))) => {
                        drop(events);
                        if !self.pause_after(e, &mut delays, None).await {
                            return;
                        }
                        break;
                    }
                    // Ended by the source (its lifetime is over): renew at once.
                    Ok(None) => {
                        tracing::info!(from = %self.position, "subscription ended; renewing it");
                        break;
                    }
                    Err(_) => {
                        tracing::debug!("the subscription went silent; renewing it");
                        break;
                    }
                }
            }
        }
    }

    /// An event as a batch: its user records, and its continuation as the place to go on.
    fn batch_of(&mut self, event: SubscriptionEvent) -> RecordBatch {
        if let Some(continuation) = &event.continuation {
            self.position = StartingPosition::AfterSequence(continuation.clone());
        }
        RecordBatch {
            records: self.user_records(event.records),
            // Only its presence matters to the consumer: `None` is the shard's end.
            next_iterator: event
                .continuation
                .map(|c| ShardIterator(c.as_str().to_owned())),
            millis_behind_latest: event.millis_behind_latest,
            child_shards: event.child_shards,
        }
    }

    /// Hands a batch to the consumer if it has records or ends the shard, once the buffer has
    /// room for it. False if the consumer is gone.
    async fn pass_on(&self, batch: RecordBatch) -> bool {
        if batch.records.is_empty() && batch.next_iterator.is_some() {
            let caught_up = self.tx.capacity() == self.tx.max_capacity();
            if let (Some(meter), Some(millis), true) =
                (&self.meter, batch.millis_behind_latest, caught_up)
            {
                meter.behind(millis, 0);
            }
            return true;
        }
        let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
        let want = u32::try_from(bytes.clamp(1, self.budget)).unwrap_or(u32::MAX);
        if let Some(meter) = &self.meter {
            let span = match (batch.records.first(), batch.records.last()) {
                (Some(first), Some(last)) => (last.approximate_arrival - first.approximate_arrival)
                    .to_std()
                    .unwrap_or_default(),
                _ => std::time::Duration::ZERO,
            };
            meter.fetched(batch.millis_behind_latest, span);
        }
        let permit = self.bytes.clone().acquire_many_owned(want).await.ok();
        self.tx
            .send(Fetched::Batch {
                batch,
                bytes,
                _permit: permit,
            })
            .await
            .is_ok()
    }

    /// The user records of what was read (KPL aggregates split, see [`crate::aggregation`]),
    /// without those the checkpoint covers.
    fn user_records(&mut self, records: Vec<Record>) -> Vec<Record> {
        let mut records = aggregation::deaggregate_for_shard(records, self.range.as_ref());
        if let Some(done) = &self.skip_through {
            records.retain(|r| r.position() > *done);
            if !records.is_empty() {
                self.skip_through = None;
            }
        }
        records
    }

    /// Opens an iterator at the current position. Whatever the outcome, the first open is
    /// the last one at the start position: later ones use the pinned `reopen` position.
    async fn open(&mut self) -> Result<ShardIterator, BackendError> {
        let result = {
            let _turn = self.reads.acquire().await;
            let call = self.source.shard_iterator(&self.shard, &self.position);
            bounded(self.call_timeout, "shard_iterator", call).await
        };
        if let Some(reopen) = self.reopen.take() {
            self.position = reopen;
        }
        result
    }

    /// Subscribes at the current position; like [`open`](Self::open), the first subscription
    /// is the last one at the start position.
    async fn subscribe(&mut self, consumer: &ConsumerId) -> Result<Subscription, BackendError> {
        let result = {
            let _turn = self.reads.acquire().await;
            let call = self.source.subscribe(consumer, &self.shard, &self.position);
            bounded(self.call_timeout, "subscribe", call).await
        };
        if let Some(reopen) = self.reopen.take() {
            self.position = reopen;
        }
        result
    }

    /// Sleeps before a retry (at most `longest`, if given); reports a permanent failure and
    /// returns false.
    async fn pause_after(
        &self,
        error: BackendError,
        delays: &mut ExponentialBackoff,
        longest: Option<std::time::Duration>,
    ) -> bool {
        match error.kind() {
            ErrorKind::Throttled | ErrorKind::Retryable | ErrorKind::ExpiredIterator => {
                if error.kind() == ErrorKind::Throttled {
                    ::metrics::counter!(metrics::THROTTLED, "operation" => error.operation())
                        .increment(1);
                }
                tracing::debug!(%error, "read failed; backing off");
                let delay = delays.next().unwrap_or(self.idle);
                sleep(longest.map_or(delay, |most| delay.min(most))).await;
                true
            }
            _ => {
                let _ = self.tx.send(Fetched::Failed(error)).await;
                false
            }
        }
    }
}
