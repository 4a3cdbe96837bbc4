//! What `DynamoDbLeaseStore::ensure_table` makes of a table, against the emulator: a managed
//! store adds the owner index (as KCL Java 3.x shapes it) and a `NEW_IMAGE` stream when asked
//! for them; an external one (`TableSetup::External`) changes nothing, uses what is there,
//! reads the whole table for `owned_by` where the index is missing, and refuses a missing
//! table with what to create.

use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_dynamodb::types::{KeyType, ProjectionType, StreamViewType, TableDescription};
use kcl_aws::TableSetup;
use kcl_core::lease::usage::Operation;
use kcl_core::{
    Checkpoint, ErrorKind, Lease, LeaseStore, LeaseStoreExtras, ShardId, TableFeatures, WorkerId,
};
use kcl_integration_tests::{Context, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_table_gets_what_is_asked_for_an_external_one_is_used_as_it_is()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("table-setup").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(run(ctx))).await
}

async fn describe(ctx: &Context) -> anyhow::Result<TableDescription> {
    let out = ctx
        .dynamodb
        .describe_table()
        .table_name(&ctx.table)
        .send()
        .await?;
    out.table.ok_or_else(|| anyhow::anyhow!("no description"))
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let streams = ctx.streams_client().await;
    let external = || {
        ctx.store()
            .with_table_setup(TableSetup::External)
            .with_change_feed_client(streams.clone())
    };
    let Err(error) = external().ensure_table(TableFeatures::ALL).await else {
        anyhow::bail!("an external table that does not exist is an error");
    };
    assert_eq!(error.kind(), ErrorKind::Fatal);
    assert!(
        error.to_string().contains("TableSetup::External"),
        "{error}"
    );

    let managed = ctx.store().with_change_feed_client(streams.clone());
    assert_eq!(
        managed.ensure_table(TableFeatures::NONE).await?,
        TableFeatures::NONE
    );
    let bare = describe(&ctx).await?;
    assert!(bare.global_secondary_indexes().is_empty(), "{bare:?}");
    assert!(
        bare.stream_specification()
            .is_none_or(|s| !s.stream_enabled())
    );

    // Managed elsewhere, without index or stream: used as it is, and the table is read.
    let store = external();
    assert_eq!(
        store.ensure_table(TableFeatures::ALL).await?,
        TableFeatures::NONE
    );
    let unchanged = describe(&ctx).await?;
    assert!(unchanged.global_secondary_indexes().is_empty());
    assert!(
        unchanged
            .stream_specification()
            .is_none_or(|s| !s.stream_enabled())
    );
    let mut lease = Lease::new(
        ShardId::new("shardId-000000000000"),
        Checkpoint::TrimHorizon,
    );
    store.create(&lease).await?;
    lease = store.take(&lease, &WorkerId::new("w1")).await?;
    assert_eq!(
        store.owned_by(&WorkerId::new("w1")).await?,
        [lease.key.clone()]
    );
    let usage = store.usage().context("counted")?;
    assert_eq!(
        usage.of(Operation::OwnedBy).requests,
        0,
        "no query of a missing index"
    );

    // Managed: the index as KCL Java 3.x adds it, and the stream.
    assert_eq!(
        managed.ensure_table(TableFeatures::ALL).await?,
        TableFeatures::ALL
    );
    let full = describe(&ctx).await?;
    let index = full
        .global_secondary_indexes()
        .iter()
        .find(|i| i.index_name() == Some("LeaseOwnerToLeaseKeyIndex"))
        .ok_or_else(|| anyhow::anyhow!("no owner index: {full:?}"))?;
    let keys: Vec<_> = index
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name(), k.key_type().clone()))
        .collect();
    assert_eq!(
        keys,
        [("leaseOwner", KeyType::Hash), ("leaseKey", KeyType::Range)]
    );
    assert_eq!(
        index.projection().and_then(|p| p.projection_type()),
        Some(&ProjectionType::KeysOnly)
    );
    let stream = full.stream_specification();
    assert!(
        stream.is_some_and(
            |s| s.stream_enabled() && s.stream_view_type() == Some(&StreamViewType::NewImage)
        ),
        "{stream:?}"
    );

    // Managed elsewhere, with both: used.
    let store = external();
    assert_eq!(
        store.ensure_table(TableFeatures::ALL).await?,
        TableFeatures::ALL
    );
    assert_eq!(store.owned_by(&WorkerId::new("w1")).await?, [lease.key]);
    let usage = store.usage().context("counted")?;
    assert_eq!(
        usage.of(Operation::OwnedBy).requests,
        1,
        "the index is queried"
    );
    Ok(())
}
