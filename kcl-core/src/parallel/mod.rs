//! Per-key parallelism: up to N records of one shard in flight, in order per key.
//!
//! One shard's records arrive in one sequence. When each record costs I/O (an HTTP call, a
//! database write), handling them one after another caps a shard at 1 / latency records a
//! second, however many cores the worker has. Most applications only need order among the
//! records of one key (an account, a device, an order id): [`Parallel`] runs a per-record
//! async handler on up to `max_in_flight` records at once, never two of one key at once, each
//! key in sequence order — what AWS Lambda's *parallelization factor* and Confluent's
//! Parallel Consumer do.
//!
//! It builds on asynchronous acknowledgement ([`ack`](crate::ack)): each record is
//! acknowledged when its handler returns `Ok`, so checkpoints stop at the watermark (never
//! past a record still running or waiting for its key), the worker checkpoints as records
//! finish, reading pauses at [`max_unacknowledged`](crate::WorkerConfig::max_unacknowledged)
//! waiting records, and a graceful stop or handoff waits for what runs before it checkpoints.
//!
//! **Failures.** A handler that returns an error or panics fails its record: nothing more
//! starts, the shard restarts from the watermark after the usual backoff, and the failed
//! record and every one after it are delivered again (at least once). No later record of
//! its key ran: the key waits for its failed record.
//!
//! **Hot keys.** One key runs one record at a time: with a few keys carrying most records,
//! the speed-up is bounded by those keys (`docs/benchmarks.md` measures it).

mod dispatch;

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use crate::ack::Ack;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::processor::{ProcessRecordsInput, ProcessorFactory, RecordProcessor};
use crate::types::{Record, ShardId, stable_hash};

/// Handles one record; the per-record work of [`Parallel`].
///
/// Any `Fn(Record) -> impl Future<Output = Result<(), BoxError>>` is a handler. It is shared
/// by every shard of the worker and runs concurrently with itself: keep its state behind
/// `Arc`s or in the systems it writes to.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles `record`; `Ok` once its work is done (durable), for it is then checkpointed.
    fn handle(&self, record: Record) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl<F, Fut> RecordHandler for F
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    fn handle(&self, record: Record) -> impl Future<Output = Result<(), BoxError>> + Send {
        self(record)
    }
}

/// The ordering key of a record, hashed.
type KeyFn = Arc<dyn Fn(&Record) -> u64 + Send + Sync>;

/// A [`ProcessorFactory`] that runs a [`RecordHandler`] on up to `max_in_flight` records of
/// each shard at once, in order per key; see the [module docs](self).
///
/// ```
/// use kcl_core::{BoxError, Parallel, Record};
///
/// let factory = Parallel::new(|record: Record| async move {
///     // e.g. an HTTP call per record
///     let _ = record.data.len();
///     Ok::<(), BoxError>(())
/// })
/// .max_in_flight(10);
/// # let _ = factory;
/// ```
pub struct Parallel<H> {
    handler: Arc<H>,
    max_in_flight: usize,
    key: KeyFn,
}

impl<H> std::fmt::Debug for Parallel<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parallel")
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl<H: RecordHandler> Parallel<H> {
    /// Runs `handler` on up to 10 records of a shard at once (Lambda's largest
    /// parallelization factor), keyed by partition key.
    pub fn new(handler: H) -> Self {
        Self {
            handler: Arc::new(handler),
            max_in_flight: 10,
            key: Arc::new(|record: &Record| stable_hash(&record.partition_key)),
        }
    }

    /// Records of one shard in flight at once; 1 handles them one by one, in order. 0 is
    /// taken as 1.
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Orders records by `key` instead of the partition key: records with equal keys run one
    /// at a time, in sequence order. (Keys are hashed to 64 bits; two keys that collide are
    /// ordered together, which costs parallelism, never order.)
    #[must_use]
    pub fn key_by<K: Hash>(mut self, key: impl Fn(&Record) -> K + Send + Sync + 'static) -> Self {
        self.key = Arc::new(move |record: &Record| stable_hash(key(record)));
        self
    }
}

impl<H: RecordHandler> ProcessorFactory for Parallel<H> {
    type Processor = ParallelProcessor<H>;

    fn create(&self, shard: &ShardId) -> ParallelProcessor<H> {
        let _ = shard;
        ParallelProcessor {
            settings: Self {
                handler: self.handler.clone(),
                max_in_flight: self.max_in_flight,
                key: self.key.clone(),
            },
            dispatcher: None,
        }
    }
}

/// The dispatcher task of one processor, and where records go to it.
type Dispatcher = (mpsc::UnboundedSender<(Record, Ack)>, AbortOnDropHandle<()>);

/// One shard's processor under [`Parallel`]: hands each record to a dispatcher task that
/// runs the handler. Dropping it (lease lost, a restart) cancels what is in flight.
pub struct ParallelProcessor<H> {
    /// The factory's handler and settings.
    settings: Parallel<H>,
    dispatcher: Option<Dispatcher>,
}

impl<H> std::fmt::Debug for ParallelProcessor<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParallelProcessor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<H: RecordHandler> ParallelProcessor<H> {
    fn sender(&mut self) -> &mpsc::UnboundedSender<(Record, Ack)> {
        let (tx, _) = self.dispatcher.get_or_insert_with(|| {
            // Unbounded: the worker bounds what is handed out (`max_unacknowledged`).
            let (tx, rx) = mpsc::unbounded_channel();
            let Parallel {
                handler,
                max_in_flight,
                key,
            } = &self.settings;
            let run = dispatch::run(rx, handler.clone(), *max_in_flight, key.clone());
            let task = crate::task::spawn(run.in_current_span());
            (tx, AbortOnDropHandle::new(task))
        });
        tx
    }
}

impl<H: RecordHandler> RecordProcessor for ParallelProcessor<H> {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if input.records().is_empty() {
            return Ok(());
        }
        let sender = self.sender().clone();
        for pair in input.acknowledge_later() {
            // A closed channel drops the Ack: a failure, so the shard restarts.
            let _ = sender.send(pair);
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.dispatcher = None;
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        // The watermark so far; the worker then waits for what is in flight and writes it
        // again.
        checkpointer.checkpoint().await?;
        Ok(())
    }
}
