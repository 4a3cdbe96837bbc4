//! The lease table's change feed from its DynamoDB stream (`Coordination::Leader`'s observers
//! read it instead of scanning the table every interval), against the emulator through the
//! real SDK clients: the stream is enabled by `ensure_table`, a restart gives a position,
//! every write after it comes back once and in order (deletions as deletions), a position
//! of another stream restarts, and the reads are counted as requests without read units.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use kcl_core::lease::feed::{Change, FeedPosition, FeedRead};
use kcl_core::lease::usage::Operation;
use kcl_core::{Checkpoint, Lease, LeaseStore, LeaseStoreExtras, ShardId, TableFeatures, WorkerId};
use kcl_integration_tests::{Context, with_timeout};
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_tables_stream_serves_the_change_feed() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("feed").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let store = ctx.store_with_feed().await;
    let wanted = TableFeatures::NONE.with_change_feed(true);
    assert_eq!(store.ensure_table(wanted).await?, wanted);
    // A table with its stream is left as it is.
    assert_eq!(store.ensure_table(wanted).await?, wanted);
    let described = ctx
        .dynamodb
        .describe_table()
        .table_name(&ctx.table)
        .send()
        .await?;
    let spec = described.table().and_then(|t| t.stream_specification());
    assert!(
        spec.is_some_and(
            |s| s.stream_enabled() && s.stream_view_type() == Some(&StreamViewType::NewImage)
        ),
        "ensure_table enabled a NEW_IMAGE stream: {spec:?}"
    );
    assert_eq!(
        ctx.store().changes(None).await?,
        FeedRead::Unavailable,
        "a store without a feed has none"
    );

    // A table of at most 12 KB is read whole rather than followed (it costs less): fill it
    // past that, and read it whole once so that the store knows.
    assert_eq!(store.changes(None).await?, FeedRead::Unavailable);
    for i in 0..150 {
        let filler = Lease::new(
            ShardId::new(format!("filler-{i:04}")),
            Checkpoint::TrimHorizon,
        );
        store.create(&filler).await?;
    }
    store.snapshot().await?;
    let FeedRead::Restart(start) = store.changes(None).await? else {
        anyhow::bail!("a first read restarts");
    };
    let lease = Lease::new(ShardId::new("shard-a"), Checkpoint::TrimHorizon);
    store.create(&lease).await?;
    let taken = store.take(&lease, &WorkerId::new("w1")).await?;
    let renewed = store.renew(&taken).await?;
    store.delete(&renewed).await?;

    let mut seen = Vec::new();
    let mut position = start.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 4 && Instant::now() < deadline {
        let FeedRead::Changes(changes, next) = store.changes(Some(&position)).await? else {
            anyhow::bail!("the position from the restart goes on");
        };
        seen.extend(changes);
        position = next;
        sleep(Duration::from_millis(100)).await;
    }
    let summary: Vec<_> = seen
        .iter()
        .map(|c| match c {
            Change::Written(l) => format!(
                "{} {:?} {}",
                l.key,
                l.owner.as_ref().map(WorkerId::as_str),
                l.counter
            ),
            Change::Deleted(k) => format!("{k} deleted"),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "shard-a None 0",
            "shard-a Some(\"w1\") 1",
            "shard-a Some(\"w1\") 2",
            "shard-a deleted"
        ],
        "each write once, in order"
    );
    let FeedRead::Changes(none, _) = store.changes(Some(&position)).await? else {
        anyhow::bail!("the position goes on");
    };
    assert!(none.is_empty(), "nothing twice: {none:?}");

    let mut foreign = FeedPosition::new();
    foreign.set(
        "stream",
        "arn:aws:dynamodb:us-east-1:000000000000:table/other/stream/x",
    );
    assert!(
        matches!(store.changes(Some(&foreign)).await?, FeedRead::Restart(_)),
        "a position of another stream restarts"
    );

    let usage = store.usage().unwrap().by_operation();
    let feed = usage
        .get(&Operation::ReadChanges)
        .copied()
        .unwrap_or_default();
    assert!(feed.requests >= 3 && feed.rows >= 4, "{feed:?}");
    assert!(
        feed.read_units.abs() < f64::EPSILON,
        "billed per request: {feed:?}"
    );
    Ok(())
}
