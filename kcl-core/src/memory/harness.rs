//! A [`Checkpointer`] for unit tests of a processor, without running a worker.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryLeaseStore;
use crate::checkpoint::Checkpointer;
use crate::error::{BackendError, BoxError};
use crate::lease::tenure::Tenure;
use crate::lease::{Lease, LeaseStore};
use crate::processor::{ProcessRecordsInput, RecordProcessor};
use crate::types::{Checkpoint, Record, ShardId, WorkerId};

/// A checkpointer on a lease of `store` for `shard`, held by `worker` (created and taken
/// if needed), so that a processor's `process_records` can be called directly in a test and
/// its checkpoints read back from `store`.
///
/// ```
/// # async fn demo() -> Result<(), kcl_core::BackendError> {
/// use kcl_core::memory::{MemoryLeaseStore, test_checkpointer};
/// use kcl_core::{LeaseStore, ShardId};
///
/// let store = MemoryLeaseStore::new();
/// let shard = ShardId::new("shardId-000000000000");
/// let mut checkpointer = test_checkpointer(&store, &shard, "test-worker").await?;
/// # let records: Vec<kcl_core::Record> = Vec::new();
/// checkpointer.deliver(&records); // what the worker does before `process_records`
/// // my_processor.process_records(input, &mut checkpointer).await?;
/// let lease = store.get(&shard).await?;
/// # let _ = lease;
/// # Ok(())
/// # }
/// ```
pub async fn test_checkpointer(
    store: &MemoryLeaseStore,
    shard: &ShardId,
    worker: &str,
) -> Result<Checkpointer, BackendError> {
    store.ensure_table().await?;
    store
        .create(&Lease::new(shard.clone(), Checkpoint::TrimHorizon))
        .await?;
    let worker = WorkerId::new(worker);
    let observed = store
        .get(shard)
        .await?
        .unwrap_or_else(|| Lease::new(shard.clone(), Checkpoint::TrimHorizon));
    let lease = store.take(&observed, &worker).await?;
    // A long validity: tests call the processor at their own pace.
    let tenure = Tenure::new(
        lease,
        worker.clone(),
        Arc::new(store.client(worker.as_str())),
        Duration::from_secs(3600),
        Duration::from_secs(60),
        Instant::now(),
    );
    Ok(Checkpointer::new(Arc::new(tenure)))
}

impl Checkpointer {
    /// Records `records` as delivered (feature `test-util`), as the worker does before each
    /// `process_records`, so that checkpoints up to the last of them are accepted.
    pub fn deliver(&mut self, records: &[Record]) {
        if let Some(last) = records.last() {
            self.set_last_delivered(last.position());
        }
    }
}

/// A processor that does nothing with its records: for fleets whose coordination is what is
/// being measured or tested (lease-table reads, balance, cost).
#[derive(Debug, Clone, Copy, Default)]
pub struct IdleProcessor;

impl RecordProcessor for IdleProcessor {
    async fn process_records(
        &mut self,
        _: ProcessRecordsInput,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}
