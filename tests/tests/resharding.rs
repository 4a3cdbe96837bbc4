//! Resharding while records are written: SplitShard, then MergeShards. Children are processed
//! only after their parents reached SHARD_END, no record is lost, per-key order holds. With
//! the leases in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kcl_aws::KinesisShardSource;
use kcl_core::ShardSource;
use kcl_integration_tests::journal::delivered;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const KEYS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_and_merge_keep_order_and_lose_nothing() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("reshard").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), run(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_and_merge_keep_order_and_lose_nothing_with_leases_in_postgres() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new_postgres("reshard-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), run(ctx)).await
}

/// Writes `pk-K:i` for every key, round after round, one PutRecord at a time so that each
/// key's order is the write order. Returns what was written.
fn start_writer(
    ctx: &Context,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<String>>> {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut round = 0usize;
        while !stop.load(Ordering::SeqCst) {
            for k in 0..KEYS {
                let pk = format!("pk-{k}");
                let data = format!("{pk}:{round}");
                ctx.put_retried(&pk, &data).await?;
                written.push(data);
            }
            round += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(written)
    })
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let mut worker = WorkerProcess::spawn(WORKER, &ctx, "resharder", &["--shard-sync-ms", "1000"])?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&ctx, stop.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Split the shard serving the lower half of the key space in the middle.
    let shards = source.list_shards().await?;
    let low = shards.iter().find(|s| s.hash_key_range.start == 0).unwrap();
    let middle = low.hash_key_range.end / 2 + 1;
    ctx.kinesis
        .split_shard()
        .stream_name(&ctx.stream)
        .shard_to_split(low.id.as_str())
        .new_starting_hash_key(middle.to_string())
        .send()
        .await?;
    ctx.wait_stream_active().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Merge the upper child of the split with the other original shard.
    let shards = source.list_shards().await?;
    let upper_child = shards
        .iter()
        .find(|s| !s.closed && s.hash_key_range.start == middle)
        .unwrap();
    let high = shards
        .iter()
        .find(|s| !s.closed && s.hash_key_range.end == u128::MAX)
        .unwrap();
    ctx.kinesis
        .merge_shards()
        .stream_name(&ctx.stream)
        .shard_to_merge(upper_child.id.as_str())
        .adjacent_shard_to_merge(high.id.as_str())
        .send()
        .await?;
    ctx.wait_stream_active().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    eprintln!("wrote {} records", written.len());

    let shards = source.list_shards().await?;
    let closed: Vec<String> = shards
        .iter()
        .filter(|s| s.closed)
        .map(|s| s.id.to_string())
        .collect();
    assert_eq!(
        closed.len(),
        3,
        "split closed one shard, merge two: {shards:?}"
    );
    let want: BTreeSet<String> = written.iter().cloned().collect();
    wait_until(
        "every record and every shard end",
        Duration::from_secs(90),
        Duration::from_millis(250),
        async || {
            let events = worker.events()?;
            let got: BTreeSet<String> = delivered(&events).into_iter().collect();
            let ended: BTreeSet<&str> = events
                .iter()
                .filter(|e| e.event == "shard_end")
                .filter_map(|e| e.shard.as_deref())
                .collect();
            Ok(got.is_superset(&want) && closed.iter().all(|c| ended.contains(c.as_str())))
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    worker.terminate()?;
    worker.wait_exit(Duration::from_secs(20)).await?;
    let events = worker.events()?;

    // Children start after every parent's shard end.
    let line = |event: &str, shard: &str| {
        events
            .iter()
            .filter(|e| e.event == event && e.shard.as_deref() == Some(shard))
            .map(|e| e.n)
            .collect::<Vec<_>>()
    };
    for child in shards.iter().filter(|s| !s.parent_shard_ids.is_empty()) {
        let Some(&first_init) = line("init", child.id.as_str()).first() else {
            continue; // Never started: it got no records and the test ended first.
        };
        for parent in &child.parent_shard_ids {
            let ended = line("shard_end", parent.as_str());
            assert!(
                ended.first().is_some_and(|&end| end < first_init),
                "child {} started (line {first_init}) before parent {parent} ended ({ended:?})",
                child.id
            );
        }
    }

    // Per partition key, first deliveries come in write order.
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for data in delivered(&events) {
        if !seen.insert(data.clone()) {
            continue;
        }
        let (pk, round) = data.split_once(':').unwrap();
        let round: usize = round.parse()?;
        if let Some(prev) = last.insert(pk.to_owned(), round) {
            assert_eq!(
                round,
                prev + 1,
                "{pk}: round {round} delivered after {prev}"
            );
        } else {
            assert_eq!(round, 0, "{pk}: first delivered round is {round}");
        }
    }
    Ok(())
}
