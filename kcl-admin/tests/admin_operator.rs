//! `kcl-admin` against the emulators, on rows the test writes itself (issue 34): `release` of
//! a worker the table does not know is refused naming the known ones, `reset` prints the
//! checkpoint it replaced, and `remove-kcl-rows` deletes nothing of a fleet whose failover
//! time is 30 s (its rows renewed every 15 s).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::admin;
use kcl_core::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseStore, SequenceNumber, ShardId, WorkerId,
};
use kcl_integration_tests::{Context, with_timeout};

const SHARD: &str = "shardId-000000000000";
const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

async fn held(ctx: &Context, key: &str, owner: &str, checkpoint: Checkpoint) -> anyhow::Result<()> {
    let store = ctx.store();
    store
        .ensure_table(kcl_core::lease::TableFeatures::default())
        .await?;
    store
        .create(&Lease::new(ShardId::new(key), checkpoint))
        .await?;
    let row = store.get(&ShardId::new(key)).await?.expect("created");
    store.take(&row, &WorkerId::new(owner)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_an_unknown_worker_is_refused_naming_the_known_ones() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-release-unknown").await? else {
        return Ok(());
    };
    held(
        &ctx,
        "shardId-000000000000",
        "worker-a",
        Checkpoint::TrimHorizon,
    )
    .await?;
    held(
        &ctx,
        "shardId-000000000001",
        "worker-b",
        Checkpoint::TrimHorizon,
    )
    .await?;
    let out = admin(
        &ctx,
        &[
            "release",
            "--application-name",
            &ctx.table,
            "--worker",
            "worker-c",
            "--timeout",
            "2s",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        !out.status.success(),
        "release of an unknown worker succeeded"
    );
    anyhow::ensure!(
        stderr.contains("worker-a") && stderr.contains("worker-b"),
        "the known workers are not named: {stderr}"
    );
    let rows = ctx.store().list().await?;
    anyhow::ensure!(
        rows.iter().all(|l| !l.key.as_str().contains("worker-c")),
        "a drain row was written: {rows:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prints_the_checkpoint_it_replaced() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-reset-prints").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    let seq = Checkpoint::Sequence(ExtendedSequenceNumber::new(
        SequenceNumber::parse(SEQ.to_owned()).unwrap(),
    ));
    held(&ctx, SHARD, "worker-a", seq).await?;
    let reset = [
        "reset",
        "--application-name",
        &ctx.table,
        "--stream",
        &ctx.stream,
        "--shard",
        SHARD,
        "--to",
        "TRIM_HORIZON",
        "--failover-time",
        "1s",
    ];
    let out = admin(&ctx, &[&reset[..], &["--dry-run"]].concat())?;
    anyhow::ensure!(out.status.success(), "reset --dry-run failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        stdout.contains(SEQ),
        "--dry-run does not show the checkpoint: {stdout}"
    );
    let out = admin(&ctx, &reset)?;
    anyhow::ensure!(out.status.success(), "reset failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        stdout.contains(SEQ),
        "reset does not show what it replaced: {stdout}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_kcl_rows_deletes_nothing_of_a_fleet_with_a_30s_failover_time() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("admin-remove-30s").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(remove_run(ctx))).await
}

async fn remove_run(ctx: Context) -> anyhow::Result<()> {
    // The leader's row of a fleet with a 30 s failover time: renewed every 15 s.
    let key = format!("{}worker-leader", kcl_core::singleton::COORDINATION_PREFIX);
    held(&ctx, &key, "worker-a", Checkpoint::TrimHorizon).await?;
    let store = ctx.store();
    let renewer = {
        let key = ShardId::new(key.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(15)).await;
                let Ok(Some(row)) = store.get(&key).await else {
                    continue;
                };
                let _ = store.renew(&row).await;
            }
        })
    };
    let out = admin(
        &ctx,
        &[
            "remove-kcl-rows",
            "--application-name",
            &ctx.table,
            "--failover-time",
            "30s",
        ],
    );
    renewer.abort();
    let out = out?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "removed the rows of a running fleet");
    anyhow::ensure!(stderr.contains("still running"), "{stderr}");
    let left = ctx.store().get(&ShardId::new(key)).await?;
    anyhow::ensure!(left.is_some(), "the leader's row was deleted");
    Ok(())
}
