//! Checkpoint every 100 records or every 5 seconds, whichever comes first, also when the
//! shard goes quiet: `cargo run -p kcl-example-consumer --example periodic_checkpoint`.
//! In memory; with Kinesis and DynamoDB only the two backends change (see `aws_consumer.rs`).
#![allow(clippy::print_stdout)]

use std::time::Duration;

use kcl_core::EveryNOrT;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{BoxError, LeaseStore, ShardId, Signals, Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stream = MemoryStream::new(1);
    let leases = MemoryLeaseStore::new();
    for i in 0..42 {
        stream.put(&format!("user-{i}"), format!("order {i}"));
    }
    // Quiet for a second: the processor is called with an empty batch, every second.
    let config = WorkerConfig::default().empty_batch_interval(Some(Duration::from_secs(1)));
    let worker = Worker::builder(stream, leases.clone())
        .config(config)
        .build(|_shard| {
            EveryNOrT::new(100, Duration::from_secs(5), |record| {
                println!(
                    "{}: {}",
                    record.partition_key,
                    String::from_utf8_lossy(&record.data)
                );
            })
        })?;
    // 42 records are fewer than 100: the checkpoint comes from the 5-second rule, on an
    // empty batch. Stop after 7 seconds (or on Ctrl-C) and show it.
    let mut signals = Signals::new();
    let stop = async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(7)) => {}
            _ = signals.recv() => {}
        }
    };
    worker.run_until(stop).await?;
    let lease = leases.get(&ShardId::new("shardId-000000000000")).await?;
    println!(
        "checkpoint: {}",
        lease.map_or_else(|| "none".to_owned(), |l| l.checkpoint.to_string())
    );
    Ok(())
}
