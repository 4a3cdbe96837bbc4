//! KCL Java compatibility: a lease table as KCL Java 3.1.3 left it (rows copied from a real
//! capture, see tests/fixtures) is picked up: leases owned by the departed KCL Java worker
//! are taken once expired, consumption resumes after their checkpoints, attributes we do not
//! use survive with their types, and KCL's companion tables are left alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CreateGlobalSecondaryIndexAction,
    GlobalSecondaryIndexUpdate, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType,
};
use kcl_aws::KinesisShardSource;
use kcl_core::{SequenceNumber, ShardSource};
use kcl_integration_tests::fixture::{self, Item, type_of};
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};
use serde_json::Value;

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const FIXTURE: &str = include_str!("../fixtures/kcl-java-3.1.3.json");
const FAILOVER_MS: i64 = 3000;

/// The types KCL Java's serializer reads and writes.
const KCL_TYPES: &[(&str, &str)] = &[
    ("leaseKey", "S"),
    ("leaseOwner", "S"),
    ("leaseCounter", "N"),
    ("checkpoint", "S"),
    ("checkpointSubSequenceNumber", "N"),
    ("ownerSwitchesSinceCheckpoint", "N"),
    ("startingHashKey", "S"),
    ("endingHashKey", "S"),
    ("throughputKBps", "N"),
    ("parentShardId", "SS"),
    ("childShardIds", "SS"),
    ("pendingCheckpoint", "S"),
    ("pendingCheckpointSubSequenceNumber", "N"),
    // kcl's load figures, written with its renewals; KCL Java ignores them.
    ("kclLoad", "N"),
    ("kclCapacity", "N"),
    ("kclFlow", "S"),
    // The fencing token of kcl's last take, and the records past the checkpoint that
    // finished (sparse acknowledgements); KCL Java keeps both as they are.
    ("kclFence", "N"),
    ("kclAcked", "S"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kcl_java_lease_table_is_taken_over() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kclj").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

fn key(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .unwrap()
}

fn attr(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .unwrap()
}

async fn create_table(ctx: &Context, name: &str, hash: &str) -> anyhow::Result<()> {
    ctx.dynamodb
        .create_table()
        .table_name(name)
        .attribute_definitions(attr(hash))
        .key_schema(key(hash, KeyType::Hash))
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await?;
    Ok(())
}

async fn scan(ctx: &Context, table: &str) -> anyhow::Result<Vec<Item>> {
    let out = ctx
        .dynamodb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await?;
    Ok(out.items.unwrap_or_default())
}

fn sorted(items: Vec<Item>) -> Vec<BTreeMap<String, AttributeValue>> {
    let mut v: Vec<BTreeMap<String, AttributeValue>> =
        items.into_iter().map(|i| i.into_iter().collect()).collect();
    v.sort_by_key(|i| format!("{i:?}"));
    v
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let fixture: Value = serde_json::from_str(FIXTURE)?;
    ctx.create_stream(3).await?;
    let records: Vec<(String, String)> = (0..90)
        .map(|i| (format!("pk-{i}"), format!("j{i}")))
        .collect();
    ctx.put(&records).await?;
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let shards = source.list_shards().await?;
    assert_eq!(shards.len(), 3);
    let mut in_shard = BTreeMap::new();
    for s in &shards {
        let recs = ctx.read_shard(s.id.as_str()).await?;
        assert!(recs.len() >= 4, "{} has only {} records", s.id, recs.len());
        in_shard.insert(s.id.to_string(), recs);
    }

    // The tables, as KCL Java 3.1.3 creates them: the lease table, then its owner index.
    create_table(&ctx, &ctx.table, "leaseKey").await?;
    ctx.dynamodb
        .update_table()
        .table_name(&ctx.table)
        .attribute_definitions(attr("leaseOwner"))
        .attribute_definitions(attr("leaseKey"))
        .global_secondary_index_updates(
            GlobalSecondaryIndexUpdate::builder()
                .create(
                    CreateGlobalSecondaryIndexAction::builder()
                        .index_name("LeaseOwnerToLeaseKeyIndex")
                        .key_schema(key("leaseOwner", KeyType::Hash))
                        .key_schema(key("leaseKey", KeyType::Range))
                        .projection(
                            Projection::builder()
                                .projection_type(ProjectionType::KeysOnly)
                                .build(),
                        )
                        .build()?,
                )
                .build(),
        )
        .send()
        .await?;
    let coordinator = format!("{}-CoordinatorState", ctx.table);
    let metrics = format!("{}-WorkerMetricStats", ctx.table);
    create_table(&ctx, &coordinator, "key").await?;
    create_table(&ctx, &metrics, "wid").await?;
    for (table, items) in [
        (&coordinator, "coordinator_state_items"),
        (&metrics, "worker_metric_stats_items"),
    ] {
        for item in fixture[items].as_array().unwrap() {
            ctx.dynamodb
                .put_item()
                .table_name(table)
                .set_item(Some(fixture::item(item)?))
                .send()
                .await?;
        }
    }

    // The lease rows: two owned by the departed KCL Java worker with checkpoints mid-stream
    // (the KCL 3.x `throughputKBps` among their attributes), one never assigned. Checkpoints
    // and hash keys are replaced by this stream's; everything else is as KCL Java wrote it.
    let owned = fixture["lease_rows_after_graceful_shutdown"]
        .as_array()
        .unwrap();
    let plan: [(&Value, usize); 3] = [
        (&owned[0], 1),
        (&owned[1], 2),
        (&fixture["lease_row_created_by_shard_sync"], usize::MAX),
    ];
    let mut checkpoints: BTreeMap<String, Option<SequenceNumber>> = BTreeMap::new();
    let mut before: BTreeMap<String, Item> = BTreeMap::new();
    for (shard, (row, index)) in shards.iter().zip(plan) {
        let mut item = fixture::item(row)?;
        let s = |v: String| AttributeValue::S(v);
        item.insert("leaseKey".into(), s(shard.id.to_string()));
        item.insert(
            "startingHashKey".into(),
            s(shard.hash_key_range.start.to_string()),
        );
        item.insert(
            "endingHashKey".into(),
            s(shard.hash_key_range.end.to_string()),
        );
        let checkpoint =
            (index != usize::MAX).then(|| in_shard[shard.id.as_str()][index].0.clone());
        if let Some(seq) = &checkpoint {
            item.insert("checkpoint".into(), s(seq.clone()));
        }
        checkpoints.insert(
            shard.id.to_string(),
            checkpoint.and_then(SequenceNumber::parse),
        );
        ctx.dynamodb
            .put_item()
            .table_name(&ctx.table)
            .set_item(Some(item.clone()))
            .send()
            .await?;
        before.insert(shard.id.to_string(), item);
    }
    let companions_before = (
        sorted(scan(&ctx, &coordinator).await?),
        sorted(scan(&ctx, &metrics).await?),
    );

    // Expected: every record after each checkpoint.
    let mut want = BTreeSet::new();
    for (shard, recs) in &in_shard {
        for (seq, data) in recs {
            let after = match &checkpoints[shard] {
                Some(cp) => SequenceNumber::parse(seq.as_str()).unwrap() > *cp,
                None => true,
            };
            if after {
                want.insert(data.clone());
            }
        }
    }

    let mut worker = WorkerProcess::spawn(WORKER, &ctx, "rust-worker", &["--failover-ms", "3000"])?;
    wait_until(
        "consumption to resume after the checkpoints",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got: BTreeSet<String> =
                kcl_integration_tests::journal::delivered(&worker.events()?)
                    .into_iter()
                    .collect();
            Ok(got.is_superset(&want))
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.terminate()?;
    assert!(worker.wait_exit(Duration::from_secs(20)).await?.success());
    let events = worker.events()?;

    // Nothing at or before a checkpoint was delivered.
    for e in events.iter().filter(|e| e.event == "record") {
        let shard = e.shard.clone().unwrap();
        if let Some(cp) = &checkpoints[&shard] {
            assert!(
                e.sequence().unwrap() > *cp,
                "{shard}: {:?} is not after the checkpoint {cp}",
                e.seq
            );
        }
    }
    // The KCL Java worker's leases were taken once expired, the unowned one at once.
    let started = events.iter().find(|e| e.event == "started").unwrap().ms;
    for (shard, cp) in &checkpoints {
        let init = events
            .iter()
            .find(|e| e.event == "init" && e.shard.as_ref() == Some(shard))
            .unwrap();
        let after = init.ms - started;
        if cp.is_some() {
            assert_eq!(
                init.checkpoint.as_deref(),
                cp.as_ref().map(SequenceNumber::as_str)
            );
            assert!(
                after >= FAILOVER_MS * 9 / 10,
                "{shard} taken {after} ms after start, before it expired"
            );
        } else {
            assert!(
                after < FAILOVER_MS,
                "unowned {shard} taken only {after} ms after start"
            );
        }
    }

    // The rows: attributes kept, types unchanged, checkpoints moved to each shard's end.
    let after: HashMap<String, Item> = scan(&ctx, &ctx.table)
        .await?
        .into_iter()
        .map(|i| (i["leaseKey"].as_s().unwrap().clone(), i))
        .collect();
    for (shard, old) in &before {
        let new = &after[shard];
        for (name, value) in new {
            let expected = KCL_TYPES.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
            assert_eq!(
                Some(type_of(value)),
                expected,
                "{shard}: attribute {name} = {value:?}"
            );
        }
        for (name, value) in old {
            match name.as_str() {
                // A graceful shutdown released the lease (KCL Java reads "no owner").
                "leaseOwner" => assert!(!new.contains_key(name)),
                "leaseCounter" => {
                    let n = |v: &AttributeValue| v.as_n().unwrap().parse::<u64>().unwrap();
                    assert!(n(&new[name]) > n(value), "{shard}: counter did not move");
                }
                "checkpoint" => {
                    let last = &in_shard[shard].last().unwrap().0;
                    assert_eq!(new[name].as_s().unwrap(), last, "{shard}: checkpoint");
                }
                "ownerSwitchesSinceCheckpoint" => {
                    assert_eq!(new[name], AttributeValue::N("0".into()));
                }
                _ => assert_eq!(
                    new.get(name),
                    Some(value),
                    "{shard}: attribute {name} changed"
                ),
            }
        }
    }
    assert_eq!(
        after
            .values()
            .filter(|i| i.contains_key("throughputKBps"))
            .count(),
        2,
        "KCL 3.x throughputKBps kept"
    );

    // The companion tables and the owner index are untouched.
    let companions_after = (
        sorted(scan(&ctx, &coordinator).await?),
        sorted(scan(&ctx, &metrics).await?),
    );
    assert_eq!(companions_before, companions_after);
    let table = ctx
        .dynamodb
        .describe_table()
        .table_name(&ctx.table)
        .send()
        .await?;
    let indexes: Vec<&str> = table
        .table()
        .map(|t| {
            t.global_secondary_indexes()
                .iter()
                .filter_map(|g| g.index_name())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(indexes, ["LeaseOwnerToLeaseKeyIndex"]);
    Ok(())
}
