//! `kcl-admin` against the emulators, on rows the test writes itself (issue 34): `release` of
//! a worker the table does not know is refused naming the known ones, `reset` prints the
//! checkpoint it replaced, and `remove-kcl-rows` deletes nothing of a fleet whose failover
//! time is 30 s (its rows renewed every 15 s); `leases` and `reset` on a multi-stream table's
//! keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::admin;
use kcl_core::multi_stream::StreamId;
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

/// Issue 34, item 6: a multi-stream table's lease (`account:stream:creationEpoch:shardId`) is
/// shown against its stream's shard by `leases`, and `reset --shard` takes it, by its full
/// key or by the shard id of the stream named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_reset_take_multi_stream_lease_keys() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-multi-stream").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    let id = StreamId::new("000000000000", ctx.stream.clone(), 1_700_000_000);
    let key = id.lease_key(&ShardId::new(SHARD));
    let seq = Checkpoint::Sequence(ExtendedSequenceNumber::new(
        SequenceNumber::parse(SEQ.to_owned()).unwrap(),
    ));
    held(&ctx, key.as_str(), "worker-a", seq).await?;
    // A lease of another stream of the same table: not the named stream's, not "gone".
    let other = StreamId::new("000000000000", "another-stream", 1_700_000_000);
    let other_key = other.lease_key(&ShardId::new(SHARD));
    held(
        &ctx,
        other_key.as_str(),
        "worker-a",
        Checkpoint::TrimHorizon,
    )
    .await?;

    let out = admin(
        &ctx,
        &[
            "leases",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--observe",
            "0s",
            "--json",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let shards = doc["shards"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(
        shards.len() == 2,
        "want the stream's shard on its lease's line and the other stream's lease: {doc}"
    );
    let line = shards
        .iter()
        .find(|s| s["shard"] == key.as_str())
        .ok_or_else(|| anyhow::anyhow!("no line for {key}: {doc}"))?;
    anyhow::ensure!(line["leased"] == true && line["stream"] == "open", "{line}");
    anyhow::ensure!(
        line["stream_id"] == id.to_string().as_str() && line["shard_id"] == SHARD,
        "{line}"
    );
    let other_line = shards
        .iter()
        .find(|s| s["shard"] == other_key.as_str())
        .ok_or_else(|| anyhow::anyhow!("no line for {other_key}: {doc}"))?;
    anyhow::ensure!(
        other_line["stream"].is_null() || other_line["stream"] == "-",
        "{other_line}"
    );

    let reset = |shard: &str| {
        admin(
            &ctx,
            &[
                "reset",
                "--application-name",
                &ctx.table,
                "--stream",
                &ctx.stream,
                "--shard",
                shard,
                "--to",
                "TRIM_HORIZON",
                "--failover-time",
                "1s",
            ],
        )
    };
    let out = reset(key.as_str())?;
    anyhow::ensure!(out.status.success(), "reset by the full lease key failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(stdout.contains(SEQ), "{stdout}");
    let row = ctx.store().get(&key).await?.expect("the lease");
    anyhow::ensure!(row.checkpoint == Checkpoint::TrimHorizon, "{row:?}");

    // By the shard id of the stream named: the same lease.
    let out = reset(SHARD)?;
    anyhow::ensure!(out.status.success(), "reset by shard id failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(stdout.contains(key.as_str()), "{stdout}");
    let row = ctx.store().get(&ShardId::new(SHARD)).await?;
    anyhow::ensure!(row.is_none(), "a single-stream lease was made: {row:?}");

    // Another stream's lease, with this stream named: refused.
    let out = reset(other_key.as_str())?;
    anyhow::ensure!(!out.status.success(), "another stream's lease was reset");
    Ok(())
}
