//! The one trait an application implements: [`RecordProcessor`].

use std::future::Future;
use std::marker::PhantomData;

use std::sync::Arc;

use crate::ack::{Ack, Reservation, Watermark};
use crate::checkpoint::Checkpointer;
use crate::error::BoxError;
use crate::failure::Origin;
use crate::types::{Checkpoint, ExtendedSequenceNumber, FencingToken, Record, ShardId};

/// What [`RecordProcessor::initialize`] is told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitializationInput {
    /// The shard this processor serves.
    pub shard_id: ShardId,
    /// The checkpoint processing resumes after.
    pub checkpoint: Checkpoint,
    /// A prepared checkpoint the previous owner never committed: side effects up to it may
    /// already have happened.
    pub pending_checkpoint: Option<Checkpoint>,
    /// This tenure's fencing token: higher than that of every earlier holder of the shard's
    /// lease. Condition writes to other systems on it (see [`FencingToken`]); the
    /// checkpointer has it too ([`Checkpointer::fencing_token`](crate::Checkpointer::fencing_token)).
    pub fencing_token: FencingToken,
    /// Where the shard's dead letters go, for [`Parallel`](crate::Parallel).
    pub(crate) origin: Option<Origin>,
    /// The shard's parked keys ([`Lease::parked_keys`](crate::Lease)), for `Parallel`.
    pub(crate) parked_keys: Vec<String>,
}

/// One batch for [`RecordProcessor::process_records`], lent to the hook.
///
/// A delivered batch holds its place in the shard's checkpoint watermark (see
/// [`ack`](crate::ack)) from delivery until it is dropped (its records are then processed)
/// or taken with [`acknowledge_later`](Self::acknowledge_later) (then each record is
/// processed once its [`Ack`] is done). It cannot leave its hook, so that no batch is ever
/// on its way somewhere the worker does not know of: its lifetime ends with the hook, it is
/// not `Clone`, and its records are read through [`records`](Self::records). To finish
/// records in another task, take them with `acknowledge_later` and move the records and
/// their `Ack`s. A copy of the records (`records().to_vec()`) carries no `Ack`: the batch
/// still counts as processed once dropped.
///
/// ```compile_fail
/// # use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor};
/// struct Later;
/// impl RecordProcessor for Later {
///     async fn process_records(&mut self, input: ProcessRecordsInput<'_>, _: &mut Checkpointer) -> Result<(), BoxError> {
///         // Does not compile: the batch cannot outlive its hook (take the Acks instead).
///         tokio::spawn(async move { input.acknowledge_later() });
///         Ok(())
///     }
/// }
/// ```
///
/// ```compile_fail
/// # use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor};
/// struct Keeps(Vec<ProcessRecordsInput<'static>>);
/// impl RecordProcessor for Keeps {
///     async fn process_records(&mut self, input: ProcessRecordsInput<'_>, _: &mut Checkpointer) -> Result<(), BoxError> {
///         self.0.push(input); // does not compile: nor can it be kept for a later hook
///         Ok(())
///     }
/// }
/// ```
///
/// ```compile_fail
/// fn twice(input: kcl_core::ProcessRecordsInput<'_>) {
///     let _ = input.clone(); // does not compile: one batch, one place in the watermark
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ProcessRecordsInput<'hook> {
    records: Vec<Record>,
    millis_behind_latest: Option<u64>,
    /// The batch's place in its shard's watermark, when the worker delivered it.
    reservation: Option<Reservation>,
    /// Ties the batch to its hook.
    hook: PhantomData<&'hook ()>,
}

impl ProcessRecordsInput<'static> {
    /// A batch, e.g. to call a processor from a test.
    pub fn new(records: Vec<Record>, millis_behind_latest: Option<u64>) -> Self {
        Self {
            records,
            millis_behind_latest,
            reservation: None,
            hook: PhantomData,
        }
    }
}

impl<'hook> ProcessRecordsInput<'hook> {
    /// A batch the worker delivers, its place reserved in `watermark` after `previous`; it
    /// lives no longer than the borrow of `watermark`, which the hook's call holds.
    pub(crate) fn delivered(
        records: Vec<Record>,
        millis_behind_latest: Option<u64>,
        watermark: &'hook Arc<Watermark>,
        previous: Option<ExtendedSequenceNumber>,
    ) -> Self {
        let reservation = watermark.reserve(previous, records.iter().map(Record::position));
        Self {
            records,
            millis_behind_latest,
            reservation: Some(reservation),
            hook: PhantomData,
        }
    }

    /// A part of a delivered batch, given again by the failure policy: `reservation` is the
    /// part's place in `watermark`.
    pub(crate) fn part(
        records: Vec<Record>,
        millis_behind_latest: Option<u64>,
        _watermark: &'hook Arc<Watermark>,
        reservation: Reservation,
    ) -> Self {
        Self {
            records,
            millis_behind_latest,
            reservation: Some(reservation),
            hook: PhantomData,
        }
    }

    /// The records, in sequence order. Never empty, unless
    /// [`WorkerConfig::empty_batch_interval`](crate::WorkerConfig::empty_batch_interval) is
    /// set: then an empty batch says the shard has been quiet that long.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// How far behind the newest record of the shard this batch is, if known.
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.millis_behind_latest
    }

    /// Takes the records to finish later, each with its [`Ack`]: they count as processed
    /// only once acknowledged, from whichever task finishes them, during or after this hook
    /// or in a later one. Until then no checkpoint passes them, and reading pauses while
    /// [`max_unacknowledged`](crate::WorkerConfig::max_unacknowledged) records are held; see
    /// [`ack`](crate::ack) for what the worker does with them.
    ///
    /// On a batch built with [`new`](Self::new) (a test's), the acknowledgements go nowhere.
    pub fn acknowledge_later(mut self) -> Vec<(Record, Ack)> {
        let records = std::mem::take(&mut self.records);
        let acks = match self.reservation.take() {
            Some(reservation) => reservation.into_acks(),
            None => Arc::new(Watermark::default())
                .reserve(None, records.iter().map(Record::position))
                .into_acks(),
        };
        records.into_iter().zip(acks).collect()
    }
}

impl InitializationInput {
    /// The input of `initialize`, e.g. to call a processor from a test (fencing token 0).
    pub fn new(
        shard_id: ShardId,
        checkpoint: Checkpoint,
        pending_checkpoint: Option<Checkpoint>,
    ) -> Self {
        Self {
            shard_id,
            checkpoint,
            pending_checkpoint,
            fencing_token: FencingToken(0),
            origin: None,
            parked_keys: Vec::new(),
        }
    }
}

/// Processes the records of one shard.
///
/// One processor instance serves one shard for one tenure of its lease, in order. Its methods
/// take `&mut self`: the shard task owns it, so it needs no locks. Only
/// [`process_records`](RecordProcessor::process_records) is required.
///
/// An error returned from `initialize`, `process_records` or `shard_ended`, or a panic in any
/// of them, costs the shard a restart: a new processor starts from the last checkpoint after
/// a backoff, and the rest of the worker carries on.
///
/// Hooks run only while the lease is valid: once another worker could hold it (0.9 × the
/// failover time after the start of the last successful lease write), a hook still running is
/// dropped at its next `.await` and the processor gets [`lease_lost`](RecordProcessor::lease_lost),
/// so two processors never work on one shard at once.
///
/// **Blocking.** A hook that blocks its thread (CPU work, synchronous I/O, `std::thread::sleep`)
/// stalls only its own shard on a multi-thread runtime: the lease is renewed by another task,
/// so the shard stays this worker's for as long as it blocks. But the blocked thread runs
/// nothing else, and a blocked hook cannot be dropped at the validity deadline until it
/// returns. Run such work with `tokio::task::spawn_blocking` (and `.await` it) or inside
/// `tokio::task::block_in_place`. On a current-thread runtime a blocking hook also stops the
/// renewals: do not block there.
///
/// ```
/// use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor};
///
/// struct Printer;
///
/// impl RecordProcessor for Printer {
///     async fn process_records(
///         &mut self,
///         input: ProcessRecordsInput<'_>,
///         checkpointer: &mut Checkpointer,
///     ) -> Result<(), BoxError> {
///         for record in input.records() {
///             let _ = (&record.partition_key, record.data.len());
///         }
///         checkpointer.checkpoint().await?;
///         Ok(())
///     }
/// }
/// ```
#[doc(alias = "ShardRecordProcessor", alias = "IRecordProcessor")]
pub trait RecordProcessor: Send + 'static {
    /// Called once before the first batch.
    fn initialize(
        &mut self,
        input: &InitializationInput,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = input;
        async { Ok(()) }
    }

    /// Processes one batch. Checkpoint through `checkpointer` whenever the work up to a record
    /// is durable; everything after the last checkpoint is delivered again after a failover.
    fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// The lease was lost (taken by another worker, or it could not be renewed in time). No
    /// checkpoint is possible any more; release resources and return.
    fn lease_lost(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Every record of the shard was delivered. The shard's children start only once this
    /// checkpoints (`checkpointer.checkpoint()` writes `SHARD_END`), which the default does.
    /// A processor that commits outputs and keeps some across batches commits them here
    /// (`commit_outputs` writes `SHARD_END`): the default's plain checkpoint passes them.
    fn shard_ended(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        async move { checkpointer.end_shard().await.map_err(BoxError::from) }
    }

    /// The worker is shutting down or handing this shard to another worker: the last chance
    /// to checkpoint what has been processed, so that the next owner does not repeat it.
    fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = checkpointer;
        async { Ok(()) }
    }
}

/// Creates one processor per shard lease taken.
///
/// Any `Fn(&ShardId) -> P` is a factory.
#[doc(alias = "ShardRecordProcessorFactory")]
pub trait ProcessorFactory: Send + Sync + 'static {
    /// The processor type.
    type Processor: RecordProcessor;

    /// A processor for `shard`.
    fn create(&self, shard: &ShardId) -> Self::Processor;

    /// Whether its processors dead-letter records themselves ([`Parallel::on_failure`](crate::Parallel::on_failure)),
    /// so that the worker can check it has a sink.
    #[doc(hidden)]
    fn needs_dead_letters(&self) -> bool {
        false
    }

    /// Whether its processors commit outputs into a sink that keeps its own position
    /// ([`Parallel::with_outputs`](crate::Parallel::with_outputs) over one), so that the
    /// worker can check it was given the sink ([`WorkerBuilder::positions`](crate::WorkerBuilder::positions)).
    #[doc(hidden)]
    fn needs_positions(&self) -> bool {
        false
    }

    /// Checks the factory's own settings when the worker is built
    /// ([`Parallel`](crate::Parallel)'s); the error names the setting.
    #[doc(hidden)]
    fn check(&self) -> Result<(), crate::ConfigError> {
        Ok(())
    }
}

impl<F, P> ProcessorFactory for F
where
    F: Fn(&ShardId) -> P + Send + Sync + 'static,
    P: RecordProcessor,
{
    type Processor = P;

    fn create(&self, shard: &ShardId) -> P {
        self(shard)
    }
}
