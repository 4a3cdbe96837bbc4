//! An operator's mistakes with `--exactly-once-table`, each against real consumer processes.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType};
use kcl_core::{Checkpoint, SequenceNumber, ShardId};
use kcl_example_consumer::table::dynamodb::{APPLICATION, SHARD, WINDOW_START};
use kcl_integration_tests::{Context, Producer, wait_until, with_timeout};

use crate::procs::{
    Proc, by_shard, checkpointed_without_the_flag, checkpoints, counted, create_table, position,
};

const POLL: Duration = Duration::from_millis(250);

/// A test's world, or `None` without the emulators.
pub(crate) async fn world(name: &str, shards: i32) -> anyhow::Result<Option<(Context, String)>> {
    let Some(ctx) = Context::new(name).await? else {
        return Ok(None);
    };
    ctx.create_stream(shards).await?;
    let table = format!("{}-windows", ctx.table);
    Ok(Some((ctx, table)))
}

/// The value of the series `name` (labels included) on `/metrics`.
pub(crate) fn metric(proc: &Proc, name: &str) -> Option<f64> {
    let (_, body) = proc.get("/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// One worker with the flag, then one without it (its checkpoints move past the table's
/// positions), then one with it again: at start it reports each shard the worker without the
/// flag moved (ERROR naming the shard, both positions and the table), counts them, lists them
/// on `/exactly-once`, and on opening each shard records the gap in its position item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_flag_is_reported_by_the_next_one_with_it() -> anyhow::Result<()> {
    let Some((ctx, table)) = world("eo-mixed-fleet", 2).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(mixed_fleet(ctx, table))).await
}

async fn mixed_fleet(ctx: Context, table: String) -> anyhow::Result<()> {
    let (app, flag) = (ctx.table.clone(), ["--exactly-once-table", table.as_str()]);
    let long = Duration::from_secs(60);
    let (producer, mut without) = checkpointed_without_the_flag(&ctx, &table, "mixed").await?;
    without.stop().await?;
    let leases = checkpoints(&ctx, &app).await?;
    let mut positions = BTreeMap::new();
    for shard in leases.keys() {
        let item = position(&ctx, &table, shard).await?.unwrap_or_default();
        positions.insert(shard.clone(), item.checkpoint.context("a position")?);
    }
    let next = Proc::spawn_for(&ctx, "mixed-c", &app, &flag)?;
    for (shard, lease) in &leases {
        let (lease, at) = (lease.to_string(), positions[shard].to_string());
        let words = [shard.as_str(), &lease, &at, &table, "out of step"];
        wait_until("the shard reported", long, POLL, async || {
            Ok(!next.errors_with(&words).is_empty())
        })
        .await
        .with_context(|| next.log_tail())?;
    }
    let missing = "kcl_example_exactly_once_out_of_step_total{kind=\"missing\"}";
    let ahead = "kcl_example_exactly_once_shards_ahead";
    wait_until("the counter at 2", long, POLL, async || {
        Ok(metric(&next, missing) == Some(2.0))
    })
    .await
    .with_context(|| format!("{:?} {:?}", metric(&next, missing), metric(&next, ahead)))?;
    let (code, body) = next.get("/exactly-once").context("GET /exactly-once")?;
    let listed: serde_json::Value = serde_json::from_str(&body)?;
    let found = listed["out_of_step"].as_array().map_or(0, Vec::len);
    ensure!(code == 200 && found == 2, "/exactly-once: {body}");
    // Each shard, opened, records the gap in its position item and goes on in step.
    for (shard, lease) in &leases {
        wait_until("the gap recorded", long, POLL, async || {
            let item = position(&ctx, &table, shard).await?.unwrap_or_default();
            Ok(item.gaps == 1
                && item
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| at_or_after(c, lease)))
        })
        .await
        .with_context(|| next.log_tail())?;
    }
    // No shard ahead any more: the gauge an alert would watch is back at 0.
    wait_until("the gauge at 0", long, POLL, async || {
        Ok(metric(&next, ahead) == Some(0.0))
    })
    .await
    .with_context(|| format!("{:?}", metric(&next, ahead)))?;
    producer.stop().await?;
    eprintln!("mixed fleet: {body}");
    Ok(())
}

/// Whether `a` is `b` or further on.
fn at_or_after(a: &Checkpoint, b: &Checkpoint) -> bool {
    match (a, b) {
        (Checkpoint::Sequence(a), Checkpoint::Sequence(b)) => a >= b,
        (Checkpoint::ShardEnd, _) => true,
        _ => a == b,
    }
}

/// A second application pointed at a table the first one writes: refused at start, naming
/// both applications and the table. With the table's application item deleted by hand, the
/// second one claims the table, and still adds nothing to the first one's windows: its shard's
/// position item names the first application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_application_is_refused_the_table() -> anyhow::Result<()> {
    let Some((ctx, table)) = world("eo-two-apps", 1).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(two_apps(ctx, table))).await
}

async fn two_apps(ctx: Context, table: String) -> anyhow::Result<()> {
    let (first, second) = (ctx.table.clone(), format!("{}-other", ctx.table));
    let flag = ["--exactly-once-table", table.as_str()];
    let producer = Producer::start(&ctx, "two-", 5, Duration::from_millis(200));
    let mut one = Proc::spawn_for(&ctx, "first", &first, &flag)?;
    wait_until(
        "windows committed",
        Duration::from_secs(60),
        POLL,
        async || Ok(counted(&ctx, &table).await >= 10),
    )
    .await
    .with_context(|| one.log_tail())?;
    one.stop().await?;
    let before = counted(&ctx, &table).await;
    let mut two = Proc::spawn_for(&ctx, "second", &second, &flag)?;
    let status = two.wait_exit(Duration::from_secs(30)).await?;
    let words = [table.as_str(), &first, &second, "belongs to application"];
    ensure!(
        !status.success() && !two.errors_with(&words).is_empty(),
        "refused at start, naming both: {status}\n{}",
        two.log_tail()
    );
    // The application item deleted by hand: the second application claims the table.
    ctx.dynamodb
        .delete_item()
        .table_name(&table)
        .key(SHARD, AttributeValue::S(APPLICATION.to_owned()))
        .key(WINDOW_START, AttributeValue::S(APPLICATION.to_owned()))
        .send()
        .await?;
    let two = Proc::spawn_for(&ctx, "second-again", &second, &flag)?;
    let words = [table.as_str(), &first, &second, "shardId-000000000000"];
    wait_until(
        "the shard refused",
        Duration::from_secs(60),
        POLL,
        async || {
            Ok(two
                .log()
                .iter()
                .any(|l| words.iter().all(|w| l.contains(w))))
        },
    )
    .await
    .with_context(|| two.log_tail())?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = counted(&ctx, &table).await;
    ensure!(
        after == before,
        "the second application added {} records",
        after - before
    );
    producer.stop().await?;
    Ok(())
}

/// A table whose key has another type, or other names: refused at start, naming the table,
/// the attribute, and what was expected and found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_another_key_is_refused_at_start() -> anyhow::Result<()> {
    let Some((ctx, _)) = world("eo-key", 1).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(other_keys(ctx))).await
}

async fn other_keys(ctx: Context) -> anyhow::Result<()> {
    use ScalarAttributeType::{N, S};
    let numbers = format!("{}-numbers", ctx.table);
    create_table(&ctx, &numbers, ("shard", S), ("window_start", N)).await?;
    let names = format!("{}-names", ctx.table);
    create_table(&ctx, &names, ("pk", S), ("sk", S)).await?;
    let cases = [
        (&numbers, vec!["`window_start` is of type N, expected S"]),
        (&names, vec!["partition key is `pk`, expected `shard`"]),
    ];
    for (table, words) in cases {
        let mut proc = Proc::spawn_for(&ctx, table, &ctx.table, &["--exactly-once-table", table])?;
        let status = proc.wait_exit(Duration::from_secs(30)).await?;
        let words: Vec<&str> = words.into_iter().chain([table.as_str()]).collect();
        ensure!(
            !status.success() && !proc.errors_with(&words).is_empty(),
            "{table} refused at start: {status}\n{}",
            proc.log_tail()
        );
    }
    Ok(())
}

/// A missing table is named at start under `--table-setup external`. One deleted while the
/// consumer runs: each commit fails naming it, the shards' checkpoints stay where the last
/// commit put them while records keep coming, and once the table is back every record after
/// those checkpoints is counted in it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_table_loses_no_window() -> anyhow::Result<()> {
    let Some((ctx, table)) = world("eo-deleted", 2).await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(deleted(ctx, table))).await
}

async fn deleted(ctx: Context, table: String) -> anyhow::Result<()> {
    let (app, flag) = (ctx.table.clone(), ["--exactly-once-table", table.as_str()]);
    let external = [flag[0], flag[1], "--table-setup", "external"];
    let mut proc = Proc::spawn_for(&ctx, "external", &app, &external)?;
    let status = proc.wait_exit(Duration::from_secs(30)).await?;
    let words = [table.as_str(), "does not exist", "--table-setup managed"];
    ensure!(
        !status.success() && !proc.errors_with(&words).is_empty(),
        "missing at start: {status}\n{}",
        proc.log_tail()
    );
    let producer = Producer::start(&ctx, "deleted-", 5, Duration::from_millis(200));
    let mut proc = Proc::spawn_for(&ctx, "managed", &app, &flag)?;
    let long = Duration::from_secs(60);
    wait_until("windows committed", long, POLL, async || {
        Ok(counted(&ctx, &table).await >= 10)
    })
    .await
    .with_context(|| proc.log_tail())?;
    ctx.dynamodb
        .delete_table()
        .table_name(&table)
        .send()
        .await?;
    let words = [
        table.as_str(),
        "does not exist (deleted while running?), found committing windows of shard",
    ];
    wait_until(
        "the commit failing, naming the table",
        long,
        POLL,
        async || {
            Ok(proc
                .log()
                .iter()
                .any(|l| words.iter().all(|w| l.contains(w))))
        },
    )
    .await
    .with_context(|| proc.log_tail())?;
    let frozen = checkpoints(&ctx, &app).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = checkpoints(&ctx, &app).await?;
    ensure!(
        later == frozen,
        "checkpoints moved without the table: {frozen:?} -> {later:?}"
    );
    create_table(
        &ctx,
        &table,
        ("shard", ScalarAttributeType::S),
        ("window_start", ScalarAttributeType::S),
    )
    .await?;
    producer.stop().await?;
    let mut expected = BTreeMap::new();
    for (shard, at) in &frozen {
        let n = after(&ctx, shard, at).await?;
        if n > 0 {
            expected.insert(shard.as_str().to_owned(), n);
        }
    }
    wait_until(
        "every record after the checkpoints counted",
        long,
        POLL,
        async || Ok(by_shard(&ctx, &table).await == expected),
    )
    .await
    .with_context(|| format!("expected {expected:?}\n{}", proc.log_tail()))?;
    proc.stop().await?;
    let counted = by_shard(&ctx, &table).await;
    let held: Vec<String> = frozen.iter().map(|(s, c)| format!("{s} at {c}")).collect();
    eprintln!("deleted table: checkpoints held ({held:?}); counted after them: {counted:?}");
    ensure!(counted == expected, "{counted:?} against {expected:?}");
    Ok(())
}

/// How many records of `shard` come after `at`.
async fn after(ctx: &Context, shard: &ShardId, at: &Checkpoint) -> anyhow::Result<u64> {
    let records = ctx.read_shard(shard.as_str()).await?;
    let later = |seq: &str| match (at, SequenceNumber::parse(seq)) {
        (Checkpoint::Sequence(at), Some(seq)) => seq > at.sequence,
        (_, seq) => seq.is_some(),
    };
    Ok(records.iter().filter(|(seq, _)| later(seq)).count() as u64)
}
