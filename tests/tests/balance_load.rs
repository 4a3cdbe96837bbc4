//! Balancing by load with real processes: four workers under a leader share 8 shards 2/2/2/2
//! (by count: every lease costs nothing yet); then both shards of one worker turn hot (each
//! record costs 400 ms of busy time, a record a second on every shard). A count balance is
//! content with that; the load balance moves one of them to another worker. Then nothing
//! moves for 30 s, and every record written is delivered.
//!
//! The balancing timing is shortened through the workers' flags: smoothing 3 s, move window
//! 5 s, stickiness 20 s (the defaults: 60 s, 60 s, 10 min). Processors checkpoint every 10th
//! record, not every batch: a checkpoint is busy time, and one a second against a loaded
//! emulator costs up to a tenth of a second, which would make the cold shards weigh as much as
//! the band (0.1) and move for load in turn.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kcl_core::LeaseStore;
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const WORKERS: [&str; 4] = ["worker-a", "worker-b", "worker-c", "worker-d"];
/// How long nothing may move once the hot shards are apart.
const QUIET: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hot_shards_of_one_worker_end_on_two() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("balance-load").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(300), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(8).await?;
    let keys = key_per_shard(&ctx).await?;
    let hot_file = ctx.path("hot-shards");
    std::fs::write(&hot_file, "")?;
    let hot_path = hot_file.to_string_lossy().into_owned();
    let flags = [
        "--balance-by",
        "load",
        "--smoothing-ms",
        "3000",
        "--move-window-ms",
        "5000",
        "--stickiness-ms",
        "20000",
        "--hot-shards-file",
        &hot_path,
        "--hot-record-ms",
        "400",
        "--no-batch-checkpoint",
        "--checkpoint-every",
        "10",
    ];
    // Under a leader whatever KCL_TEST_COORDINATION says: every worker balances counts.
    let workers = WORKERS
        .iter()
        .map(|id| WorkerProcess::spawn_in("leader", WORKER, &ctx, id, &flags))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let producer = tokio::spawn(produce(ctx.clone(), keys.clone()));
    wait_until(
        "the fleet holds 2/2/2/2",
        Duration::from_secs(90),
        Duration::from_millis(500),
        async || Ok(held(&ctx).await?.values().all(|s| s.len() == 2)),
    )
    .await?;
    // Both shards of one worker turn hot.
    let by = held(&ctx).await?;
    let (victim, hot) = by.iter().next().expect("four workers");
    std::fs::write(&hot_file, hot.join("\n"))?;
    let turned = Instant::now();
    eprintln!("{victim}'s shards {hot:?} are hot");
    let apart = |owners: &BTreeMap<String, Option<String>>| {
        let a = owners.get(&hot[0]).cloned().flatten();
        a.is_some() && a != owners.get(&hot[1]).cloned().flatten()
    };
    let limit = Duration::from_secs(120);
    while !apart(&ctx.owners().await?) {
        if turned.elapsed() > limit {
            anyhow::bail!(
                "the hot shards never left one worker in {limit:?}: {}",
                figures(&ctx).await?
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "apart {:?} after they turned hot: {}",
        turned.elapsed(),
        figures(&ctx).await?
    );
    quiet(&ctx).await?;
    let written = {
        producer.abort();
        let _ = producer.await;
        written(&ctx, &keys).await?
    };
    delivered(&workers, &written).await?;
    for w in &workers {
        w.terminate()?;
    }
    for mut w in workers {
        assert!(w.wait_exit(Duration::from_secs(20)).await?.success());
    }
    Ok(())
}

/// Each worker's shards (every worker listed, holding some or none; none before the first
/// worker made the table).
async fn held(ctx: &Context) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut by: BTreeMap<String, Vec<String>> =
        WORKERS.iter().map(|w| ((*w).to_owned(), vec![])).collect();
    for (shard, owner) in ctx.owners().await.unwrap_or_default() {
        if let Some(owner) = owner {
            by.entry(owner).or_default().push(shard);
        }
    }
    Ok(by)
}

/// No lease changes owner for [`QUIET`].
async fn quiet(ctx: &Context) -> anyhow::Result<()> {
    let before = ctx.owners().await?;
    let start = Instant::now();
    while start.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.owners().await?;
        anyhow::ensure!(
            now == before,
            "a lease moved {:?} after the hot shards were apart: {before:?} → {now:?}; {}",
            start.elapsed(),
            figures(ctx).await?
        );
    }
    Ok(())
}

/// The rows' owners and load figures, for messages.
async fn figures(ctx: &Context) -> anyhow::Result<String> {
    let rows = ctx.store().list().await?;
    let lines: Vec<String> = rows
        .iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .map(|l| {
            let owner = l.owner.as_ref().map_or("-", |o| o.as_str());
            let load = l.load.map_or(0, |f| f.milli);
            format!("{} {owner} {load}‰", l.key.as_str())
        })
        .collect();
    Ok(lines.join(", "))
}

/// A partition key for each shard, found by writing one record with each candidate (those
/// records are part of what must be delivered).
async fn key_per_shard(ctx: &Context) -> anyhow::Result<BTreeMap<String, String>> {
    let mut keys = BTreeMap::new();
    for i in 0..200 {
        let key = format!("pk-{i}");
        let (shard, _) = ctx.put_one(&key, &format!("probe-{i}")).await?;
        keys.entry(shard).or_insert(key);
        if keys.len() == 8 {
            return Ok(keys);
        }
    }
    anyhow::bail!("200 keys reached only {} shards", keys.len())
}

/// A record a second on every shard, payloads `r{n}-{shard}`, until aborted.
async fn produce(ctx: Context, keys: BTreeMap<String, String>) -> anyhow::Result<()> {
    for n in 0u64.. {
        let records: Vec<(String, String)> = keys
            .iter()
            .map(|(shard, key)| (key.clone(), format!("r{n}-{shard}")))
            .collect();
        ctx.put(&records).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Every payload in the stream (the producer may have been aborted mid-write: the stream
/// says what was written).
async fn written(ctx: &Context, keys: &BTreeMap<String, String>) -> anyhow::Result<Vec<String>> {
    let mut all = Vec::new();
    for shard in keys.keys() {
        all.extend(ctx.read_shard(shard).await?.into_iter().map(|(_, d)| d));
    }
    Ok(all)
}

/// Waits until every payload of `want` appears in some worker's journal.
async fn delivered(workers: &[WorkerProcess], want: &[String]) -> anyhow::Result<()> {
    wait_until(
        "every record delivered",
        Duration::from_secs(60),
        Duration::from_millis(500),
        async || {
            let journals = workers
                .iter()
                .map(WorkerProcess::events)
                .collect::<anyhow::Result<Vec<_>>>()?;
            let got = delivered_set(journals.iter().map(Vec::as_slice));
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await?;
    Ok(())
}
