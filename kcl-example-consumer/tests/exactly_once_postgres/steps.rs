//! A mixed fleet on Postgres: a worker of the application without `--exactly-once-table`
//! checkpoints the lease row past the table's position; the next worker with the flag finds
//! the shard ahead when it opens it, says so at ERROR (shard, table, both positions), and
//! records the gap in the shard's position row, which moves to the lease's checkpoint.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use kcl_integration_tests::leases::postgres_url;
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};

use crate::common::consumer::Consumer;
use crate::world;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_flag_is_found_out_and_the_gap_recorded() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("eo-pg-mixed").await? else {
        return Ok(());
    };
    let url = postgres_url()?.context("KCL_POSTGRES_URL")?;
    with_timeout(Duration::from_secs(150), Box::pin(mixed(ctx, url))).await
}

async fn mixed(ctx: Context, url: String) -> anyhow::Result<()> {
    let (poll, long) = (Duration::from_millis(250), Duration::from_secs(60));
    let table = world::table_name(&ctx);
    let pg = world::client(&url).await?;
    ctx.create_stream(1).await?;
    let producer = Producer::start(&ctx, "mixed-", 5, Duration::from_millis(200));
    let leases = ["--stream", &ctx.stream, "--lease-store", &url];
    let flagged = [&leases[..], &["--exactly-once-table", &table]].concat();
    let mut with = Consumer::spawn_with(&ctx, "mixed-a", &flagged)?;
    wait_until("windows committed", long, poll, async || {
        Ok(world::counted(&pg, &table).await >= 10)
    })
    .await
    .with_context(|| with.log_tail())?;
    with.stop().await?;
    let committed = world::positions(&pg, &table).await?;
    ensure!(
        committed == world::lease_checkpoints(&ctx).await?,
        "{committed:?}"
    );
    let mut without = Consumer::spawn_with(&ctx, "mixed-b", &leases)?;
    wait_until(
        "the lease checkpointed without the flag",
        long,
        poll,
        async || Ok(world::lease_checkpoints(&ctx).await? != committed),
    )
    .await
    .with_context(|| without.log_tail())?;
    without.stop().await?;
    let ahead = world::lease_checkpoints(&ctx).await?;
    let mut next = Consumer::spawn_with(&ctx, "mixed-c", &flagged)?;
    wait_until(
        "the gap recorded in the position row",
        long,
        poll,
        async || Ok(world::positions(&pg, &table).await? == ahead),
    )
    .await
    .with_context(|| next.log_tail())?;
    let (shard, (checkpoint, _)) = ahead.iter().next().context("no lease")?;
    let found = next.errors_with(&["out of step", shard, checkpoint, &table]);
    ensure!(
        found.len() == 1,
        "ERROR lines: {found:?}\n{}",
        next.log_tail()
    );
    let statement = format!("SELECT gaps, last_gap FROM {table}_positions WHERE shard = $1");
    let row = pg.query_one(&statement, &[shard]).await?;
    let (gaps, last): (i64, Option<String>) = (row.get(0), row.get(1));
    ensure!(gaps == 1, "gaps {gaps}");
    ensure!(
        last.is_some_and(|l| l.contains("found by mixed-c")),
        "last_gap"
    );
    producer.stop().await?;
    next.stop().await?;
    Ok(())
}
