//! A consumer started at LATEST: nothing written before it started is delivered, and a
//! worker that crashes before its first checkpoint loses nothing written after it opened the
//! shards — the next owner reads from the start timestamp pinned in the lease
//! (`startingTimestamp`), not from LATEST again. Real processes, kinesis-mock and moto.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const ARGS: &[&str] = &[
    "--initial-position",
    "latest",
    "--no-batch-checkpoint",
    "--failover-ms",
    "3000",
    "--taker-ms",
    "500",
    "--idle-ms",
    "200",
];

fn records(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("key-{}", i % 8), format!("{prefix}{i}")))
        .collect()
}

fn data(records: &[(String, String)]) -> Vec<String> {
    records.iter().map(|(_, d)| d.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_first_checkpoint_loses_nothing_after_the_first_open()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("latest").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let old = records("old", 20);
    ctx.put(&old).await?;
    // Older than the pin's 2 s margin for clock skew.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut a = WorkerProcess::spawn(WORKER, &ctx, "worker-a", ARGS)?;
    wait_until(
        "worker-a to pin both shards",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            // The table does not exist until worker-a has created it.
            let Ok(mut leases) = ctx.store().list().await else {
                return Ok(false);
            };
            // The leader and standby rows (coordination = leader) are not shard leases.
            leases.retain(|l| !kcl_core::singleton::is_coordination_key(&l.key));
            Ok(leases.len() == 2
                && leases.iter().all(|l| {
                    l.checkpoint == Checkpoint::Latest
                        && l.start_timestamp.is_some()
                        && l.owner.as_ref().is_some_and(|o| o.as_str() == "worker-a")
                }))
        },
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = records("first", 20);
    ctx.put(&first).await?;
    let want_first: BTreeSet<String> = data(&first).into_iter().collect();
    wait_until(
        "worker-a to deliver what was written after it opened the shards",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || Ok(delivered_set([a.events()?.as_slice()]).is_superset(&want_first)),
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    a.kill()?; // nothing checkpointed: every lease still says LATEST

    let during = records("during", 20);
    ctx.put(&during).await?;
    let mut b = WorkerProcess::spawn(WORKER, &ctx, "worker-b", ARGS)?;
    let later = records("later", 20);
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.put(&later).await?;
    let want: BTreeSet<String> = data(&during).into_iter().chain(data(&later)).collect();
    wait_until(
        "worker-b to deliver everything written since worker-a opened the shards",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(delivered_set([b.events()?.as_slice()]).is_superset(&want)),
    )
    .await
    .map_err(|e| {
        let got = delivered_set([b.events().unwrap_or_default().as_slice()]);
        let missing: Vec<&String> = want.iter().filter(|d| !got.contains(*d)).collect();
        e.context(format!("missing {missing:?}\n{}", b.log_tail()))
    })?;
    let everything = delivered_set([a.events()?.as_slice(), b.events()?.as_slice()]);
    let replayed = data(&old)
        .iter()
        .filter(|d| everything.contains(*d))
        .count();
    assert_eq!(replayed, 0, "records from before the start delivered");
    b.terminate()?;
    assert!(b.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}
