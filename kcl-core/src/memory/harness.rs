//! Unit tests of a processor without a worker ([`ProcessorHarness`]), and an idle processor.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryLeaseStore;
use crate::checkpoint::Checkpointer;
use crate::error::{BackendError, BoxError};
use crate::lease::tenure::{Taken, Tenure, Timing};
use crate::lease::{Lease, LeaseStore, TableFeatures};
use crate::processor::{InitializationInput, ProcessRecordsInput, RecordProcessor};
use crate::types::{Checkpoint, Record, ShardId, WorkerId};

/// Runs a processor's hooks the way a worker does, without a worker, for unit tests: the
/// shard's lease is taken in a [`MemoryLeaseStore`], records are marked delivered before
/// `process_records` sees them (so checkpoints up to them are accepted, and only those), and
/// the checkpoints the processor writes can be read back. Every call a worker makes has its
/// method: [`initialize`](Self::initialize), [`process`](Self::process),
/// [`process_empty`](Self::process_empty) (a quiet shard under
/// [`empty_batch_interval`](crate::WorkerConfig::empty_batch_interval)),
/// [`shutdown_requested`](Self::shutdown_requested), [`shard_ended`](Self::shard_ended) and
/// [`lease_lost`](Self::lease_lost).
///
/// ```
/// # fn main() -> Result<(), kcl_core::BoxError> {
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, ProcessorHarness};
/// use kcl_core::{Checkpoint, Record, SequenceNumber};
///
/// let store = MemoryLeaseStore::new();
/// let mut harness = ProcessorHarness::new(&store, "shardId-000000000000").await?;
/// let mut processor = IdleProcessor; // yours
/// let records = vec![Record::new(SequenceNumber::from(1u128), "key", "data")];
/// harness.process(&mut processor, records).await?;
/// // IdleProcessor never checkpoints:
/// assert_eq!(harness.checkpoint().await?, Checkpoint::TrimHorizon);
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Debug)]
pub struct ProcessorHarness {
    store: MemoryLeaseStore,
    shard: ShardId,
    tenure: Arc<Tenure>,
    checkpointer: Checkpointer,
}

impl ProcessorHarness {
    /// Creates the lease of `shard` in `store` if needed and takes it as the worker
    /// `test-worker`, with a validity long enough for any test.
    pub async fn new(
        store: &MemoryLeaseStore,
        shard: impl Into<ShardId>,
    ) -> Result<Self, BackendError> {
        let shard = shard.into();
        store.ensure_table(TableFeatures::NONE).await?;
        store
            .create(&Lease::new(shard.clone(), Checkpoint::TrimHorizon))
            .await?;
        let worker = WorkerId::new("test-worker");
        let observed = store
            .get(&shard)
            .await?
            .unwrap_or_else(|| Lease::new(shard.clone(), Checkpoint::TrimHorizon));
        let lease = store.take(&observed, &worker).await?;
        let taken = Taken {
            lease,
            worker: worker.clone(),
            store: Arc::new(store.client(worker.as_str())),
            started: Instant::now(),
        };
        let timing = Timing {
            failover_time: Duration::from_secs(3600),
            call_timeout: Duration::from_secs(60),
        };
        let tenure = Arc::new(Tenure::new(taken, timing));
        Ok(Self {
            store: store.clone(),
            shard,
            checkpointer: Checkpointer::new(tenure.clone()),
            tenure,
        })
    }

    /// Calls `initialize` with the lease's current checkpoint.
    pub async fn initialize(
        &mut self,
        processor: &mut impl RecordProcessor,
    ) -> Result<(), BoxError> {
        let input = InitializationInput::new(self.shard.clone(), self.checkpoint().await?, None);
        processor.initialize(&input).await
    }

    /// Delivers `records` (in order, as one batch) and calls `process_records` with them.
    /// An empty batch is refused: the worker delivers one only on a quiet shard, which
    /// [`process_empty`](Self::process_empty) does.
    pub async fn process(
        &mut self,
        processor: &mut impl RecordProcessor,
        records: Vec<Record>,
    ) -> Result<(), BoxError> {
        let Some(last) = records.last() else {
            return Err("ProcessorHarness::process: a batch is never empty".into());
        };
        // As the worker delivers: the batch reserved in the checkpointer's watermark, so that
        // no checkpoint passes records still acknowledged later.
        let previous = self.checkpointer.last_delivered().cloned();
        self.checkpointer.set_last_delivered(last.position());
        let watermark = self.checkpointer.watermark().clone();
        let input = ProcessRecordsInput::delivered(records, None, &watermark, previous);
        let result = processor
            .process_records(input, &mut self.checkpointer)
            .await;
        watermark.hook_returned();
        result
    }

    /// Calls `process_records` with an empty batch, as the worker does while a shard stays
    /// quiet when [`empty_batch_interval`](crate::WorkerConfig::empty_batch_interval) is set:
    /// a checkpoint then covers what was delivered before.
    pub async fn process_empty(
        &mut self,
        processor: &mut impl RecordProcessor,
    ) -> Result<(), BoxError> {
        let input = ProcessRecordsInput::new(Vec::new(), None);
        processor
            .process_records(input, &mut self.checkpointer)
            .await
    }

    /// Calls `shard_ended`, as the worker does once every record of a closed shard was
    /// delivered, with `children` as the shard's child shards. Fails, as the worker would
    /// (it restarts the shard), if the processor returned without checkpointing `SHARD_END`.
    pub async fn shard_ended(
        &mut self,
        processor: &mut impl RecordProcessor,
        children: Vec<ShardId>,
    ) -> Result<(), BoxError> {
        self.checkpointer.set_shard_end(children);
        processor.shard_ended(&mut self.checkpointer).await?;
        if self.checkpoint().await? != Checkpoint::ShardEnd {
            return Err("shard_ended returned without checkpointing SHARD_END".into());
        }
        Ok(())
    }

    /// Takes the lease away, as another worker taking it does, and calls `lease_lost`: from
    /// then on every checkpoint fails with [`CheckpointError::LeaseLost`](crate::CheckpointError::LeaseLost).
    pub async fn lease_lost(&mut self, processor: &mut impl RecordProcessor) {
        self.tenure.mark_lost();
        processor.lease_lost().await;
    }

    /// Calls `shutdown_requested`, as a graceful shutdown or a handoff does.
    pub async fn shutdown_requested(
        &mut self,
        processor: &mut impl RecordProcessor,
    ) -> Result<(), BoxError> {
        processor.shutdown_requested(&mut self.checkpointer).await
    }

    /// The checkpoint stored in the lease now.
    pub async fn checkpoint(&self) -> Result<Checkpoint, BackendError> {
        Ok(self
            .store
            .get(&self.shard)
            .await?
            .map_or(Checkpoint::TrimHorizon, |lease| lease.checkpoint))
    }
}

/// A processor that does nothing with its records: for fleets whose coordination is what is
/// being measured or tested (lease-table reads, balance, cost).
#[derive(Debug, Clone, Copy, Default)]
pub struct IdleProcessor;

impl RecordProcessor for IdleProcessor {
    async fn process_records(
        &mut self,
        _: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}
