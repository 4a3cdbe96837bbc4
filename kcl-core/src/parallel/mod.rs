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
//! held records (a record that never finishes holds at most that many and one batch behind
//! it), and a graceful stop or handoff waits for what runs before it checkpoints.
//!
//! **Failures.** By default a handler that returns an error or panics fails its record:
//! nothing more starts, the shard restarts from the watermark after the usual backoff, and
//! the failed record and every one after it that had not finished are delivered again (at
//! least once; those that finished are skipped, as the lease row lists them:
//! [sparse acknowledgements](crate::ack::SparseAcks)). No later
//! record of its key ran: the key waits for its failed record.
//!
//! With [`on_failure`](Parallel::on_failure) a failing record is retried in place instead,
//! holding only its own key (order per key kept) while every other key keeps flowing; once
//! its tries are spent it is dead-lettered or skipped and its key goes on. With
//! [`park_keys`](Parallel::park_keys) the key stops there instead: its later records are
//! dead-lettered behind it, unrun, so that a redrive replays the key in order. Go on for
//! independent records (events, notifications); park for a key whose records build on each
//! other (an account's ledger, a document's edits). See [`failure`](crate::failure).
//!
//! **Hot keys.** One key runs one record at a time: with a few keys carrying most records,
//! the speed-up is bounded by those keys (`docs/benchmarks.md` measures it).
//!
//! **Exactly-once outputs.** With [`Parallel::with_outputs`] the handler returns its writes
//! instead of performing them, and they commit in one transaction with the checkpoint that
//! covers their record, fenced by the lease: records finished out of order commit as the
//! watermark passes them. See [`outputs`] for the rule and why it holds.

mod committer;
mod dispatch;
mod keys;
pub mod outputs;
mod replay;
mod work;

pub use outputs::{OutputHandler, WithOutputs};

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use self::committer::Committer;
use self::work::Work;
use crate::ack::Ack;
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::failure::{Exhausted, FailurePolicy, Handling, Origin};
use crate::processor::{
    InitializationInput, ProcessRecordsInput, ProcessorFactory, RecordProcessor,
};
use crate::types::{Record, ShardId, key_hash, stable_hash};

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
///
/// With exactly-once outputs ([`with_outputs`](Self::with_outputs)), the handler returns the
/// record's writes, which commit with the checkpoint that covers it (here to the in-memory
/// store; on DynamoDB, `TransactWriteItem`s to the lease table's account and region):
///
/// ```
/// # #[cfg(feature = "test-util")] {
/// use std::sync::Arc;
///
/// use kcl_core::memory::{MemoryLeaseStore, MemoryWrite};
/// use kcl_core::{BoxError, Parallel, Record};
///
/// let store = Arc::new(MemoryLeaseStore::new());
/// let factory = Parallel::with_outputs(store.clone(), |record: Record| async move {
///     // e.g. an enrichment call per record, then the row it produces
///     let item = format!("order#{}", record.sequence_number);
///     let value = String::from_utf8_lossy(&record.data).into_owned();
///     Ok::<_, BoxError>(vec![MemoryWrite::put(item, value)])
/// })
/// .max_in_flight(10);
/// # let _ = factory;
/// # }
/// ```
pub struct Parallel<H> {
    handler: Arc<H>,
    max_in_flight: usize,
    key: KeyFn,
    failure: FailurePolicy,
    park_keys: bool,
}

impl<H> std::fmt::Debug for Parallel<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parallel")
            .field("max_in_flight", &self.max_in_flight)
            .field("failure", &self.failure)
            .field("park_keys", &self.park_keys)
            .finish_non_exhaustive()
    }
}

impl<H: RecordHandler> Parallel<H> {
    /// Runs `handler` on up to 10 records of a shard at once (Lambda's largest
    /// parallelization factor), keyed by partition key.
    pub fn new(handler: H) -> Self {
        Self::around(handler)
    }
}

impl<H> Parallel<H> {
    /// `work` with the default settings.
    fn around(work: H) -> Self {
        Self {
            handler: Arc::new(work),
            max_in_flight: 10,
            key: Arc::new(|record: &Record| key_hash(&record.partition_key)),
            failure: FailurePolicy::block(),
            park_keys: false,
        }
    }

    /// What a failing record costs: tries in place (holding only its key), then a dead
    /// letter or a skip; see the [module docs](self). Default [`FailurePolicy::block`] (the
    /// shard restarts from the watermark). A policy that dead-letters needs the worker's sink
    /// ([`WorkerBuilder::dead_letters`](crate::WorkerBuilder::dead_letters)).
    #[must_use]
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Parks a key behind a record given up on: the key's later records are given up too,
    /// unrun (dead-lettered with [`Reason::Parked`](crate::failure::Reason::Parked)), so that
    /// no record of the key runs out of order. Default off: the key goes on. Only with a
    /// policy that dead-letters: with [`FailurePolicy::skip`] the worker refuses to build
    /// (the key's later records would be dropped unseen).
    #[must_use]
    pub fn park_keys(mut self, park: bool) -> Self {
        self.park_keys = park;
        self
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
    /// ordered together, which costs parallelism, never order.) A `key` that panics on a
    /// record fails that record as a [`Permanent`](crate::failure::Permanent) failure: it is
    /// given up as the policy says (without parking anything), or restarts the shard under
    /// [`FailurePolicy::block`].
    ///
    /// Parked keys (`park_keys`) are stored in the lease row by this hash (SipHash-1-3, keys
    /// 0, over `K`'s [`Hash`]): a `String` or `&str` key hashes as the partition key does
    /// (`docs/lease-table.md`), the same in every build; a type of your own keeps its parked
    /// keys across rebuilds only while its `Hash` impl stays the same.
    #[must_use]
    pub fn key_by<K: Hash>(mut self, key: impl Fn(&Record) -> K + Send + Sync + 'static) -> Self {
        self.key = Arc::new(move |record: &Record| stable_hash(key(record)));
        self
    }
}

impl<H: Work> ProcessorFactory for Parallel<H> {
    type Processor = ParallelProcessor<H>;

    fn create(&self, shard: &ShardId) -> ParallelProcessor<H> {
        let _ = shard;
        ParallelProcessor {
            settings: Self {
                handler: self.handler.clone(),
                max_in_flight: self.max_in_flight,
                key: self.key.clone(),
                failure: self.failure.clone(),
                park_keys: self.park_keys,
            },
            dispatcher: None,
            committer: None,
            origin: None,
            parked_keys: Vec::new(),
        }
    }

    fn needs_dead_letters(&self) -> bool {
        self.failure.exhausted == Exhausted::DeadLetter
    }

    fn needs_positions(&self) -> bool {
        self.handler.needs_positions()
    }

    fn check(&self) -> Result<(), crate::ConfigError> {
        self.failure
            .check(["Parallel::on_failure", "Parallel::on_failure"])?;
        self.handler.check(self.park_keys)?;
        if self.park_keys && self.failure.exhausted == Exhausted::Skip {
            return Err(crate::ConfigError {
                key: "Parallel::park_keys",
                reason: "with Parallel::on_failure skipping (FailurePolicy::skip), every later \
                         record of a parked key would be dropped unseen, with nothing to redrive: \
                         park keys with FailurePolicy::dead_letter, or skip without parking"
                    .into(),
            });
        }
        Ok(())
    }
}

/// The dispatcher task of one processor, and where records go to it.
type Dispatcher = (mpsc::UnboundedSender<(Record, Ack)>, AbortOnDropHandle<()>);

/// One shard's processor under [`Parallel`]: hands each record to a dispatcher task that
/// runs the handler. Dropping it (lease lost, a restart) cancels what is in flight (with
/// outputs, its committer stops once a commit under way ended).
pub struct ParallelProcessor<H> {
    /// The factory's handler and settings.
    settings: Parallel<H>,
    dispatcher: Option<Dispatcher>,
    /// Commits the outputs of computed records (`with_outputs` only).
    committer: Option<Committer>,
    /// Where the shard's dead letters go, and the keys parked in its lease, from
    /// `initialize`.
    origin: Option<Origin>,
    parked_keys: Vec<String>,
}

impl<H> std::fmt::Debug for ParallelProcessor<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParallelProcessor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<H: Work> ParallelProcessor<H> {
    fn sender(&mut self, checkpointer: &Checkpointer) -> &mpsc::UnboundedSender<(Record, Ack)> {
        let (tx, _) = self.dispatcher.get_or_insert_with(|| {
            // Unbounded: the worker bounds what is handed out (`max_unacknowledged`).
            let (tx, rx) = mpsc::unbounded_channel();
            let Parallel {
                handler,
                max_in_flight,
                key,
                failure,
                park_keys,
            } = &self.settings;
            let failing = match &self.origin {
                Some(origin) if failure.in_place() => {
                    let handling = Handling::new(failure.clone(), origin.clone());
                    let parked = &self.parked_keys;
                    Some(dispatch::Failing::new(handling, *park_keys, parked))
                }
                _ => None,
            };
            let policy = work::Policy(failing.as_ref().map(|f| f.handling.clone()));
            let started = handler.start(checkpointer, &policy);
            self.committer = started.committer;
            let work = (handler.clone(), started.done);
            let run = dispatch::run(rx, work, *max_in_flight, key.clone(), failing);
            let task = crate::task::spawn(run.in_current_span());
            (tx, AbortOnDropHandle::new(task))
        });
        tx
    }
}

impl<H: Work> RecordProcessor for ParallelProcessor<H> {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.origin.clone_from(&input.origin);
        self.parked_keys.clone_from(&input.parked_keys);
        // Also for a factory the worker could not check when it was built (a closure around
        // `Parallel::create`, `StreamFactories`): refused loudly rather than losing records.
        ProcessorFactory::check(&self.settings)?;
        if self.settings.failure.exhausted == Exhausted::DeadLetter
            && self.origin.as_ref().is_none_or(|o| o.letters.is_none())
        {
            return Err(
                "Parallel::on_failure dead-letters, but the worker has no sink \
                        (WorkerBuilder::dead_letters)"
                    .into(),
            );
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if input.records().is_empty() {
            return Ok(());
        }
        let sender = self.sender(checkpointer).clone();
        for pair in input.acknowledge_later() {
            // A closed channel drops the Ack: a failure, so the shard restarts.
            let _ = sender.send(pair);
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.dispatcher = None;
        self.committer = None;
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        // Outputs computed so far commit first, and from now on as soon as computed (the
        // worker waits for what is in flight).
        if let Some(committer) = &self.committer {
            committer.drain().await?;
        }
        // The watermark so far; the worker then waits for what is in flight and writes it
        // again. (With outputs, the commits write every checkpoint: this only says whether
        // the lease is still held.)
        checkpointer.checkpoint().await?;
        Ok(())
    }
}
