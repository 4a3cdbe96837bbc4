//! A singleton next to a record processor: every worker of the fleet consumes the stream, and
//! exactly one of them at a time also runs a periodic summary of what the fleet processed,
//! with no Redis, ZooKeeper or memcached: the lease table elects it. In memory, so it runs
//! anywhere: `cargo run -p kcl-example-consumer --example singleton`. Two workers share one
//! lease table; the first to start holds the summary job; when it stops, the other takes
//! the job over (at once: a graceful stop hands the row back) and never runs a period the
//! first already ran.
//!
//! The job runs on the worker's shutdown token (`ShutdownHandle::token`), so it stops with
//! the worker whatever stops it: a signal under `run_until_signal`, `shutdown()`, or the
//! worker failing. A process whose worker stopped never stays on as a candidate.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::singleton::{Singleton, SingletonConfig};
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShutdownHandle, Worker,
};

/// Counts records, then checkpoints.
struct Counter(Arc<AtomicU64>);

impl RecordProcessor for Counter {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0
            .fetch_add(input.records().len() as u64, Ordering::Relaxed);
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

/// One worker process: a record processor and a candidate for the summary job. Returns the
/// worker's shutdown handle, which stops both.
fn start(
    id: &'static str,
    stream: &MemoryStream,
    leases: &MemoryLeaseStore,
    processed: &Arc<AtomicU64>,
) -> Result<(ShutdownHandle, tokio::task::JoinHandle<()>), BoxError> {
    let counted = processed.clone();
    let worker = Worker::builder(stream.client(id), leases.client(id))
        .id(id)
        .build(move |_shard| Counter(counted.clone()))?;
    // The same lease table; a shorter failover than the default 10 s, for the example.
    let config = SingletonConfig::default().failover_time(Duration::from_secs(3));
    let summary = Singleton::new("summary", id, leases.client(id), config)?;
    let handle = worker.shutdown_handle();
    // Cancelled when the worker stops, for whatever reason.
    let until = handle.token();
    let processed = processed.clone();
    let task = tokio::spawn(async move {
        let job = summary.every(Duration::from_secs(1), until, move |period| {
            let total = processed.load(Ordering::Relaxed);
            async move {
                // The fencing token would guard a write of this summary elsewhere.
                println!(
                    "{id}: period {}, {total} records so far (fencing token {})",
                    period.index,
                    period.fencing_token()
                );
            }
        });
        // A service would call `worker.run_until_signal()` here.
        let (job, run) = tokio::join!(job, worker.run());
        if let Err(error) = job.map_err(BoxError::from).and(run.map_err(BoxError::from)) {
            println!("{id} failed: {error}");
        }
    });
    Ok((handle, task))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stream = MemoryStream::new(4);
    let leases = MemoryLeaseStore::new();
    let processed = Arc::new(AtomicU64::new(0));
    let (stop_a, a) = start("worker-a", &stream, &leases, &processed)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (stop_b, b) = start("worker-b", &stream, &leases, &processed)?;
    for i in 0..60 {
        stream.put(&format!("user-{}", i % 7), format!("event {i}"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("stopping worker-a: worker-b takes the summary over");
    stop_a.shutdown();
    a.await?;
    for i in 60..100 {
        stream.put(&format!("user-{}", i % 7), format!("event {i}"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_b.shutdown();
    b.await?;
    println!("{} records processed", processed.load(Ordering::Relaxed));
    Ok(())
}
