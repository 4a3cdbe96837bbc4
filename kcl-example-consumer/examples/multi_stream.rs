//! One worker over several Kinesis streams, each with a processor type of its own (feature
//! `aws`): `cargo run -p kcl-example-consumer --example multi_stream -- APP ORDERS OTHER…`.
//!
//! The first stream's records are counted per partition key; every other stream's are
//! printed. Leases are keyed as KCL Java's multi-stream leases
//! (`account:stream:creationEpoch:shardId`), so a KCL Java multi-stream fleet's table is
//! picked up with its checkpoints. `Streams` is the tracker: `add` and `remove` on it while
//! the worker runs (a removed stream is read on for `removal_grace`, then its leases go).
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::Duration;

use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::multi_stream::{MultiStreamSource, StreamFactories, StreamId, Streams};
use kcl_core::{
    BoxError, Checkpointer, InitialPosition, ProcessRecordsInput, RecordProcessor, ShardId, Worker,
};

/// Counts records per partition key and prints the counts at each checkpoint.
#[derive(Default)]
struct Counter(BTreeMap<String, u64>);

impl RecordProcessor for Counter {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            *self.0.entry(record.partition_key.clone()).or_default() += 1;
        }
        println!("{:?}", self.0);
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

/// Prints each record with the lease key of its shard.
struct Printer(ShardId);

impl RecordProcessor for Printer {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            println!("{}: {}", self.0, String::from_utf8_lossy(&record.data));
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [app, first, others @ ..] = args.as_slice() else {
        return Err("usage: multi_stream APPLICATION_NAME STREAM [STREAM…]".into());
    };
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    // A stream is named by account, name and creation time (a stream created again under
    // the same name is a new stream, with new leases): look each one up.
    let streams = Streams::default();
    let mut ids = Vec::new();
    for name in std::iter::once(first).chain(others) {
        let id = KinesisShardSource::new(&sdk, name.as_str())
            .stream_id()
            .await?;
        streams.add(id.clone(), InitialPosition::TrimHorizon);
        ids.push(id);
    }
    let sdk_for_sources = sdk.clone();
    let source = MultiStreamSource::new(streams.clone(), move |stream: &StreamId| {
        KinesisShardSource::new(&sdk_for_sources, stream.name.clone())
    })
    .removal_grace(Duration::from_secs(300));
    let factories = StreamFactories::new()
        .stream(ids[0].clone(), |_: &ShardId| Counter::default())
        .otherwise(|stream: &StreamId, shard: &ShardId| Printer(stream.lease_key(shard)));
    let worker = Worker::builder(source, DynamoDbLeaseStore::new(&sdk, app.as_str()))
        .build_with(factories)?;
    worker.run_until_signal().await?;
    Ok(())
}
