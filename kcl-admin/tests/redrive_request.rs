//! `DynamoDbLeaseStore::request_redrive` against moto's DynamoDB: the request is added to the
//! row's parked keys only while the row still parks the key, whoever holds it, touching
//! nothing else (the owner and counter stay: the holder's fenced writes go on); a row that no
//! longer parks the key, or is gone, is `false`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_core::failure::redrive_entry;
use kcl_core::lease::usage::Operation;
use kcl_core::{
    Checkpoint, Lease, LeaseStore as _, LeaseStoreExtras as _, ShardId, TableFeatures, WorkerId,
};
use kcl_integration_tests::{Context, with_timeout};

const KEY: &str = "00000000deadbeef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_request_is_added_only_while_the_row_parks_the_key() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("redrive-request").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let store = ctx.store();
    store.ensure_table(TableFeatures::NONE).await?;
    let shard = ShardId::new("shardId-000000000001");
    let park = format!("{KEY}/4959/0");
    let mut lease = Lease::new(shard.clone(), Checkpoint::TrimHorizon);
    lease.parked_keys = vec![park.clone(), "00000000000000aa/12/0".to_owned()];
    assert!(store.create(&lease).await?);
    let row = store.get(&shard).await?.unwrap();
    let held = store.take(&row, &WorkerId::new("worker-a")).await?;

    let request = redrive_entry(KEY, 3, std::slice::from_ref(&shard));
    assert!(store.request_redrive(&shard, &park, &request).await?);
    let row = store.get(&shard).await?.unwrap();
    let mut entries = row.parked_keys.clone();
    entries.sort();
    assert_eq!(
        entries,
        vec![
            "00000000000000aa/12/0".to_owned(),
            park.clone(),
            request.clone()
        ],
        "the request beside the entries"
    );
    assert_eq!(
        (row.owner.clone(), row.counter),
        (held.owner.clone(), held.counter),
        "owner and counter untouched"
    );
    // The holder's fenced writes go on.
    let renewed = store.renew(&held).await?;
    assert!(renewed.parked_keys.contains(&request));
    // Asked twice: one entry.
    assert!(store.request_redrive(&shard, &park, &request).await?);
    assert_eq!(store.get(&shard).await?.unwrap().parked_keys.len(), 3);

    // Once the holder unparked the key, a request is refused, and nothing is written.
    store
        .unpark(&shard, &[park.clone(), request.clone()])
        .await?;
    let late = redrive_entry(KEY, 4, std::slice::from_ref(&shard));
    assert!(!store.request_redrive(&shard, &park, &late).await?);
    let row = store.get(&shard).await?.unwrap();
    assert_eq!(row.parked_keys, vec!["00000000000000aa/12/0".to_owned()]);
    // A row that is gone.
    let gone = ShardId::new("shardId-000000000009");
    assert!(!store.request_redrive(&gone, &park, &late).await?);
    assert!(store.get(&gone).await?.is_none(), "no row created");
    let usage = store.usage().unwrap().of(Operation::RequestRedrive);
    assert_eq!(usage.requests, 4);
    Ok(())
}
