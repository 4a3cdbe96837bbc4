//! Write a consumer: one processor and one worker. In memory, so it runs anywhere:
//! `cargo run -p kcl-example-consumer --example consumer`. For Kinesis and DynamoDB, swap the
//! two backends as the comments show (see `aws_consumer.rs`).
#![allow(clippy::print_stdout)]

use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Signals, Worker,
    WorkerConfig,
};

/// Prints every record, then checkpoints: after a failover, the next owner resumes after it.
struct Printer(ShardId);

impl RecordProcessor for Printer {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            let data = String::from_utf8_lossy(&record.data);
            println!("{} {}: {data}", self.0, record.partition_key);
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stream = MemoryStream::new(2); // kcl_aws::KinesisShardSource::new(&sdk, "orders")
    let leases = MemoryLeaseStore::new(); // kcl_aws::DynamoDbLeaseStore::new(&sdk, "orders-app")
    for i in 0..6 {
        stream.put(&format!("user-{i}"), format!("order {i}"));
    }
    let worker = Worker::builder(stream, leases)
        .id("worker-1")
        .config(WorkerConfig::default())
        .build(|shard| Printer(shard.clone()))?;
    // A service runs `worker.run_until_signal()`: SIGTERM or Ctrl-C stops it gracefully.
    // This example stops on its own after two seconds, or earlier on a signal.
    let mut signals = Signals::new();
    let stop = async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = signals.recv() => {}
        }
    };
    worker.run_until(stop).await?; // processors checkpoint, leases go back to the fleet
    Ok(())
}
