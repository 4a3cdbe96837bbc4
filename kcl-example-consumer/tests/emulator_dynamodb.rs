//! The binary on a DynamoDB table's stream (`--source dynamodb-streams --table T`) against
//! moto: every changed item's key is counted, and the lease is the raw shard id as the Java
//! adapter keys it; a table without a stream, a disabled stream and another table's stream ARN
//! stop it at start, naming the setting to fix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamSpecification;
use common::consumer::Consumer;
use kcl_integration_tests::items::{self, Writer};
use kcl_integration_tests::{Context, wait_until, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_counts_every_changed_item_of_a_table_stream() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("example-ddb").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(90), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let table = format!("{}-items", ctx.table);
    items::create(&ctx, &table, true).await?;
    let mut writer = Writer::new(&ctx, &table, 12);
    writer.write_n(40).await?;
    let source = ["--source", "dynamodb-streams", "--table", table.as_str()];
    let mut c = Consumer::spawn_with(&ctx, "ddb-a", &source)?;
    let want: BTreeSet<String> = writer
        .written
        .iter()
        .map(|w| format!(r#"{{"id":{{"S":"{}"}}}}"#, w.id))
        .collect();
    assert_eq!(want.len(), 12);
    wait_until(
        "ddb-a to hold the stream's lease",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            Ok(owners.values().any(|o| o.as_deref() == Some("ddb-a")))
        },
    )
    .await
    .map_err(|e| e.context(c.log_tail()))?;
    // Windows close on a later record or at shutdown: give it time to read, then stop it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.stop().await?;
    let counted = c.keys()?;
    let missing: Vec<&String> = want.difference(&counted).collect();
    assert!(
        missing.is_empty(),
        "keys not counted: {missing:?}\n{}",
        c.log_tail()
    );
    let owners = ctx.owners().await?;
    assert!(
        owners.len() == 1 && owners.keys().all(|k| k.starts_with("shardId-")),
        "one lease, keyed by the raw shard id: {owners:?}"
    );
    Ok(())
}

/// Runs the binary with `args`; its exit must be a failure whose log says `says`.
async fn refused(ctx: &Context, id: &str, args: &[&str], says: &[&str]) -> anyhow::Result<()> {
    let mut c = Consumer::spawn_with(ctx, id, args)?;
    let status = c.wait_exit(Duration::from_secs(30)).await?;
    let log = c.log_tail();
    eprintln!("{id}: {log}");
    assert!(!status.success(), "{id} ran: {log}");
    for s in says {
        assert!(log.contains(s), "{id}: no {s:?} in {log}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_streams_stop_the_binary_at_start_naming_what_to_fix() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("example-ddb-bad").await? else {
        return Ok(());
    };
    let (bare, orders, payments) = (
        format!("{}-bare", ctx.table),
        format!("{}-orders", ctx.table),
        format!("{}-payments", ctx.table),
    );
    items::create(&ctx, &bare, false).await?;
    items::create(&ctx, &orders, true).await?;
    items::create(&ctx, &payments, true).await?;
    let ddb = ["--source", "dynamodb-streams"];
    refused(
        &ctx,
        "no-stream",
        &[&ddb[..], &["--table", &bare]].concat(),
        &[
            "invalid setting `table`",
            "has no DynamoDB stream: enable one",
        ],
    )
    .await?;

    let sdk = items::sdk(&ctx).await;
    let of_payments = kcl_aws::DynamoDbStreamsSource::for_table(&sdk, &payments).await?;
    refused(
        &ctx,
        "other-table",
        &[
            &ddb[..],
            &["--table", &orders, "--stream", of_payments.arn()],
        ]
        .concat(),
        &[
            "invalid setting `stream`",
            &format!("is a stream of table {payments}, not of table {orders}"),
        ],
    )
    .await?;

    ctx.dynamodb
        .update_table()
        .table_name(&orders)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(false)
                .build()?,
        )
        .send()
        .await?;
    refused(
        &ctx,
        "disabled",
        &[&ddb[..], &["--table", &orders]].concat(),
        &[
            "invalid setting `table`",
            "is disabled: enable the table's stream again",
        ],
    )
    .await
}
