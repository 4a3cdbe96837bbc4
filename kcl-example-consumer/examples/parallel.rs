//! Faster than one record at a time: a per-record async handler, up to 10 records of a shard
//! at once, in order per partition key (`kcl_core::Parallel`). In memory, so it runs anywhere:
//! `cargo run -p kcl-example-consumer --example parallel`. For Kinesis and DynamoDB, swap the
//! two backends as in `consumer.rs`.
//!
//! Each record costs its handler 50 ms (an HTTP call, a database write): one at a time, the
//! shard's 200 records would take 10 s; 10 at once take about 1 s. The checkpoint never passes
//! a record still running, so a crash repeats records, never skips one.
#![allow(clippy::print_stdout)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{BoxError, Parallel, Record, Signals, Worker};

const RECORDS: usize = 200;
static STARTED: OnceLock<Instant> = OnceLock::new();
static HANDLED: AtomicUsize = AtomicUsize::new(0);

/// The per-record work: runs on up to 10 records at once, never two of one key at once.
async fn handle(record: Record) -> Result<(), BoxError> {
    tokio::time::sleep(Duration::from_millis(50)).await; // e.g. an HTTP call
    let data = String::from_utf8_lossy(&record.data);
    println!("{}: {data}", record.partition_key);
    if HANDLED.fetch_add(1, Ordering::SeqCst) + 1 == RECORDS {
        let took = STARTED.get().map(Instant::elapsed).unwrap_or_default();
        println!("{RECORDS} records handled in {:.1} s", took.as_secs_f64());
    }
    Ok(()) // done: the checkpoint may now pass this record
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stream = MemoryStream::new(1); // kcl_aws::KinesisShardSource::new(&sdk, "orders")
    let leases = MemoryLeaseStore::new(); // kcl_aws::DynamoDbLeaseStore::new(&sdk, "orders-app")
    for i in 0..RECORDS {
        stream.put(&format!("user-{}", i % 20), format!("order {i}"));
    }
    STARTED.get_or_init(Instant::now);
    let worker = Worker::builder(stream, leases)
        .id("worker-1")
        // The handler, 10 records of a shard at once; `.key_by(..)` orders by another key.
        .build_with(Parallel::new(handle).max_in_flight(10))?;
    // A service runs `worker.run_until_signal()`: on SIGTERM, records in flight finish, the
    // watermark is checkpointed, the leases go back to the fleet.
    let mut signals = Signals::new();
    let stop = async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(3)) => {}
            _ = signals.recv() => {}
        }
    };
    worker.run_until(stop).await?;
    Ok(())
}
