//! The demo's ledger: every record delivered, and the processor that keeps it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kcl_core::{BoxError, Checkpointer, InitializationInput, ProcessRecordsInput, RecordProcessor};
use kcl_example_consumer::{WindowCounter, WindowSink, WindowSummary};

/// Every record delivered, by the number the producer gave it.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub(super) deliveries: Mutex<HashMap<u64, u32>>,
    pub(super) by_worker: Mutex<BTreeMap<String, u64>>,
    pub(super) windows: AtomicU64,
    pub(super) window_records: AtomicU64,
    pub(super) sample: Mutex<Option<WindowSummary>>,
    /// The summary job's runs: (period, worker).
    pub(super) periods: Mutex<Vec<(u64, String)>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts the windows the processors emit instead of printing them.
#[derive(Debug, Clone)]
pub(super) struct LedgerSink(pub(super) Arc<Ledger>);

impl WindowSink for LedgerSink {
    fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError> {
        self.0.windows.fetch_add(1, Ordering::Relaxed);
        self.0
            .window_records
            .fetch_add(summary.records, Ordering::Relaxed);
        if summary.complete {
            lock(&self.0.sample).get_or_insert_with(|| summary.clone());
        }
        Ok(())
    }
}

/// The example's [`WindowCounter`], plus a note of every record it is handed.
#[derive(Debug)]
pub(super) struct Audited {
    pub(super) worker: String,
    pub(super) ledger: Arc<Ledger>,
    pub(super) inner: WindowCounter<LedgerSink>,
}

impl RecordProcessor for Audited {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.inner.initialize(input).await
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        {
            let mut deliveries = lock(&self.ledger.deliveries);
            for record in input.records() {
                if let Some(id) = record_id(&record.data) {
                    *deliveries.entry(id).or_default() += 1;
                }
            }
        }
        *lock(&self.ledger.by_worker)
            .entry(self.worker.clone())
            .or_default() += input.records().len() as u64;
        self.inner.process_records(input, checkpointer).await
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.inner.shard_ended(checkpointer).await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.inner.shutdown_requested(checkpointer).await
    }
}

/// Records are `<number> <json>`.
fn record_id(data: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(data).ok()?;
    text.split_once(' ')?.0.parse().ok()
}
