//! `--exactly-once-table` on the emulators: the consumer creates the table, and each
//! window's counts commit with its checkpoint. Records flow throughout while the first
//! consumer is SIGKILLed mid-window and a second takes its leases over (after the failover
//! time), then is stopped with SIGTERM (its open windows emitted early and committed): the
//! table counts every record exactly once, while the window lines on stdout, printed before
//! each commit, may count some twice (reported).
//!
//! And against an operator's mistakes: a worker of the application without the flag (its
//! records' windows missing, reported by the next worker with it), a second application on
//! the same table (refused, and writing nothing even once the table's application item is
//! deleted), a table of another key (refused at start, naming the attribute), a missing table
//! (named at start) and one deleted while running (the shard's checkpoint stays, and every
//! record after it is counted once the table is back); a lease reset backwards while the
//! consumer runs (the records up to the table's position skipped, none counted twice), and
//! a shard left ahead by a worker without the flag (a problem on `/status`).

#![allow(clippy::print_stderr)]

mod common;
#[path = "exactly_once_table/mistakes.rs"]
mod mistakes;
#[path = "exactly_once_table/procs.rs"]
mod procs;
#[path = "exactly_once_table/reset.rs"]
mod reset;

use std::time::Duration;

use anyhow::{Context as _, ensure};
use kcl_example_consumer::table::dynamodb;
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};

use common::consumer::Consumer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_counts_land_in_the_table_exactly_once_across_a_kill() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("exactly-once-table").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(run(ctx))).await
}

/// The records the table counts, in all.
async fn counted(ctx: &Context, table: &str) -> anyhow::Result<u64> {
    Ok(dynamodb::read_counts(&ctx.dynamodb, table)
        .await
        .map_or(0, |counts| counts.values().sum()))
}

/// The records the window lines of `id` count, in all (a line torn by the SIGKILL left out).
fn printed(ctx: &Context, id: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(ctx.path(&format!("{id}.windows.jsonl")))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|window| window["records"].as_u64())
        .sum())
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let table = format!("{}-windows", ctx.table);
    let args = ["--stream", &ctx.stream, "--exactly-once-table", &table];
    let producer = Producer::start(&ctx, "eo-", 5, Duration::from_millis(200));
    let first = Consumer::spawn_with(&ctx, "eo-a", &args)?;
    wait_until(
        "the first consumer to commit windows",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(counted(&ctx, &table).await? >= 20),
    )
    .await
    .with_context(|| first.log_tail())?;
    // Mid-window: what it counted since its last commit is counted again by the next owner.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(first);
    let mut second = Consumer::spawn_with(&ctx, "eo-b", &args)?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let produced = u64::try_from(producer.stop().await?.len())?;
    wait_until(
        "every record counted in the table",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(counted(&ctx, &table).await? >= produced),
    )
    .await
    .with_context(|| second.log_tail())?;
    second.stop().await?;
    let in_table = counted(&ctx, &table).await?;
    let on_stdout = printed(&ctx, "eo-a")? + printed(&ctx, "eo-b")?;
    eprintln!(
        "exactly-once table: {produced} records produced, {in_table} counted in the table, \
         {on_stdout} in the window lines on stdout"
    );
    ensure!(
        in_table == produced,
        "the table counts {in_table} records of {produced}"
    );
    ensure!(
        on_stdout >= produced,
        "the lines count {on_stdout} of {produced}"
    );
    Ok(())
}
