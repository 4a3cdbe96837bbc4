//! The Postgres rows called directly, against the real server: the tables made by workers
//! starting at once, a table without its key refused, the claim (another application's
//! refused), a window's upsert adding up, a position's upsert refused to another application
//! by the database (NOT NULL), and each way a mismatch is recorded in a position row.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use chrono::{DateTime, Utc};
use kcl_core::{Checkpoint, FencingToken, ShardId};
use kcl_example_consumer::WindowSummary;
use kcl_example_consumer::table::postgres::{self, PostgresItems};
use kcl_example_consumer::table::step::{Found, Mismatch, Step};
use kcl_example_consumer::table::{Items, TableError, claim::claim};
use kcl_integration_tests::leases::postgres_url;
use kcl_postgres::PostgresLeaseStore;
use tokio_postgres::error::SqlState;

use crate::world;

type Rows = PostgresItems<PostgresLeaseStore>;

fn at(ms: i64) -> anyhow::Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms).context("a time")
}

fn checkpoint(sequence: &str) -> anyhow::Result<Checkpoint> {
    Checkpoint::parse(sequence, 0).context("a checkpoint")
}

/// A position row's checkpoint and what it recorded: (checkpoint, gaps, replays).
async fn row(
    pg: &tokio_postgres::Client,
    table: &str,
    shard: &str,
) -> anyhow::Result<(Option<String>, i64, i64)> {
    let statement =
        format!("SELECT checkpoint, gaps, replays FROM {table}_positions WHERE shard = $1");
    let row = pg.query_one(&statement, &[&shard]).await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

fn mismatch(shard: &str, lease: &Checkpoint, table: Option<&Checkpoint>, step: Step) -> Mismatch {
    Mismatch {
        shard: ShardId::new(shard),
        lease: lease.clone(),
        table: table.cloned(),
        step,
        found: Found::Open,
        at: Utc::now(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_are_written_as_the_table_and_its_checks_need() -> anyhow::Result<()> {
    let Some(url) = postgres_url()? else {
        return Ok(());
    };
    let name = kcl_integration_tests::unique("rows");
    let table = format!("w_{}", name.replace('-', "_"));
    let pool = postgres::pool(&url)?;
    let pg = world::client(&url).await?;
    // Missing, and not to be made.
    let missing = postgres::ensure_tables(&pool, &table, false).await;
    ensure!(
        matches!(missing, Err(TableError::Missing { .. })),
        "{missing:?}"
    );
    // Four workers starting at once: one makes the tables, none fails.
    let starts = (0..4).map(|_| postgres::ensure_tables(&pool, &table, true));
    for started in futures_util::future::join_all(starts).await {
        started?;
    }
    let ours: Rows = PostgresItems::new(pool.clone(), &table, &name, "w1");
    let store = PostgresLeaseStore::builder(&url, &name).build()?;
    claim(&ours, &store).await?;
    let theirs: Rows = PostgresItems::new(pool.clone(), &table, "another-app", "w2");
    let refused = claim(&theirs, &store).await;
    ensure!(
        matches!(&refused, Err(TableError::OtherApplication { theirs, .. }) if *theirs == name),
        "{refused:?}"
    );
    windows_add_up(&pg, &ours, &table).await?;
    positions_of_one_application(&pg, &ours).await?;
    mismatches_are_recorded(&pg, &ours, &table).await?;
    // Without its key, a table is refused.
    let keyless = format!("{table}_k");
    pg.batch_execute(
        &postgres::schema_sql(&keyless)
            .replace("PRIMARY KEY (shard, window_start)", "UNIQUE (shard)"),
    )
    .await?;
    let found = postgres::ensure_tables(&pool, &keyless, false).await;
    ensure!(matches!(found, Err(TableError::NoKey { .. })), "{found:?}");
    // The positions table dropped while running: a read of it, and the diagnosis, say so.
    pg.batch_execute(&format!("DROP TABLE {table}_positions"))
        .await?;
    let shard = ShardId::new("shardId-000000000001");
    let read = ours.read_positions(std::slice::from_ref(&shard)).await;
    ensure!(matches!(read, Err(TableError::Gone { .. })), "{read:?}");
    let gone = ours.diagnose(&shard).await;
    let positions = format!("{table}_positions");
    ensure!(
        matches!(&gone, Some(TableError::Gone { table, .. }) if *table == positions),
        "{gone:?}"
    );
    Ok(())
}

/// A window written in two parts adds up: records, bytes and commits.
async fn windows_add_up(
    pg: &tokio_postgres::Client,
    items: &Rows,
    table: &str,
) -> anyhow::Result<()> {
    let summary = WindowSummary {
        shard: "shardId-000000000000".to_owned(),
        window_start: at(1_000)?,
        window_end: at(2_000)?,
        complete: false,
        records: 3,
        bytes: 30,
        distinct_keys: 1,
        top_keys: Vec::new(),
    };
    let write = items.window(&summary);
    ensure!(write.param_count() == 5, "{write:?}");
    for records in [3_i64, 4] {
        let values: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &summary.shard,
            &summary.window_start,
            &summary.window_end,
            &records,
            &(records * 10),
        ];
        pg.execute(write.statement(), &values).await?;
    }
    let counts = world::counts(pg, table).await;
    let expected = BTreeMap::from([((summary.shard.clone(), 1_000), 7)]);
    ensure!(counts == expected, "{counts:?}");
    ensure!(
        world::in_parts(pg, table).await? == 1,
        "commits not counted"
    );
    Ok(())
}

/// A position's upsert moves the row of its application, and is refused by the database for
/// another application's row (NOT NULL: a constraint, so the commit fails its record).
async fn positions_of_one_application(
    pg: &tokio_postgres::Client,
    items: &Rows,
) -> anyhow::Result<()> {
    let shard = ShardId::new("shardId-000000000000");
    let at = checkpoint("49590338271490256608559692538361571095921575989136588802")?;
    let write = items.position(&shard, &at, FencingToken(7));
    ensure!(write.param_count() == 5, "{write:?}");
    let upsert = async |application: &str| {
        let values: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&shard.as_str(), &application, &at.as_str(), &0_i64, &7_i64];
        pg.execute(write.statement(), &values).await
    };
    upsert(items.application()).await?;
    let refused = upsert("another-app").await;
    let code = refused.as_ref().err().and_then(tokio_postgres::Error::code);
    ensure!(code == Some(&SqlState::NOT_NULL_VIOLATION), "{refused:?}");
    let read = items.read_positions(std::slice::from_ref(&shard)).await?;
    let position = read.get(&shard).context("no position read")?;
    ensure!(position.checkpoint == at, "{position:?}");
    ensure!(
        position.application.as_deref() == Some(items.application()),
        "{position:?}"
    );
    Ok(())
}

/// Each mismatch recorded in the row if it still holds what was found: a lease ahead moves
/// the position (a gap), one behind leaves it (a replay).
async fn mismatches_are_recorded(
    pg: &tokio_postgres::Client,
    items: &Rows,
    table: &str,
) -> anyhow::Result<()> {
    let shard = "shardId-000000000001";
    let (first, later) = (checkpoint("100")?, checkpoint("200")?);
    // No row: made at the lease's checkpoint; found again as none, left alone.
    ensure!(
        items
            .realign(&mismatch(shard, &first, None, Step::Missing))
            .await?
    );
    ensure!(
        !items
            .realign(&mismatch(shard, &later, None, Step::Missing))
            .await?
    );
    ensure!(row(pg, table, shard).await? == (Some("100".into()), 1, 0));
    // Ahead of what the row holds: moved; with a stale position found, left alone.
    ensure!(
        items
            .realign(&mismatch(shard, &later, Some(&first), Step::Missing))
            .await?
    );
    ensure!(
        !items
            .realign(&mismatch(shard, &later, Some(&first), Step::Missing))
            .await?
    );
    ensure!(row(pg, table, shard).await? == (Some("200".into()), 2, 0));
    // Behind it: counted, the position kept.
    ensure!(
        items
            .realign(&mismatch(shard, &first, Some(&later), Step::Behind))
            .await?
    );
    ensure!(row(pg, table, shard).await? == (Some("200".into()), 2, 1));
    Ok(())
}
