//! What the consumer prints with a Postgres URL: never its password (`--print-config`, a
//! failed start, a run logging at DEBUG), and at start, a clear refusal of a wrong URL, a
//! missing table or column, and a table of another application.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use kcl_integration_tests::leases::postgres_url;
use kcl_integration_tests::{Context, with_timeout};

use crate::common::consumer::Consumer;
use crate::world;

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");

/// `url` with a password in it, and the password: the URL's own if it has one, else a
/// marker (the test server trusts 127.0.0.1, so any password is taken).
fn with_password(url: &str) -> (String, String) {
    let marker = "pw-Zq8Xw3Kd9".to_owned();
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), marker);
    };
    match rest.split_once('@') {
        Some((user, _)) if user.contains(':') => {
            let password = user.split_once(':').map(|(_, p)| p).unwrap_or_default();
            (url.to_owned(), password.to_owned())
        }
        Some((user, host)) => (format!("{scheme}://{user}:{marker}@{host}"), marker),
        None => {
            let join = if rest.contains('?') { '&' } else { '?' };
            (format!("{url}{join}password={marker}"), marker)
        }
    }
}

/// `url` with another port, or another database.
fn elsewhere(url: &str, port: Option<&str>, database: Option<&str>) -> String {
    let (front, query) = url.split_once('?').map_or((url, ""), |(f, q)| (f, q));
    let (authority, db) = front.rsplit_once('/').unwrap_or((front, ""));
    let authority = match port {
        Some(port) => {
            let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
            format!("{host}:{port}")
        }
        None => authority.to_owned(),
    };
    let db = database.unwrap_or(db);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("{authority}/{db}{query}")
}

/// Runs the binary with `args` to its end: (stdout, stderr).
fn output(args: &[&str]) -> anyhow::Result<(String, String)> {
    let out = Command::new(BIN).args(args).stdin(Stdio::null()).output()?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_of_a_postgres_url_is_never_printed() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("eo-pg-secret").await? else {
        return Ok(());
    };
    let (url, password) = with_password(&postgres_url()?.context("KCL_POSTGRES_URL")?);
    let table = world::table_name(&ctx);
    let common = ["--stream", &ctx.stream, "--application-name", &ctx.table];
    let mut printed = Vec::new();
    // The effective settings, both flags.
    let leases = [&common[..], &["--lease-store", &url, "--print-config"]].concat();
    let sink = [
        &common[..],
        &[
            "--exactly-once-table",
            &table,
            "--exactly-once-store",
            &url,
            "--print-config",
        ],
    ]
    .concat();
    for args in [leases, sink] {
        let (stdout, stderr) = output(&args)?;
        ensure!(
            stdout.contains("postgres://"),
            "no store printed: {stdout}{stderr}"
        );
        printed.extend([stdout, stderr]);
    }
    // A start that fails: a database that does not exist.
    let missing = elsewhere(&url, None, Some("kcl_no_such_database"));
    let (stdout, stderr) = output(&[&common[..], &["--lease-store", &missing]].concat())?;
    ensure!(stderr.contains("kcl_no_such_database"), "{stderr}");
    printed.extend([stdout, stderr]);
    // A run logging at DEBUG, until windows are committed.
    let body = async {
        ctx.create_stream(1).await?;
        ctx.put(&crate::common::consumer::records("secret", 20))
            .await?;
        let args = [
            "--stream",
            &ctx.stream,
            "--lease-store",
            &url,
            "--exactly-once-table",
            &table,
            "--log-filter",
            "debug",
        ];
        let pg = world::client(&postgres_url()?.context("KCL_POSTGRES_URL")?).await?;
        let mut consumer = Consumer::spawn_with(&ctx, "pg-secret", &args)?;
        let poll = (Duration::from_secs(60), Duration::from_millis(250));
        kcl_integration_tests::wait_until("windows committed", poll.0, poll.1, async || {
            Ok(world::counted(&pg, &table).await >= 20)
        })
        .await
        .with_context(|| consumer.log_tail())?;
        consumer.stop().await?;
        printed.push(consumer.log().join("\n"));
        printed.push(std::fs::read_to_string(
            ctx.path("pg-secret.windows.jsonl"),
        )?);
        Ok::<_, anyhow::Error>(())
    };
    with_timeout(Duration::from_secs(120), Box::pin(body)).await?;
    for text in &printed {
        ensure!(
            !text.contains(&password),
            "the password was printed:\n{text}"
        );
    }
    eprintln!(
        "{} outputs read, {} bytes, none with the password",
        printed.len(),
        printed.concat().len()
    );
    Ok(())
}

/// Starts a consumer of the test's stream with `args` (for `application`), which must exit
/// with 1 at start, its log saying every one of `words`.
async fn refused(
    ctx: &Context,
    id: &str,
    application: &str,
    args: &[&str],
    words: &[&str],
) -> anyhow::Result<()> {
    let mut consumer = Consumer::spawn_for(ctx, id, application, args)?;
    let status = consumer.wait_exit(Duration::from_secs(30)).await?;
    let log = consumer.log().join("\n");
    ensure!(
        status.code() == Some(1),
        "{id}: exited with {status}:\n{log}"
    );
    for word in words {
        ensure!(
            log.contains(word),
            "{id}: the log does not say {word:?}:\n{log}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_url_or_a_missing_table_stops_the_consumer_at_start() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("eo-pg-refused").await? else {
        return Ok(());
    };
    let url = postgres_url()?.context("KCL_POSTGRES_URL")?;
    let body = async {
        ctx.create_stream(1).await?;
        let app = ctx.table.clone();
        let closed = elsewhere(&url, Some("1"), None);
        let shown = kcl_postgres::redacted_url(&closed);
        let cannot = format!("cannot open the lease store at {shown} (--lease-store)");
        refused(
            &ctx,
            "closed",
            &app,
            &["--lease-store", &closed],
            &[&cannot, "onnection refused"],
        )
        .await?;
        let cannot =
            format!("cannot open the exactly-once store at {shown} (--exactly-once-store)");
        let sink = [
            "--exactly-once-table",
            "t_any",
            "--exactly-once-store",
            &closed,
        ];
        refused(&ctx, "sink-closed", &app, &sink, &[&cannot]).await?;
        let nodb = elsewhere(&url, None, Some("kcl_no_such_database"));
        let words = ["(--lease-store)", "kcl_no_such_database", "does not exist"];
        refused(&ctx, "no-db", &app, &["--lease-store", &nodb], &words).await?;
        // No window table, and --table-setup external creates none.
        let table = world::table_name(&ctx);
        let external = [
            "--lease-store",
            &url,
            "--exactly-once-table",
            &table,
            "--table-setup",
            "external",
        ];
        let missing = format!("exactly-once table {table} does not exist");
        refused(
            &ctx,
            "no-table",
            &app,
            &external,
            &[&missing, "--table-setup managed"],
        )
        .await?;
        // A table without a column the consumer writes.
        let pg = world::client(&url).await?;
        let positions = kcl_example_consumer::table::postgres::schema_sql(&table);
        let windows = format!(
            "CREATE TABLE {table} (shard text, window_start timestamptz, window_end timestamptz, \
             records bigint, bytes bigint, PRIMARY KEY (shard, window_start))"
        );
        pg.batch_execute(&format!("{windows}; {positions}")).await?;
        let words = [format!(
            "exactly-once table {table} has no column `commits`"
        )];
        refused(&ctx, "no-column", &app, &external, &[&words[0]]).await?;
        pg.batch_execute(&format!(
            "ALTER TABLE {table} ADD COLUMN commits bigint NOT NULL DEFAULT 0"
        ))
        .await?;
        // The table claimed by one application, then refused to another (managed: the
        // lease table made if missing; the window tables are there already).
        let managed = ["--lease-store", &url, "--exactly-once-table", &table];
        let mut first = Consumer::spawn_for(&ctx, "first", &app, &managed)?;
        let claimed = || async {
            let row = pg
                .query_opt(
                    &format!(
                        "SELECT application FROM {table}_positions WHERE shard = '#application'"
                    ),
                    &[],
                )
                .await?;
            Ok::<_, anyhow::Error>(row.map(|r| r.get::<_, String>(0)))
        };
        kcl_integration_tests::wait_until(
            "the table claimed",
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || Ok(claimed().await?.as_deref() == Some(app.as_str())),
        )
        .await
        .with_context(|| first.log_tail())?;
        first.stop().await?;
        let other = format!("{app}-other");
        let words = [
            format!("exactly-once table {table} belongs to application {app}"),
            format!("not to {other}"),
        ];
        refused(&ctx, "other", &other, &managed, &[&words[0], &words[1]]).await
    };
    with_timeout(Duration::from_secs(150), Box::pin(body)).await
}
