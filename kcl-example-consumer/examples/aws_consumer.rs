//! The same consumer on Kinesis and DynamoDB (feature `aws`), stopping on Ctrl-C or SIGTERM:
//! `cargo run -p kcl-example-consumer --features aws --example aws_consumer -- STREAM APP`.
//! Credentials, region and endpoints come from the standard AWS configuration chain.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal as _;

use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker};

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
    let mut args = std::env::args().skip(1);
    let (Some(stream), Some(app)) = (args.next(), args.next()) else {
        return Err("usage: aws_consumer STREAM APPLICATION_NAME".into());
    };
    // How the worker runs, and anything that costs more than it should, at start: on stderr
    // (stdout is the records'), coloured on a terminal only.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let source = KinesisShardSource::new(&sdk, stream);
    // The lease table, created on first start with what the fleet uses of it (the owner
    // index and stream of the default `Coordination::Leader`).
    let leases = DynamoDbLeaseStore::new(&sdk, app);
    // The worker id defaults to `<hostname>-<pid>-<random>`; `.id(…)` sets another.
    let worker = Worker::builder(source, leases).build(|shard| Printer(shard.clone()))?;
    // SIGTERM (Kubernetes, ECS) or Ctrl-C: processors checkpoint, leases go back to the
    // fleet at once; a second signal forces.
    worker.run_until_signal().await?;
    Ok(())
}
