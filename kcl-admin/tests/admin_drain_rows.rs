//! Issue 50, item 3a: a worker drained by `release` that starts again under a new id leaves
//! its drain row behind (a worker deletes only its own). `release` of the old id said the
//! table had no row of it; now it names the drain row and the undo, `leases` lists the row as
//! stale, and `release --undo` deletes it. The table is as such a fleet leaves it: worker-a's
//! drain row, its shards held by worker-b and by worker-a2 (worker-a, started again under a
//! new id).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use common::admin;
use kcl_core::singleton::COORDINATION_PREFIX;
use kcl_core::{Checkpoint, Lease, LeaseStore, ShardId, WorkerId};
use kcl_integration_tests::Context;

async fn held(ctx: &Context, key: &str, owner: &str) -> anyhow::Result<()> {
    let store = ctx.store();
    store
        .ensure_table(kcl_core::lease::TableFeatures::default())
        .await?;
    store
        .create(&Lease::new(ShardId::new(key), Checkpoint::TrimHorizon))
        .await?;
    let row = store.get(&ShardId::new(key)).await?.expect("created");
    store.take(&row, &WorkerId::new(owner)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_row_left_behind_is_listed_named_and_undone() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-drain-left").await? else {
        return Ok(());
    };
    held(&ctx, "shardId-000000000000", "worker-b").await?;
    held(&ctx, "shardId-000000000001", "worker-a2").await?;
    let drain = ShardId::new(format!("{COORDINATION_PREFIX}drain/worker-a"));
    anyhow::ensure!(
        ctx.store()
            .create(&Lease::new(drain.clone(), Checkpoint::TrimHorizon))
            .await?
    );
    let release = |extra: &[&str]| {
        let args = [
            "release",
            "--application-name",
            &ctx.table,
            "--worker",
            "worker-a",
            "--timeout",
            "2s",
        ];
        admin(&ctx, &[&args[..], extra].concat())
    };

    // `release` of the old id: refused, naming the row left and the undo.
    let out = release(&[])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "release of a gone worker succeeded");
    anyhow::ensure!(
        stderr.contains(drain.as_str()) && stderr.contains("--undo"),
        "the drain row is not named: {stderr}"
    );

    // `leases`: the row, stale, with the undo.
    let leases = [
        "leases",
        "--application-name",
        &ctx.table,
        "--observe",
        "0s",
    ];
    let out = admin(&ctx, &leases)?;
    let table = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "leases failed");
    anyhow::ensure!(
        table.contains("worker-a: holds nothing")
            && table.contains("release --worker worker-a --undo"),
        "the stale drain row is not listed:\n{table}"
    );
    let out = admin(&ctx, &[&leases[..], &["--json"]].concat())?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let rows = doc["drain_rows"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(
        rows.len() == 1 && rows[0]["worker"] == "worker-a" && rows[0]["stale"] == true,
        "{doc}"
    );

    // The undo: the row goes; a second undo has nothing to do.
    let out = release(&["--undo"])?;
    anyhow::ensure!(out.status.success(), "release --undo failed");
    anyhow::ensure!(
        ctx.store().get(&drain).await?.is_none(),
        "the drain row is still there"
    );
    let out = release(&["--undo"])?;
    anyhow::ensure!(!out.status.success(), "an undo of nothing succeeded");
    anyhow::ensure!(String::from_utf8_lossy(&out.stderr).contains("no drain row"));
    Ok(())
}

/// `release --undo` of a worker drained while it runs: it takes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_undo_lets_a_running_worker_take_work_again() -> anyhow::Result<()> {
    use std::time::Duration;

    use kcl_integration_tests::process::{WorkerProcess, test_worker_bin};
    use kcl_integration_tests::{wait_until, with_timeout};

    let Some(ctx) = Context::new("admin-drain-undo").await? else {
        return Ok(());
    };
    with_timeout(
        Duration::from_secs(180),
        Box::pin(async move {
            ctx.create_stream(2).await?;
            let bin = test_worker_bin()?;
            let bin = bin.to_str().unwrap();
            let extra = ["--failover-ms", "3000"];
            let a = WorkerProcess::spawn(bin, &ctx, "worker-a", &extra)?;
            let b = WorkerProcess::spawn(bin, &ctx, "worker-b", &extra)?;
            let holds = |worker: &'static str| {
                let ctx = &ctx;
                async move || {
                    let owners = ctx.owners().await.unwrap_or_default();
                    Ok(owners.len() == 2 && owners.values().any(|o| o.as_deref() == Some(worker)))
                }
            };
            let limit = Duration::from_secs(60);
            let every = Duration::from_millis(250);
            // Each holds a shard: `release` refuses when no other worker shows to take them.
            let both = async || Ok(holds("worker-a")().await? && holds("worker-b")().await?);
            wait_until("each worker holds a shard", limit, every, both).await?;
            let args = [
                "release",
                "--application-name",
                &ctx.table,
                "--worker",
                "worker-a",
                "--failover-time",
                "3s",
            ];
            let out = admin(&ctx, &args)?;
            anyhow::ensure!(out.status.success(), "release failed");
            // Drained: it takes nothing back while the row is there (two failover times).
            tokio::time::sleep(Duration::from_secs(6)).await;
            anyhow::ensure!(!holds("worker-a")().await?, "{:?}", ctx.owners().await?);
            let out = admin(&ctx, &[&args[..], &["--undo"]].concat())?;
            anyhow::ensure!(out.status.success(), "release --undo failed");
            let taken =
                wait_until("worker-a takes work again", limit, every, holds("worker-a")).await;
            for w in [&a, &b] {
                w.terminate()?;
            }
            taken.map(drop)
        }),
    )
    .await
}
