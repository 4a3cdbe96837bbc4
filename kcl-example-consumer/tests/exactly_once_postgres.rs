//! The example consumer on Postgres, on the emulators and a real Postgres
//! (`KCL_POSTGRES_URL`; skipped without it, failing under `CI=true`):
//!
//! - `--lease-store postgres://…` with `--exactly-once-table`: the leases in Postgres and
//!   the window table in the same database, each commit one transaction with the lease row;
//! - the leases in DynamoDB and the window table in Postgres (`--exactly-once-store`), each
//!   commit one transaction with the sink's `kcl_positions` row, the lease's checkpoint
//!   following.
//!
//! Either way two consumers share a 2-shard stream while records flow; one is SIGKILLed
//! mid-window, the other takes its shard over, and is stopped with SIGTERM at the end. Each
//! window's count in the table must equal the records the stream holds for it (read back
//! with their arrival times): nothing counted twice, nothing lost, a window emitted in parts
//! added up. And the URL's password never appears in what the consumer prints, and a wrong
//! URL or a missing table stops it at start with what to fix (`exactly_once_postgres/
//! refusals.rs`); a worker without the flag is found out (`steps.rs`); the rows' statements
//! called directly (`items.rs`).

#![cfg(feature = "postgres")]
#![allow(clippy::print_stderr)]

mod common;
#[path = "exactly_once_postgres/items.rs"]
mod items;
#[path = "exactly_once_postgres/refusals.rs"]
mod refusals;
#[path = "exactly_once_postgres/steps.rs"]
mod steps;
#[path = "exactly_once_postgres/world.rs"]
mod world;

use std::time::Duration;

use anyhow::{Context as _, ensure};
use kcl_integration_tests::leases::postgres_url;
use kcl_integration_tests::{Context, Producer, count_by_owner, wait_until, with_timeout};

use common::consumer::Consumer;

/// Leases and windows in one Postgres database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_in_postgres_count_each_window_exactly_once_across_a_kill() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("eo-pg-leases").await? else {
        return Ok(());
    };
    let url = postgres_url()?.context("KCL_POSTGRES_URL")?;
    let table = world::table_name(&ctx);
    let args = [
        "--stream",
        &ctx.stream,
        "--lease-store",
        &url,
        "--exactly-once-table",
        &table,
    ];
    let body = async {
        let pg = world::client(&url).await?;
        fleet(&ctx, &pg, &table, &args).await?;
        // The lease rows are in Postgres, each at the position its last commit wrote with it.
        let leases = world::lease_checkpoints(&ctx).await?;
        let positions = world::positions(&pg, &table).await?;
        ensure!(leases.len() == 2, "lease rows in Postgres: {leases:?}");
        ensure!(
            leases == positions,
            "the lease rows {leases:?} against the table's positions {positions:?}"
        );
        Ok(())
    };
    with_timeout(Duration::from_secs(180), Box::pin(body)).await
}

/// Leases in DynamoDB, windows in Postgres through a sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_table_in_postgres_beside_dynamodb_leases_counts_exactly_once()
-> anyhow::Result<()> {
    let Some(url) = postgres_url()? else {
        return Ok(());
    };
    let Some(ctx) = Context::new("eo-pg-sink").await? else {
        return Ok(());
    };
    let table = world::table_name(&ctx);
    let args = [
        "--stream",
        &ctx.stream,
        "--exactly-once-table",
        &table,
        "--exactly-once-store",
        &url,
    ];
    let body = async {
        let pg = world::client(&url).await?;
        fleet(&ctx, &pg, &table, &args).await?;
        // The lease's checkpoint (DynamoDB) follows the sink's position (Postgres), which
        // moved with the table's, in the same transaction.
        let leases = world::lease_checkpoints(&ctx).await?;
        let sink = world::sink_positions(&pg, &ctx.table).await?;
        let positions = world::positions(&pg, &table).await?;
        ensure!(sink.len() == 2, "the sink's rows: {sink:?}");
        ensure!(
            leases == sink,
            "the lease checkpoints {leases:?} against the sink's positions {sink:?}"
        );
        ensure!(
            positions == sink,
            "the table's positions {positions:?} against the sink's {sink:?}"
        );
        Ok(())
    };
    with_timeout(Duration::from_secs(180), Box::pin(body)).await
}

/// Two consumers with `args` share the 2-shard stream while records flow (the second takes
/// a shard from the first by a graceful handoff, mid-window: that window is emitted in two
/// parts); the first is SIGKILLed mid-window, the second takes its shard over and is stopped
/// at the end; then every window's count in `table` must equal what the stream holds for it.
async fn fleet(
    ctx: &Context,
    pg: &tokio_postgres::Client,
    table: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    let (poll, long) = (Duration::from_millis(250), Duration::from_secs(60));
    ctx.create_stream(2).await?;
    let producer = Producer::start(ctx, "pg-", 5, Duration::from_millis(200));
    let first = Consumer::spawn_with(ctx, "pg-a", args)?;
    let owns = async |worker: &str, n: usize| {
        let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
        Ok::<_, anyhow::Error>(by.get(&Some(worker.to_owned())) == Some(&n))
    };
    wait_until(
        "both shards, and windows committed",
        long,
        poll,
        async || Ok(owns("pg-a", 2).await? && world::counted(pg, table).await >= 10),
    )
    .await
    .with_context(|| first.log_tail())?;
    let mut second = Consumer::spawn_with(ctx, "pg-b", args)?;
    let tails = |a: &Consumer, b: &Consumer| format!("{}\n---\n{}", a.log_tail(), b.log_tail());
    wait_until(
        "a shard each, and windows committed",
        long,
        poll,
        async || {
            let split = owns("pg-a", 1).await? && owns("pg-b", 1).await?;
            Ok(split && world::counted(pg, table).await >= 30)
        },
    )
    .await
    .with_context(|| tails(&first, &second))?;
    // Mid-window: what it counted since its last commit is counted again by the next owner.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(first);
    wait_until(
        "the killed consumer's shard taken over",
        long,
        poll,
        async || {
            let by = count_by_owner(&ctx.owners().await?);
            Ok(by.get(&Some("pg-b".into())) == Some(&2))
        },
    )
    .await
    .with_context(|| second.log_tail())?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = u64::try_from(producer.stop().await?.len())?;
    wait_until("every record counted", long, poll, async || {
        Ok(world::counted(pg, table).await >= written)
    })
    .await
    .with_context(|| second.log_tail())?;
    second.stop().await?;
    let (produced, counted) = (world::produced(ctx).await?, world::counts(pg, table).await);
    let differ = world::differences(&produced, &counted);
    eprintln!(
        "{table}: {written} records written, {} windows, {} counted in all; {} window rows \
         built by more than one commit",
        produced.len(),
        counted.values().sum::<u64>(),
        world::in_parts(pg, table).await?
    );
    ensure!(
        differ.is_empty(),
        "windows counted differently from the stream ((shard, start ms), produced, counted): \
         {differ:?}"
    );
    ensure!(
        produced.values().sum::<u64>() == written,
        "the stream holds other records"
    );
    Ok(())
}
