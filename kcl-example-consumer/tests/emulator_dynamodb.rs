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
use kcl_core::ShardSource;
use kcl_integration_tests::items::{self, Writer, Written};
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
    let want: BTreeSet<String> = writer.written.iter().map(Written::partition_key).collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_table_streams_in_one_fleet_keep_the_adapters_multi_stream_keys() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("example-ddb-multi").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(90), Box::pin(run_multi(ctx))).await
}

async fn run_multi(ctx: Context) -> anyhow::Result<()> {
    let mut want = BTreeSet::new();
    let mut arns = Vec::new();
    for name in ["orders", "payments"] {
        let table = format!("{}-{name}", ctx.table);
        items::create(&ctx, &table, true).await?;
        let mut writer = Writer::new(&ctx, &table, 4);
        writer.write_n(12).await?;
        want.extend(writer.written.iter().map(Written::partition_key));
        let described = ctx
            .dynamodb
            .describe_table()
            .table_name(&table)
            .send()
            .await?;
        arns.push(
            described
                .table
                .and_then(|t| t.latest_stream_arn)
                .expect("a stream"),
        );
    }
    let streams = arns.join(",");
    let args = ["--source", "dynamodb-streams", "--streams", &streams];
    let mut c = Consumer::spawn_with(&ctx, "ddb-multi", &args)?;
    wait_until(
        "ddb-multi to hold both streams' leases",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            Ok(owners.len() == 2 && owners.values().all(|o| o.as_deref() == Some("ddb-multi")))
        },
    )
    .await
    .map_err(|e| e.context(c.log_tail()))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.stop().await?;
    let counted = c.keys()?;
    let missing: Vec<&String> = want.difference(&counted).collect();
    assert!(
        missing.is_empty(),
        "keys not counted: {missing:?}\n{}",
        c.log_tail()
    );
    // The adapter's keys: account:region$account$table$label(: as _):1:shardId.
    let keys: BTreeSet<String> = ctx.owners().await?.into_keys().collect();
    let sdk = items::sdk(&ctx).await;
    let mut expected = BTreeSet::new();
    for arn in &arns {
        let shards = kcl_aws::DynamoDbStreamsSource::for_stream(&sdk, arn.as_str())
            .await?
            .list_shards()
            .await?;
        let key = {
            let id = kcl_aws::streams::stream_id(arn).expect("a stream ARN");
            let (region, rest) = arn["arn:aws:dynamodb:".len()..].split_once(':').unwrap();
            let (account, resource) = rest.split_once(':').unwrap();
            let (table, label) = resource["table/".len()..].split_once("/stream/").unwrap();
            let spelled = format!(
                "{account}:{region}${account}${table}${}:1",
                label.replace(':', "_")
            );
            assert_eq!(id.to_string(), spelled);
            spelled
        };
        expected.extend(shards.iter().map(|s| format!("{key}:{}", s.id)));
    }
    assert_eq!(keys, expected);
    Ok(())
}
