//! What the Postgres exactly-once tests read: the window table and its positions, the sink's
//! `kcl_positions` rows, and the stream itself (every record with its arrival time, so that
//! each window's count is known exactly).

use std::collections::BTreeMap;

use anyhow::Context as _;
use kcl_example_consumer::table::postgres;
use kcl_integration_tests::Context;

/// The window length the tests' consumers run with (`--window 1s`), in milliseconds.
const WINDOW_MS: i64 = 1000;

/// A window: its shard and its start in epoch milliseconds.
pub(crate) type Window = (String, i64);

/// A plain client of the test server (trust authentication on 127.0.0.1).
pub(crate) async fn client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to KCL_POSTGRES_URL")?;
    tokio::spawn(connection);
    Ok(client)
}

/// A window table's name for this test: its unique name as a plain SQL identifier.
pub(crate) fn table_name(ctx: &Context) -> String {
    format!("w_{}", ctx.table.replace(['-', '.'], "_")).to_lowercase()
}

/// The table's counts by window (empty while the table does not exist yet).
pub(crate) async fn counts(pg: &tokio_postgres::Client, table: &str) -> BTreeMap<Window, u64> {
    postgres::read_counts(pg, table)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|((shard, start), n)| ((shard, start.timestamp_millis()), n))
        .collect()
}

/// The records the table counts, in all.
pub(crate) async fn counted(pg: &tokio_postgres::Client, table: &str) -> u64 {
    counts(pg, table).await.values().sum()
}

/// Window rows built by more than one commit (a window emitted in parts, added up).
pub(crate) async fn in_parts(pg: &tokio_postgres::Client, table: &str) -> anyhow::Result<i64> {
    let statement = format!("SELECT count(*) FROM {table} WHERE commits > 1");
    Ok(pg.query_one(&statement, &[]).await?.get(0))
}

/// Every record of the test's stream, counted by the window its arrival time falls in, as
/// the consumer counts them (a record whose arrival steps back counts in the window open).
pub(crate) async fn produced(ctx: &Context) -> anyhow::Result<BTreeMap<Window, u64>> {
    let shards = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut out = BTreeMap::new();
    for shard in shards.shards() {
        let id = shard.shard_id().to_owned();
        let mut open = i64::MIN;
        for at in arrivals(ctx, &id).await? {
            open = open.max(at - at.rem_euclid(WINDOW_MS));
            *out.entry((id.clone(), open)).or_default() += 1;
        }
    }
    Ok(out)
}

/// The arrival times (epoch ms) of every record of `shard`, in order.
async fn arrivals(ctx: &Context, shard: &str) -> anyhow::Result<Vec<i64>> {
    let mut iterator = ctx
        .kinesis
        .get_shard_iterator()
        .stream_name(&ctx.stream)
        .shard_id(shard)
        .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
        .send()
        .await?
        .shard_iterator
        .context("no iterator")?;
    let mut out = Vec::new();
    loop {
        let page = ctx
            .kinesis
            .get_records()
            .shard_iterator(&iterator)
            .limit(1000)
            .send()
            .await?;
        for record in page.records() {
            let at = record
                .approximate_arrival_timestamp()
                .context("a record without its arrival time")?;
            out.push(at.to_millis()?);
        }
        match page.next_shard_iterator {
            Some(next) if !page.records.is_empty() || page.millis_behind_latest > Some(0) => {
                iterator = next;
            }
            _ => return Ok(out),
        }
    }
}

/// The windows whose counts differ: `(window, produced, counted)`.
pub(crate) fn differences(
    produced: &BTreeMap<Window, u64>,
    counted: &BTreeMap<Window, u64>,
) -> Vec<(Window, u64, u64)> {
    let mut keys: Vec<&Window> = produced.keys().chain(counted.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|w| {
            let n = |m: &BTreeMap<Window, u64>| m.get(w).copied().unwrap_or(0);
            (w.clone(), n(produced), n(counted))
        })
        .filter(|(_, p, c)| p != c)
        .collect()
}

/// A checkpoint as the tables hold it: its text and sub-sequence number.
pub(crate) type Position = (String, i64);

/// The shards' positions in the table's positions table.
pub(crate) async fn positions(
    pg: &tokio_postgres::Client,
    table: &str,
) -> anyhow::Result<BTreeMap<String, Position>> {
    let statement = format!(
        "SELECT shard, checkpoint, sub_sequence FROM {} WHERE shard NOT LIKE '#%'",
        postgres::positions_table(table)
    );
    read_positions(pg, &statement, &[]).await
}

/// The sink's positions (`kcl_positions`) of `application`.
pub(crate) async fn sink_positions(
    pg: &tokio_postgres::Client,
    application: &str,
) -> anyhow::Result<BTreeMap<String, Position>> {
    let statement = "SELECT lease_key, checkpoint, checkpoint_sub FROM kcl_positions \
                     WHERE application = $1";
    read_positions(pg, statement, &[&application]).await
}

async fn read_positions(
    pg: &tokio_postgres::Client,
    statement: &str,
    values: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> anyhow::Result<BTreeMap<String, Position>> {
    Ok(pg
        .query(statement, values)
        .await?
        .into_iter()
        .map(|row| {
            let checkpoint: Option<String> = row.get(1);
            (row.get(0), (checkpoint.unwrap_or_default(), row.get(2)))
        })
        .collect())
}

/// Every shard lease's checkpoint, from the store the test's workers use.
pub(crate) async fn lease_checkpoints(ctx: &Context) -> anyhow::Result<BTreeMap<String, Position>> {
    Ok(ctx
        .list()
        .await?
        .into_iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .map(|l| {
            let sub = i64::try_from(l.checkpoint.sub_sequence()).unwrap_or(i64::MAX);
            (
                l.key.as_str().to_owned(),
                (l.checkpoint.as_str().to_owned(), sub),
            )
        })
        .collect())
}
