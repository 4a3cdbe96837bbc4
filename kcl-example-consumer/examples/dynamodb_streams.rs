//! A consumer of a DynamoDB table's stream (feature `aws`), stopping on Ctrl-C or SIGTERM:
//! `cargo run -p kcl-example-consumer --example dynamodb_streams -- TABLE APP`. Run it
//! several times for a fleet; `docs/dynamodb-streams.md` shows this code.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal as _;

use kcl_aws::streams::Change;
use kcl_aws::{DynamoDbLeaseStore, DynamoDbStreamsSource};
use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker};

/// The items the application knows (step 2). Other items of the table may have any shape.
#[derive(Debug, serde::Deserialize)]
struct Order {
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
            let event = change.event.as_str();
            // Step 1, any item of the table: the image after the change (before it, for a
            // removal) as plain JSON. This cannot fail, whatever the item holds.
            let item = change.item_json().unwrap_or_default();
            println!("{} {}: {event} {item}", self.0, record.partition_key);
            // Step 2, typed: the items that are orders. An item of another shape is logged
            // and passed over; returning the error instead would restart the shard on it
            // forever, holding back every later change.
            match change.new_image_as::<Order>() {
                Ok(Some(order)) => tracing::debug!(id = order.id, v = order.v, "an order"),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "not an order: passed over"),
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
    // Logs on stderr (stdout is the changes'), coloured on a terminal only.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
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
