//! Issue 50, item 2: `leases` and `reset` check the stream named against the table.
//! `reset --stream payments` on the orders table once reset orders' shard 1 to TRIM_HORIZON
//! (both streams have a `shardId-000000000001`): now refused, by the checkpoints (records of
//! orders' shards, not payments'), naming orders; by the shard ids (a stream with other
//! shards); by the stream names of a multi-stream table's keys. A sequence number of
//! another shard is refused naming the shard it is of (it once said the shard reset did not
//! exist), and `reset --dry-run` says about how many records a reset replays or skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::admin;
use kcl_core::multi_stream::StreamId;
use kcl_core::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseStore, SequenceNumber, ShardId, WorkerId,
};
use kcl_integration_tests::Context;

const SHARD0: &str = "shardId-000000000000";
const SHARD1: &str = "shardId-000000000001";

/// A lease of `key` held by worker-a, checkpointed at `checkpoint`.
async fn held(ctx: &Context, key: &str, checkpoint: Checkpoint) -> anyhow::Result<()> {
    let store = ctx.store();
    store
        .ensure_table(kcl_core::lease::TableFeatures::default())
        .await?;
    store
        .create(&Lease::new(ShardId::new(key), checkpoint))
        .await?;
    let row = store.get(&ShardId::new(key)).await?.expect("created");
    store.take(&row, &WorkerId::new("worker-a")).await?;
    Ok(())
}

fn at(seq: &str) -> Checkpoint {
    Checkpoint::Sequence(ExtendedSequenceNumber::new(
        SequenceNumber::parse(seq.to_owned()).unwrap(),
    ))
}

/// Records put into `ctx`'s stream until each of its two shards has `n`: their sequence
/// numbers, by shard.
async fn records(ctx: &Context, n: usize) -> anyhow::Result<[Vec<String>; 2]> {
    let mut by_shard: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for i in 0..1000 {
        if by_shard.iter().all(|s| s.len() >= n) {
            return Ok(by_shard);
        }
        let (shard, seq) = ctx.put_one(&format!("key-{i}"), "a record").await?;
        by_shard[usize::from(shard == SHARD1)].push(seq);
    }
    anyhow::bail!("the records do not reach both shards")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_reset_refuse_a_stream_the_table_is_not_of() -> anyhow::Result<()> {
    let Some(orders) = Context::new("admin-other-stream").await? else {
        return Ok(());
    };
    orders.create_stream(2).await?;
    // Made a second later: its shards' sequence numbers say another creation time.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let payments = orders.on("payments");
    payments.create_stream(2).await?;
    let small = orders.on("small");
    small.create_stream(1).await?;
    let [s0, s1] = records(&orders, 3).await?;
    records(&payments, 3).await?;
    held(&orders, SHARD0, at(&s0[1])).await?;
    held(&orders, SHARD1, at(&s1[1])).await?;

    let leases = |stream: &str, extra: &[&str]| {
        let args = [
            "leases",
            "--application-name",
            &orders.table,
            "--stream",
            stream,
            "--observe",
            "0s",
        ];
        admin(&orders, &[&args[..], extra].concat())
    };
    let reset = |stream: &str, extra: &[&str]| {
        let args = [
            "reset",
            "--application-name",
            &orders.table,
            "--stream",
            stream,
            "--to",
            "TRIM_HORIZON",
            "--failover-time",
            "1s",
        ];
        admin(&orders, &[&args[..], extra].concat())
    };
    // The table's own stream: shown, and a dry run goes through.
    anyhow::ensure!(leases(&orders.stream, &[])?.status.success());
    let out = reset(&orders.stream, &["--shard", SHARD1, "--dry-run"])?;
    anyhow::ensure!(out.status.success(), "{}", stderr(&out));

    // payments: the same shard ids; its checkpoints say orders'.
    for out in [
        leases(&payments.stream, &[])?,
        reset(&payments.stream, &["--shard", SHARD1])?,
        reset(&payments.stream, &["--all", "--dry-run"])?,
    ] {
        let text = stderr(&out);
        anyhow::ensure!(!out.status.success(), "payments accepted for orders' table");
        anyhow::ensure!(
            text.contains(&format!("--stream {} is not the stream", payments.stream))
                && text.contains(&format!("of stream {}", orders.stream)),
            "the refusal does not name both streams: {text}"
        );
    }
    let row = orders.store().get(&ShardId::new(SHARD1)).await?.unwrap();
    anyhow::ensure!(row.checkpoint == at(&s1[1]), "reset: {row:?}");

    // A stream with other shards: refused by the shard ids.
    let out = leases(&small.stream, &[])?;
    let text = stderr(&out);
    anyhow::ensure!(!out.status.success(), "small accepted for orders' table");
    anyhow::ensure!(
        text.contains("shards") && text.contains(SHARD1),
        "the refusal does not name the shard: {text}"
    );

    // --force-stream (a stream made again under its name): shown, with a warning.
    let out = leases(&payments.stream, &["--force-stream"])?;
    anyhow::ensure!(out.status.success(), "--force-stream refused");
    anyhow::ensure!(stderr(&out).contains("is not the stream"), "no warning");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_refuses_a_stream_a_multi_stream_table_does_not_have() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-multi-other").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    let other = StreamId::new("000000000000", "orders", 1_700_000_000);
    held(
        &ctx,
        other.lease_key(&ShardId::new(SHARD0)).as_str(),
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
        ],
    )?;
    let text = stderr(&out);
    anyhow::ensure!(!out.status.success(), "another stream's table shown");
    anyhow::ensure!(
        text.contains(&ctx.stream) && text.contains("of orders"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_another_shards_record_names_that_shard() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-other-shard").await? else {
        return Ok(());
    };
    ctx.create_stream(2).await?;
    let [s0, s1] = records(&ctx, 3).await?;
    held(&ctx, SHARD0, at(&s0[2])).await?;
    held(&ctx, SHARD1, at(&s1[2])).await?;
    let out = admin(
        &ctx,
        &[
            "reset",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--shard",
            SHARD0,
            "--to",
            &s1[0],
            "--failover-time",
            "1s",
        ],
    )?;
    let text = stderr(&out);
    anyhow::ensure!(
        !out.status.success(),
        "a record of shard 1 accepted for shard 0"
    );
    anyhow::ensure!(
        text.contains(&format!("--shard {SHARD1}")) && !text.contains("does not exist"),
        "the right shard is not named: {text}"
    );
    let row = ctx.store().get(&ShardId::new(SHARD0)).await?.unwrap();
    anyhow::ensure!(row.checkpoint == at(&s0[2]), "written: {row:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_dry_run_says_how_many_records_it_replays_or_skips() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-dry-count").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    let mut seqs = Vec::new();
    for i in 0..30 {
        seqs.push(ctx.put_one(&format!("key-{i}"), "a record").await?.1);
    }
    // Checkpointed at the 10th record: the holder reads on from the 11th.
    held(&ctx, SHARD0, at(&seqs[9])).await?;
    let dry_run = |to: &str| {
        admin(
            &ctx,
            &[
                "reset",
                "--application-name",
                &ctx.table,
                "--stream",
                &ctx.stream,
                "--shard",
                SHARD0,
                "--to",
                to,
                "--dry-run",
            ],
        )
    };
    for (to, says) in [
        ("TRIM_HORIZON", "replays about 10 record(s)"),
        ("LATEST", "skips about 20 record(s)"),
        (seqs[4].as_str(), "replays about 5 record(s)"),
        (seqs[19].as_str(), "skips about 10 record(s)"),
        (seqs[9].as_str(), "replays and skips nothing"),
    ] {
        let out = dry_run(to)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(out.status.success(), "--to {to}: {}", stderr(&out));
        anyhow::ensure!(
            stdout.contains(says),
            "--to {to}: want `{says}` in {stdout}"
        );
    }
    let row = ctx.store().get(&ShardId::new(SHARD0)).await?.unwrap();
    anyhow::ensure!(row.checkpoint == at(&seqs[9]), "written: {row:?}");
    Ok(())
}
