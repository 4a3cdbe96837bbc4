//! A lease moved back behind the table while the consumer runs, and a shard left ahead of it
//! by a worker without the flag that keeps running: what the table and `/status` show.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use kcl_core::admin::{ResetTo, reset};
use kcl_core::{Checkpoint, ShardId};
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};

use crate::mistakes::{metric, world};
use crate::procs::{Proc, checkpointed_without_the_flag, checkpoints, counted, position};

const POLL: Duration = Duration::from_millis(250);
const LONG: Duration = Duration::from_secs(60);

/// `kcl-admin reset --to TRIM_HORIZON` (its library call, the same write) while the consumer
/// runs with the flag and records keep coming: the consumer loses the lease, takes it again
/// after the failover time from `TRIM_HORIZON`, finds it behind the table's position, and
/// skips the records up to it (one WARN saying how many, counted on `/metrics`, recorded in
/// the position item). The table ends counting every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_backwards_counts_nothing_twice() -> anyhow::Result<()> {
    let Some((ctx, table)) = world("eo-reset", 1).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(reset_back(ctx, table))).await
}

async fn reset_back(ctx: Context, table: String) -> anyhow::Result<()> {
    let (app, flag) = (ctx.table.clone(), ["--exactly-once-table", table.as_str()]);
    let producer = Producer::start(&ctx, "reset-", 5, Duration::from_millis(200));
    let mut proc = Proc::spawn_for(&ctx, "resets", &app, &flag)?;
    wait_until("windows committed", LONG, POLL, async || {
        Ok(counted(&ctx, &table).await >= 20)
    })
    .await
    .with_context(|| proc.log_tail())?;
    let shard = ShardId::new("shardId-000000000000");
    let store = kcl_aws::DynamoDbLeaseStore::from_client(ctx.dynamodb.clone(), &app);
    let back = ResetTo {
        checkpoint: Checkpoint::TrimHorizon,
        pin: None,
    };
    let done = reset(&store, &shard, &back).await?;
    let words = ["skipped rather than counted twice", shard.as_str(), &table];
    wait_until("the skip said at WARN", LONG, POLL, async || {
        Ok(proc
            .log()
            .iter()
            .any(|l| l.contains("\"WARN\"") && words.iter().all(|w| l.contains(w))))
    })
    .await
    .with_context(|| proc.log_tail())?;
    let produced = u64::try_from(producer.stop().await?.len())?;
    wait_until("every record counted", LONG, POLL, async || {
        Ok(counted(&ctx, &table).await >= produced)
    })
    .await
    .with_context(|| proc.log_tail())?;
    // The last windows close on time; wait for any late commit before comparing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let skipped = metric(
        &proc,
        "kcl_example_exactly_once_records_already_counted_total",
    );
    let behind = metric(
        &proc,
        "kcl_example_exactly_once_out_of_step_total{kind=\"behind\"}",
    );
    proc.stop().await?;
    let in_table = counted(&ctx, &table).await;
    let item = position(&ctx, &table, &shard).await?.unwrap_or_default();
    let lease = checkpoints(&ctx, &app).await?.remove(&shard);
    eprintln!(
        "reset backwards from {}: {produced} records produced, {in_table} counted in the \
         table, {skipped:?} skipped as counted already; position {:?} (replays {}), lease \
         {lease:?}",
        done.before.checkpoint, item.checkpoint, item.replays
    );
    ensure!(
        in_table == produced,
        "the table counts {in_table} of {produced}"
    );
    ensure!(skipped.is_some_and(|n| n > 0.0), "skipped: {skipped:?}");
    ensure!(behind == Some(1.0), "out of step behind: {behind:?}");
    ensure!(item.replays == 1, "replays recorded: {item:?}");
    ensure!(
        item.checkpoint == lease,
        "in step at the end: {item:?} {lease:?}"
    );
    Ok(())
}

/// A worker of the application without the flag keeps running beside one with it: the
/// shards it checkpoints are ahead of the table, and the worker with the flag lists them as
/// problems on `/status` (`outputs_out_of_step`, naming the shard and what to do) while it
/// stays ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_ahead_is_a_problem_on_status() -> anyhow::Result<()> {
    let Some((ctx, table)) = world("eo-status", 2).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(status(ctx, table))).await
}

async fn status(ctx: Context, table: String) -> anyhow::Result<()> {
    let (app, flag) = (ctx.table.clone(), ["--exactly-once-table", table.as_str()]);
    let (producer, mut without) = checkpointed_without_the_flag(&ctx, &table, "status").await?;
    // The worker without the flag keeps its shards: the next one with it finds them ahead.
    let next = Proc::spawn_for(&ctx, "status-c", &app, &flag)?;
    let mut listed = Vec::new();
    wait_until("a shard ahead listed on /status", LONG, POLL, async || {
        let Some((200, body)) = next.get("/status") else {
            return Ok(false);
        };
        let status: serde_json::Value = serde_json::from_str(&body)?;
        listed = status["problems"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["kind"] == "outputs_out_of_step")
            .collect();
        Ok(!listed.is_empty() && status["ready"] == true)
    })
    .await
    .with_context(|| next.log_tail())?;
    let detail = listed[0]["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains("ahead") && detail.contains("Run every worker with the flag"),
        "{listed:?}"
    );
    let (code, body) = next.get("/readyz").context("GET /readyz")?;
    ensure!(code == 200, "a problem on /status leaves it ready: {body}");
    producer.stop().await?;
    without.stop().await?;
    eprintln!("/status problems: {listed:?}");
    Ok(())
}
