//! One leader always, with real worker processes on the emulators, whatever an operator does
//! to the role rows by hand: three test workers (`--http`, failover time 3 s, taker interval
//! 500 ms) under a leader; the leader and standby rows are deleted with a plain DynamoDB
//! `DeleteItem` (what `remove-kcl-rows` did to a live fleet before issue 50), and a minute
//! later the leader row is deleted and put back unowned. Each worker's `/status` `leading` is
//! read every 200 ms for a minute after each: two workers lead at once for at most the
//! failover time, exactly one leads within the failover time of each change and at the end,
//! and the fleet is never without a leader for longer than three failover times and four
//! taker intervals (docs/guarantees.md). Records flow throughout, and every one written is
//! delivered. With the leases in DynamoDB, then in Postgres (the rows deleted and put back
//! with plain SQL, as an operator would in `psql`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use kcl_integration_tests::http::http_get;
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, Leases, Producer, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const IDS: [&str; 3] = ["w1", "w2", "w3"];
const FAILOVER: Duration = Duration::from_secs(3);
const TAKER: Duration = Duration::from_millis(500);
const LEADER: &str = "kcl-coordination/worker-leader";
const STANDBY: &str = "kcl-coordination/worker-standby";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_leads_after_the_role_rows_are_deleted_by_hand() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("leader-rows").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(300), Box::pin(run(ctx))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_leads_after_the_role_rows_are_deleted_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("leader-rows-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(300), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let flags = ["--http", "--failover-ms", "3000", "--taker-ms", "500"];
    let mut fleet = Vec::new();
    for id in IDS {
        let process = WorkerProcess::spawn_in("leader", WORKER, &ctx, id, &flags)?;
        let http = serving(&process).await?;
        fleet.push((process, http));
    }
    let producer = Producer::start(&ctx, "lr", 2, Duration::from_millis(200));
    wait_until(
        "every shard held, one worker leading",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            let held = owners.len() == 4 && owners.values().all(Option::is_some);
            Ok(held && leading(&fleet).len() == 1)
        },
    )
    .await?;
    eprintln!("leading: {:?}", leading(&fleet));

    delete(&ctx, LEADER).await?;
    delete(&ctx, STANDBY).await?;
    judge("both role rows deleted", &fleet).await?;

    delete(&ctx, LEADER).await?;
    put_unowned(&ctx, LEADER).await?;
    judge("the leader row deleted and put back unowned", &fleet).await?;

    let written = producer.stop().await?;
    wait_until(
        "every record written delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let journals = (fleet.iter())
                .map(|(p, _)| p.events())
                .collect::<anyhow::Result<Vec<_>>>()?;
            let got = delivered_set(journals.iter().map(Vec::as_slice));
            Ok(written.iter().all(|d| got.contains(d)))
        },
    )
    .await?;
    for (p, _) in &fleet {
        p.terminate()?;
    }
    Ok(())
}

/// Reads `leading` from every worker's `/status` every 200 ms for a minute after `what`.
async fn judge(what: &str, fleet: &[(WorkerProcess, SocketAddr)]) -> anyhow::Result<()> {
    let start = Instant::now();
    let (mut two, mut none) = (None::<Instant>, None::<Instant>);
    let (mut longest_two, mut longest_none) = (Duration::ZERO, Duration::ZERO);
    let mut one_by = None;
    while start.elapsed() < Duration::from_secs(60) {
        let now = leading(fleet);
        let at = Instant::now();
        two = if now.len() >= 2 {
            two.or(Some(at))
        } else {
            None
        };
        none = if now.is_empty() {
            none.or(Some(at))
        } else {
            None
        };
        longest_two = longest_two.max(two.map_or(Duration::ZERO, |t| at - t));
        longest_none = longest_none.max(none.map_or(Duration::ZERO, |t| at - t));
        if now.len() == 1 && one_by.is_none() {
            one_by = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let end = leading(fleet);
    eprintln!(
        "{what}: one leader {one_by:?} after; two at once for {longest_two:?} at most, none for {longest_none:?} at most; leading at the end: {end:?}"
    );
    ensure!(
        longest_two <= FAILOVER,
        "{what}: two leaders for {longest_two:?}"
    );
    ensure!(
        longest_none <= FAILOVER * 3 + TAKER * 4,
        "{what}: no leader for {longest_none:?}"
    );
    ensure!(
        one_by.is_some_and(|t| t <= FAILOVER),
        "{what}: one leader only {one_by:?} after"
    );
    ensure!(end.len() == 1, "{what}: leading at the end: {end:?}");
    Ok(())
}

/// The workers whose `/status` says they lead now.
fn leading(fleet: &[(WorkerProcess, SocketAddr)]) -> Vec<String> {
    fleet
        .iter()
        .filter(|(_, http)| {
            http_get(*http, "/status")
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .is_some_and(|s| s["leading"] == true)
        })
        .map(|(p, _)| p.id.clone())
        .collect()
}

async fn serving(process: &WorkerProcess) -> anyhow::Result<SocketAddr> {
    let mut http = None;
    wait_until(
        "the worker's serving line",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let events = process.events()?;
            http = events
                .iter()
                .find(|e| e.event == "serving")
                .and_then(|e| e.http.clone());
            Ok(http.is_some())
        },
    )
    .await
    .map_err(|e| e.context(process.log_tail()))?;
    http.context("no address")?.parse().context("address")
}

fn key(row: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("leaseKey".to_owned(), AttributeValue::S(row.to_owned()))])
}

/// Deletes `row` as an operator would in the console (or `psql`): unconditionally. Fails
/// if there was no such row (the test would judge a fleet nobody disturbed).
async fn delete(ctx: &Context, row: &str) -> anyhow::Result<()> {
    if let Leases::Postgres(pg) = &ctx.leases {
        let sql = "DELETE FROM kcl_leases WHERE application = $1 AND lease_key = $2";
        let deleted = psql(&pg.url)
            .await?
            .execute(sql, &[&ctx.table, &row])
            .await?;
        ensure!(deleted == 1, "no row {row} to delete");
        return Ok(());
    }
    let out = ctx
        .dynamodb
        .delete_item()
        .table_name(&ctx.table)
        .set_key(Some(key(row)))
        .return_values(ReturnValue::AllOld)
        .send()
        .await?;
    ensure!(out.attributes.is_some(), "no row {row} to delete");
    Ok(())
}

/// Puts `row` back as a fresh, unowned lease row, in place of any row of that key (as
/// DynamoDB's `PutItem` does: in Postgres, a delete and an insert in one transaction).
async fn put_unowned(ctx: &Context, row: &str) -> anyhow::Result<()> {
    if let Leases::Postgres(pg) = &ctx.leases {
        let mut client = psql(&pg.url).await?;
        let replace = client.transaction().await?;
        let (app, key): (&str, &str) = (&ctx.table, row);
        let delete = "DELETE FROM kcl_leases WHERE application = $1 AND lease_key = $2";
        replace.execute(delete, &[&app, &key]).await?;
        let insert = "INSERT INTO kcl_leases (application, lease_key, checkpoint) \
                      VALUES ($1, $2, 'TRIM_HORIZON')";
        replace.execute(insert, &[&app, &key]).await?;
        replace.commit().await?;
        return Ok(());
    }
    let mut item = key(row);
    item.insert("leaseCounter".to_owned(), AttributeValue::N("0".to_owned()));
    item.insert(
        "checkpoint".to_owned(),
        AttributeValue::S("TRIM_HORIZON".to_owned()),
    );
    item.insert(
        "checkpointSubSequenceNumber".to_owned(),
        AttributeValue::N("0".to_owned()),
    );
    item.insert(
        "ownerSwitchesSinceCheckpoint".to_owned(),
        AttributeValue::N("0".to_owned()),
    );
    ctx.dynamodb
        .put_item()
        .table_name(&ctx.table)
        .set_item(Some(item))
        .send()
        .await?;
    Ok(())
}

/// A plain connection to the test's Postgres server, as `psql` would open.
async fn psql(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}
