//! What the exactly-once tests read of the table and the lease table, and their consumers.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use kcl_core::{Checkpoint, LeaseStore, ShardId};
use kcl_example_consumer::table::dynamodb::{self, DynamoDbItems, PositionItem};
use kcl_integration_tests::Context;

/// One consumer process ([`Consumer`](crate::common::consumer::Consumer), of a given
/// application through `spawn_for`).
pub(crate) type Proc = crate::common::consumer::Consumer;

/// The records the table's windows count, in all (0 if it cannot be read).
pub(crate) async fn counted(ctx: &Context, table: &str) -> u64 {
    by_shard(ctx, table).await.values().sum()
}

/// The records the table's windows count, by shard.
pub(crate) async fn by_shard(ctx: &Context, table: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((shard, _), n) in dynamodb::read_counts(&ctx.dynamodb, table)
        .await
        .unwrap_or_default()
    {
        *out.entry(shard).or_default() += n;
    }
    out
}

/// Every shard lease's checkpoint, by shard (coordination rows left out).
pub(crate) async fn checkpoints(
    ctx: &Context,
    application: &str,
) -> anyhow::Result<BTreeMap<ShardId, Checkpoint>> {
    let store = kcl_aws::DynamoDbLeaseStore::from_client(ctx.dynamodb.clone(), application);
    Ok(store
        .list()
        .await?
        .into_iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .map(|l| (l.key, l.checkpoint))
        .collect())
}

/// `shard`'s position item in `table`.
pub(crate) async fn position(
    ctx: &Context,
    table: &str,
    shard: &ShardId,
) -> anyhow::Result<Option<PositionItem>> {
    let items = DynamoDbItems::new(ctx.dynamodb.clone(), table, "test", "test");
    Ok(items.read_position(shard).await?)
}

/// Creates `table` keyed by `(hash, range)` attributes of `(name, type)`.
pub(crate) async fn create_table(
    ctx: &Context,
    table: &str,
    hash: (&str, ScalarAttributeType),
    range: (&str, ScalarAttributeType),
) -> anyhow::Result<()> {
    let attribute = |(name, kind): (&str, ScalarAttributeType)| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    ctx.dynamodb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(hash.clone())?)
        .attribute_definitions(attribute(range.clone())?)
        .key_schema(key(hash.0, KeyType::Hash)?)
        .key_schema(key(range.0, KeyType::Range)?)
        .send()
        .await?;
    Ok(())
}

/// A mixed fleet's start, written with `prefix`: a consumer of the test's application with
/// `--exactly-once-table table` until windows are committed, stopped; then one without the
/// flag until both shards' checkpoints moved past what was committed. The producer, still
/// writing, and the consumer without the flag, still running.
pub(crate) async fn checkpointed_without_the_flag(
    ctx: &Context,
    table: &str,
    prefix: &str,
) -> anyhow::Result<(kcl_integration_tests::Producer, Proc)> {
    use anyhow::Context as _;
    let (poll, long) = (
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(60),
    );
    let (app, flag) = (ctx.table.clone(), ["--exactly-once-table", table]);
    let every = std::time::Duration::from_millis(200);
    let producer = kcl_integration_tests::Producer::start(ctx, &format!("{prefix}-"), 5, every);
    let mut with = Proc::spawn_for(ctx, &format!("{prefix}-a"), &app, &flag)?;
    kcl_integration_tests::wait_until("windows committed", long, poll, async || {
        Ok(counted(ctx, table).await >= 10)
    })
    .await
    .with_context(|| with.log_tail())?;
    with.stop().await?;
    let committed = checkpoints(ctx, &app).await?;
    let without = Proc::spawn_for(ctx, &format!("{prefix}-b"), &app, &[])?;
    kcl_integration_tests::wait_until(
        "both shards checkpointed without the flag",
        long,
        poll,
        async || {
            let now = checkpoints(ctx, &app).await?;
            Ok(now.len() == 2 && now.iter().all(|(s, c)| committed.get(s) != Some(c)))
        },
    )
    .await
    .with_context(|| without.log_tail())?;
    Ok((producer, without))
}
