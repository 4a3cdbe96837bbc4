//! `kcl-admin` on a fleet whose leases are in Postgres (issue 52, `--lease-store
//! postgres://…`), its stream on the Kinesis emulator: `leases` lists what the fleet holds,
//! `reset --dry-run` writes nothing and `reset` replays a shard while two worker processes
//! run, `release` drains a worker and `--undo` lets it take work again; `copy` and
//! `remove-kcl-rows` refuse a Postgres store and touch no DynamoDB table; a wrong URL or a
//! database without the table is named plainly. No output ever shows the URL's password.
//!
//! The server is `KCL_POSTGRES_URL` (`localstack/postgres up`), which trusts 127.0.0.1: the
//! URL handed to kcl-admin carries a password ([`SECRET`]) all the same, to be looked for.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::process::Output;
use std::time::Duration;

use common::{admin, admin_with};
use kcl_core::Checkpoint;
use kcl_integration_tests::process::{WorkerProcess, test_worker_bin};
use kcl_integration_tests::{Context, Event, Producer, balanced_pair, wait_until, with_timeout};

const SHARD: &str = "shardId-000000000000";
const OTHER: &str = "shardId-000000000001";

/// A password in the URL given to kcl-admin: nothing it prints may hold it.
const SECRET: &str = "hunter2-pg-admin";

fn ms_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The test's Postgres URL, with [`SECRET`] as the user's password.
fn url_with_password(ctx: &Context) -> String {
    let url = match &ctx.leases {
        kcl_integration_tests::Leases::Postgres(pg) => pg.url.clone(),
        kcl_integration_tests::Leases::DynamoDb => unreachable!("a Postgres context"),
    };
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = match rest.split_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or(user);
            format!("{user}:{SECRET}@{host}")
        }
        None => format!("kcl:{SECRET}@{rest}"),
    };
    format!("{scheme}://{rest}")
}

/// `url` with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{param}")
}

/// kcl-admin ARGS `--lease-store URL`; its output checked not to show the password.
fn admin_pg(ctx: &Context, url: &str, args: &[&str]) -> anyhow::Result<Output> {
    let out = admin(ctx, &[args, &["--lease-store", url]].concat())?;
    no_secret(&out)?;
    Ok(out)
}

fn no_secret(out: &Output) -> anyhow::Result<()> {
    for text in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(text);
        anyhow::ensure!(!text.contains(SECRET), "the password is shown:\n{text}");
    }
    Ok(())
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_fleet_is_listed_reset_and_drained() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("admin-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(300), Box::pin(fleet(ctx))).await
}

async fn fleet(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let url = url_with_password(&ctx);
    let producer = Producer::start(&ctx, "r", 4, Duration::from_millis(200));
    let bin = test_worker_bin()?;
    let extra = ["--liveness", "per-lease", "--failover-ms", "3000"];
    let (a, b, _) = balanced_pair(bin.to_str().unwrap(), &ctx, 2, 10, &extra).await?;
    let result = async {
        listed(&ctx, &url).await?;
        reset(&ctx, &url, [&a, &b]).await?;
        drained(&ctx, &url).await?;
        refused(&ctx, &url).await
    }
    .await;
    let tails = format!("{}\n---\n{}", a.log_tail(), b.log_tail());
    producer.stop().await?;
    for w in [&a, &b] {
        w.terminate()?;
    }
    result.map_err(|e| e.context(tails))
}

/// A checkpoint as `leases --json` shows it.
fn parse_checkpoint(shown: &str) -> Option<Checkpoint> {
    let (value, sub) = shown.split_once('.').unwrap_or((shown, "0"));
    Checkpoint::parse(value, sub.parse().ok()?)
}

/// `leases`, as a table and as JSON: both shards with the owner and checkpoint the fleet's
/// rows in Postgres hold (a checkpoint between the rows read before and after it).
async fn listed(ctx: &Context, url: &str) -> anyhow::Result<()> {
    let app = ["leases", "--application-name", &ctx.table];
    let args = [&app[..], &["--stream", &ctx.stream, "--observe", "2s"]].concat();
    let out = admin_pg(ctx, url, &args)?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let table = stdout(&out);
    for needle in ["SHARD", SHARD, OTHER, "worker-a", "worker-b", "open", "yes"] {
        anyhow::ensure!(table.contains(needle), "`{needle}` missing from:\n{table}");
    }
    let before = ctx.list().await?;
    let args = [
        &app[..],
        &["--stream", &ctx.stream, "--observe", "0s", "--json"],
    ]
    .concat();
    let out = admin_pg(ctx, url, &args)?;
    anyhow::ensure!(out.status.success(), "leases --json failed");
    let after = ctx.list().await?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let shards = doc["shards"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(shards.len() == 2, "{doc}");
    for shard in &shards {
        let key = shard["shard"].as_str().unwrap_or_default();
        let row = |rows: &[kcl_core::Lease]| rows.iter().find(|l| l.key.as_str() == key).cloned();
        let (Some(then), Some(now)) = (row(&before), row(&after)) else {
            anyhow::bail!("{key} listed but not in the store: {doc}");
        };
        let owner = shard["owner"].as_str().map(str::to_owned);
        let owners = [&then.owner, &now.owner].map(|o| o.as_ref().map(ToString::to_string));
        anyhow::ensure!(
            owners.contains(&owner),
            "{key}: owner {owner:?}, rows {owners:?}"
        );
        let shown = shard["checkpoint"].as_str().unwrap_or_default();
        let checkpoint = parse_checkpoint(shown).expect("a checkpoint");
        let from = then.checkpoint.progress_cmp(&checkpoint);
        let to = checkpoint.progress_cmp(&now.checkpoint);
        anyhow::ensure!(
            matches!(checkpoint, Checkpoint::Sequence(_))
                && from.is_some_and(|o| o.is_le())
                && to.is_some_and(|o| o.is_le()),
            "{key}: listed checkpoint {shown}, rows {} and {}",
            then.checkpoint,
            now.checkpoint
        );
    }
    Ok(())
}

/// The journals of both workers.
fn journals(workers: [&WorkerProcess; 2]) -> anyhow::Result<Vec<Event>> {
    let mut all = workers[0].events()?;
    all.extend(workers[1].events()?);
    Ok(all)
}

/// Whether a processor of [`SHARD`] started from TRIM_HORIZON at or after `since`.
fn restarted(events: &[Event], since: i64) -> bool {
    events.iter().any(|e| {
        e.event == "init"
            && e.shard.as_deref() == Some(SHARD)
            && e.ms >= since
            && e.checkpoint.as_deref() == Some(Checkpoint::TRIM_HORIZON)
    })
}

/// `reset --dry-run` says what it would replay and writes nothing; `reset` to TRIM_HORIZON
/// while the fleet runs: the shard's first record is delivered again.
async fn reset(ctx: &Context, url: &str, workers: [&WorkerProcess; 2]) -> anyhow::Result<()> {
    wait_until(
        "20 records of the shard delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let n = journals(workers)?
                .iter()
                .filter(|e| e.event == "record" && e.shard.as_deref() == Some(SHARD))
                .count();
            Ok(n >= 20)
        },
    )
    .await?;
    let first = ctx.read_shard(SHARD).await?.first().map(|(s, _)| s.clone());
    let first = first.expect("records in the shard");
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
        "3s",
    ];
    let dry_ms = ms_now();
    let out = admin_pg(ctx, url, &[&reset[..], &["--dry-run"]].concat())?;
    let said = stdout(&out);
    anyhow::ensure!(out.status.success(), "reset --dry-run failed");
    anyhow::ensure!(
        said.contains(&format!("would reset {SHARD}")) && said.contains("replays"),
        "{said}"
    );
    // Written, a reset is taken from TRIM_HORIZON within a failover time (3 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    anyhow::ensure!(
        !restarted(&journals(workers)?, dry_ms),
        "the dry run reset the shard"
    );

    let started_ms = ms_now();
    let out = admin_pg(ctx, url, &reset)?;
    anyhow::ensure!(out.status.success(), "reset failed");
    let said = stdout(&out);
    anyhow::ensure!(said.contains("checkpoint TRIM_HORIZON"), "{said}");
    wait_until(
        "the shard's first record delivered again, from TRIM_HORIZON",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let events = journals(workers)?;
            let again = events.iter().any(|e| {
                e.event == "record"
                    && e.shard.as_deref() == Some(SHARD)
                    && e.ms >= started_ms
                    && e.seq.as_deref() == Some(&first)
            });
            Ok(again && restarted(&events, started_ms))
        },
    )
    .await?;
    Ok(())
}

/// `release` drains worker-a (its lease moves to worker-b, its drain row is in Postgres and
/// listed); `--undo` deletes the row and worker-a takes work again; a second undo has
/// nothing to do.
async fn drained(ctx: &Context, url: &str) -> anyhow::Result<()> {
    let release = [
        "release",
        "--application-name",
        &ctx.table,
        "--worker",
        "worker-a",
        "--failover-time",
        "3s",
    ];
    let out = admin_pg(ctx, url, &release)?;
    anyhow::ensure!(out.status.success(), "release failed");
    let holds = async |worker: &str| {
        let owners = ctx.owners().await?;
        anyhow::Ok(owners.values().any(|o| o.as_deref() == Some(worker)))
    };
    anyhow::ensure!(!holds("worker-a").await?, "{:?}", ctx.owners().await?);
    let drain = kcl_core::admin::drain_row(&kcl_core::WorkerId::new("worker-a"));
    let has_drain_row = async || {
        let rows = ctx.list().await?;
        anyhow::Ok(rows.iter().any(|l| l.key == drain))
    };
    anyhow::ensure!(has_drain_row().await?, "no drain row {drain} in Postgres");
    let leases = [
        "leases",
        "--application-name",
        &ctx.table,
        "--observe",
        "0s",
    ];
    let out = admin_pg(ctx, url, &[&leases[..], &["--json"]].concat())?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let rows = doc["drain_rows"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(rows.len() == 1 && rows[0]["worker"] == "worker-a", "{doc}");
    tokio::time::sleep(Duration::from_secs(6)).await; // two failover times
    anyhow::ensure!(
        !holds("worker-a").await?,
        "taken back: {:?}",
        ctx.owners().await?
    );

    let out = admin_pg(ctx, url, &[&release[..], &["--undo"]].concat())?;
    anyhow::ensure!(out.status.success(), "release --undo failed");
    anyhow::ensure!(
        !has_drain_row().await?,
        "the drain row {drain} is still there"
    );
    wait_until(
        "worker-a takes work again",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || holds("worker-a").await,
    )
    .await?;
    let out = admin_pg(ctx, url, &[&release[..], &["--undo"]].concat())?;
    anyhow::ensure!(!out.status.success(), "an undo of nothing succeeded");
    anyhow::ensure!(stderr(&out).contains("no drain row"), "{}", stderr(&out));
    Ok(())
}

/// `copy` and `remove-kcl-rows` refuse a Postgres store, naming the flag, and create no
/// DynamoDB table (a copy that quietly used DynamoDB would create its target).
async fn refused(ctx: &Context, url: &str) -> anyhow::Result<()> {
    let renamed = format!("{}-renamed", ctx.table);
    let copy = [
        "copy",
        "--from-application",
        &ctx.table,
        "--to-application",
        &renamed,
        "--force",
    ];
    let remove = [
        "remove-kcl-rows",
        "--application-name",
        &ctx.table,
        "--failover-time",
        "3s",
    ];
    for args in [&copy[..], &remove[..]] {
        let out = admin_pg(ctx, url, args)?;
        let said = stderr(&out);
        anyhow::ensure!(!out.status.success(), "{} on Postgres succeeded", args[0]);
        anyhow::ensure!(
            said.contains("DynamoDB lease tables only") && said.contains("--lease-store"),
            "{said}"
        );
    }
    for table in [&ctx.table, &renamed] {
        let described = ctx.dynamodb.describe_table().table_name(table).send().await;
        anyhow::ensure!(described.is_err(), "a DynamoDB table {table} was created");
    }
    Ok(())
}

/// Runs `sql` on the test's server, as an operator's `psql` would.
async fn psql(sql: &str) -> anyhow::Result<Vec<tokio_postgres::SimpleQueryRow>> {
    let url = kcl_integration_tests::leases::postgres_url()?.expect("a Postgres context");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    let rows = client.simple_query(sql).await?;
    drop(client);
    connection.await??;
    Ok(rows
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .collect())
}

/// A server that refuses the connection, a database that does not exist, a database without
/// the table (its search_path an empty schema): each refused with what is wrong, before
/// anything is read, and never with the password; the table is not created (the store is
/// `TableSetup::External`); the same through `KCL_LEASE_STORE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_url_or_a_missing_table_is_named() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("admin-pg-wrong").await? else {
        return Ok(());
    };
    let schema = format!("empty_{}", ctx.table.replace('-', "_"));
    psql(&format!("CREATE SCHEMA {schema}")).await?;
    let result = wrong(&ctx, &schema).await;
    let probe = format!("SELECT to_regclass('{schema}.kcl_leases') IS NOT NULL");
    let created = psql(&probe).await?;
    let created = created
        .first()
        .and_then(|r| r.get(0usize).map(|v| v == "t"));
    psql(&format!("DROP SCHEMA {schema} CASCADE")).await?;
    result?;
    anyhow::ensure!(
        created == Some(false),
        "kcl-admin created {schema}.kcl_leases"
    );
    Ok(())
}

async fn wrong(ctx: &Context, schema: &str) -> anyhow::Result<()> {
    let url = url_with_password(ctx);
    let no_table = with_param(&url, &format!("options=-csearch_path%3D{schema}"));
    let (base, _) = url.rsplit_once('/').expect("a database in the URL");
    let no_database = format!("{base}/kcl_admin_no_such_database");
    let host = base.rsplit_once('@').map_or(base, |(_, h)| h);
    let closed = url.replacen(host, "127.0.0.1:1", 1);
    let cases: [(&str, &[&str]); 3] = [
        (
            &no_table,
            &["no lease table kcl_leases", "kcl-postgres/schema.sql"],
        ),
        (
            &no_database,
            &["kcl_admin_no_such_database", "does not exist"],
        ),
        (&closed, &["127.0.0.1:1", "connect"]),
    ];
    let app = ["--application-name", ctx.table.as_str()];
    let commands: [Vec<&str>; 3] = [
        [&["leases"][..], &app, &["--observe", "0s"]].concat(),
        [&["release"][..], &app, &["--worker", "w"]].concat(),
        [
            &["reset"][..],
            &app,
            &["--stream", &ctx.stream, "--all", "--to", "LATEST"],
        ]
        .concat(),
    ];
    for (url, needles) in cases {
        for command in &commands {
            let out = admin_pg(ctx, url, command)?;
            let said = stderr(&out);
            anyhow::ensure!(!out.status.success(), "{} succeeded on {url}", command[0]);
            for needle in needles.iter().chain(&["--lease-store"]) {
                anyhow::ensure!(said.contains(needle), "`{needle}` missing from: {said}");
            }
        }
    }
    let env = [("KCL_LEASE_STORE", no_table.as_str())];
    let out = admin_with(ctx, &commands[0], &env)?;
    no_secret(&out)?;
    anyhow::ensure!(!out.status.success() && stderr(&out).contains("kcl-postgres/schema.sql"));
    let out = admin_pg(ctx, "mysql://kcl:hunter2-pg-admin@db/kcl", &commands[0])?;
    anyhow::ensure!(stderr(&out).contains("postgres://"), "{}", stderr(&out));
    Ok(())
}
