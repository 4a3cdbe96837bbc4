//! One worker process over several streams (`--streams-file`): a KCL Java multi-stream lease
//! row (`account:stream:creationEpoch:shardId`, with its `streamName` and `shardId`) is
//! picked up with its checkpoint, both streams' records are delivered, a stream added to the
//! file while the worker runs is consumed too, the leases kcl creates carry KCL Java's key
//! and attributes, and a stream removed from the file loses its lease after the grace period.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_aws::KinesisShardSource;
use kcl_core::{LeaseStore as _, TableFeatures};
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
/// How long a stream gone from the tracker is still read.
const REMOVAL_GRACE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_consumes_several_streams_and_a_kcl_java_row() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("multi-stream").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(run(ctx))).await
}

fn payloads(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("pk-{i}"), format!("{prefix}{i}")))
        .collect()
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let (a, b, c) = (ctx.on("a"), ctx.on("b"), ctx.on("c"));
    a.create_stream(2).await?;
    b.create_stream(1).await?;
    c.create_stream(1).await?;
    a.put(&payloads("a", 30)).await?;
    b.put(&payloads("b", 10)).await?;
    c.put(&payloads("c", 10)).await?;
    let id = |s: &Context| KinesisShardSource::from_client(s.kinesis.clone(), s.stream.clone());
    let stream_a = id(&a).stream_id().await?;

    // KCL Java left a checkpoint on stream a's first shard, at its fifth record.
    let shard0 = a.read_shard("shardId-000000000000").await?;
    assert!(
        shard0.len() > 6,
        "stream a's first shard has {} records",
        shard0.len()
    );
    let (checkpoint, _) = &shard0[4];
    ctx.store().ensure_table(TableFeatures::NONE).await?;
    let key = format!("{stream_a}:shardId-000000000000");
    let row = [
        ("leaseKey", AttributeValue::S(key.clone())),
        ("leaseOwner", AttributeValue::S("kcl-java-worker".into())),
        ("leaseCounter", AttributeValue::N("7".into())),
        ("checkpoint", AttributeValue::S(checkpoint.clone())),
        ("checkpointSubSequenceNumber", AttributeValue::N("0".into())),
        (
            "ownerSwitchesSinceCheckpoint",
            AttributeValue::N("0".into()),
        ),
        ("streamName", AttributeValue::S(stream_a.to_string())),
        ("shardId", AttributeValue::S("shardId-000000000000".into())),
    ];
    ctx.dynamodb
        .put_item()
        .table_name(&ctx.table)
        .set_item(Some(
            row.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        ))
        .send()
        .await?;

    let streams = ctx.path("streams.txt");
    std::fs::write(&streams, format!("{}\n{}\n", a.stream, b.stream))?;
    let streams_arg = streams.to_string_lossy().into_owned();
    let worker = WorkerProcess::spawn(
        WORKER,
        &ctx,
        "worker-a",
        &[
            "--streams-file",
            &streams_arg,
            "--shard-sync-ms",
            "1000",
            "--failover-ms",
            "3000",
            "--stream-removal-grace-ms",
            &REMOVAL_GRACE.as_millis().to_string(),
        ],
    )?;
    let delivered = |w: &WorkerProcess| -> anyhow::Result<BTreeSet<String>> {
        Ok(kcl_integration_tests::journal::delivered(&w.events()?)
            .into_iter()
            .collect())
    };
    let skipped: BTreeSet<String> = shard0[..5].iter().map(|(_, d)| d.clone()).collect();
    let mut want: BTreeSet<String> = payloads("a", 30)
        .into_iter()
        .chain(payloads("b", 10))
        .map(|(_, d)| d)
        .filter(|d| !skipped.contains(d))
        .collect();
    wait_until(
        "streams a and b delivered",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || Ok(want.is_subset(&delivered(&worker)?)),
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    let got = delivered(&worker)?;
    let again: Vec<&String> = skipped.iter().filter(|d| got.contains(*d)).collect();
    assert!(
        again.is_empty(),
        "delivered though KCL Java checkpointed them: {again:?}"
    );
    let init = worker
        .events()?
        .into_iter()
        .find(|e| e.event == "init" && e.shard.as_deref() == Some(key.as_str()))
        .expect("the KCL Java lease was processed");
    assert_eq!(init.checkpoint.as_deref(), Some(checkpoint.as_str()));

    // Added while the worker runs.
    std::fs::write(
        &streams,
        format!("{}\n{}\n{}\n", a.stream, b.stream, c.stream),
    )?;
    want.extend(payloads("c", 10).into_iter().map(|(_, d)| d));
    wait_until(
        "stream c delivered once added",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || Ok(want.is_subset(&delivered(&worker)?)),
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;

    // Every lease is keyed and described as KCL Java's multi-stream leases are.
    let leases = ctx.store().list().await?;
    let shards: Vec<_> = leases
        .iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .collect();
    assert_eq!(shards.len(), 4, "2 + 1 + 1 shards: {shards:?}");
    let stream_c = id(&c).stream_id().await?;
    let key_c = format!("{stream_c}:shardId-000000000000");
    let item = ctx
        .dynamodb
        .get_item()
        .table_name(&ctx.table)
        .key("leaseKey", AttributeValue::S(key_c.clone()))
        .send()
        .await?
        .item
        .expect("stream c's lease");
    assert_eq!(
        item.get("streamName"),
        Some(&AttributeValue::S(stream_c.to_string()))
    );
    assert_eq!(
        item.get("shardId"),
        Some(&AttributeValue::S("shardId-000000000000".into()))
    );
    eprintln!(
        "leases: {:?}",
        shards.iter().map(|l| l.key.as_str()).collect::<Vec<_>>()
    );

    // Removed while the worker runs: after the grace period its lease is deleted and its
    // processor told `lease_lost`; the other streams' leases stay.
    std::fs::write(&streams, format!("{}\n{}\n", a.stream, c.stream))?;
    let removed = std::time::Instant::now();
    let stream_b = id(&b).stream_id().await?;
    let key_b = format!("{stream_b}:shardId-000000000000");
    let took = wait_until(
        "stream b's lease deleted",
        REMOVAL_GRACE + Duration::from_secs(20),
        Duration::from_millis(200),
        async || {
            let keys = ctx.store().list().await?;
            Ok(!keys.iter().any(|l| l.key.as_str() == key_b))
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    assert!(
        took >= REMOVAL_GRACE,
        "deleted {took:?} after the removal, within the {REMOVAL_GRACE:?} grace period"
    );
    // Its holder finds out at its next renewal.
    let lost = || -> anyhow::Result<Vec<String>> {
        Ok(worker
            .events()?
            .into_iter()
            .filter(|e| e.event == "lease_lost")
            .map(|e| e.shard.unwrap_or_default())
            .collect())
    };
    wait_until(
        "stream b's processor told lease_lost",
        Duration::from_secs(10),
        Duration::from_millis(200),
        async || Ok(!lost()?.is_empty()),
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    assert_eq!(
        lost()?,
        vec![key_b.clone()],
        "only stream b's processor lost its lease"
    );
    let left = ctx.store().list().await?;
    let left: Vec<_> = left
        .iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .collect();
    assert_eq!(left.len(), 3, "streams a and c keep theirs: {left:?}");
    eprintln!(
        "stream b's lease deleted {:?} after its removal (grace {REMOVAL_GRACE:?})",
        removed.elapsed()
    );
    worker.terminate()?;
    Ok(())
}
