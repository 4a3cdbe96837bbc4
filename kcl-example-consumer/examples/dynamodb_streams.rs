//! A consumer of a DynamoDB table's stream (feature `aws`), stopping on Ctrl-C or SIGTERM:
//! `cargo run -p kcl-example-consumer --example dynamodb_streams -- TABLE APP`. Run it
//! several times for a fleet; `docs/dynamodb-streams.md` shows this code.
#![allow(clippy::print_stdout)]

use kcl_aws::streams::Change;
use kcl_aws::{DynamoDbLeaseStore, DynamoDbStreamsSource};
use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker};

/// The items of the table, as the application knows them.
#[derive(Debug, serde::Deserialize)]
struct Item {
    id: String,
    v: u64,
}

/// Prints every change to an item, then checkpoints.
struct Printer(ShardId);

impl RecordProcessor for Printer {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            // One change to one item: event, keys, images, creation time, TTL deletions.
            let change = Change::parse(record)?;
            // The image after the change, or before it for a removal, as the app's type.
            let item = match change.new_image_as::<Item>()? {
                Some(item) => Some(item),
                None => change.old_image_as::<Item>()?,
            };
            if let Some(item) = item {
                let event = change.event.as_str();
                println!(
                    "{} {}: {event} {} {}",
                    self.0, record.partition_key, item.id, item.v
                );
            }
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (Some(table), Some(app)) = (args.next(), args.next()) else {
        return Err("usage: dynamodb_streams TABLE APPLICATION_NAME".into());
    };
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    // The table's current stream; refused, saying what to enable, if it has none.
    let source = DynamoDbStreamsSource::for_table(&sdk, &table).await?;
    // The lease table, as the Java DynamoDB Streams Kinesis Adapter keeps it.
    let leases = DynamoDbLeaseStore::new(&sdk, app);
    let worker = Worker::builder(source, leases).build(|shard| Printer(shard.clone()))?;
    worker.run_until_signal().await?;
    Ok(())
}
