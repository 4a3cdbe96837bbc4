//! What an operator sees when a shard is read by nobody, with the binary on the emulators:
//! lease rows kcl cannot parse, and a checkpoint the stream does not have, each end with the
//! problem in `/status`, `/readyz`'s text and its gauge, every other shard processed, and the
//! bad row as it was.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::consumer::{Consumer, records};
use kcl_core::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseStore, SequenceNumber, ShardId, TableFeatures,
};
use kcl_integration_tests::{Context, wait_until, with_timeout};

type Item = HashMap<String, AttributeValue>;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

async fn raw_row(ctx: &Context, key: &str) -> anyhow::Result<Option<Item>> {
    let out = ctx
        .dynamodb
        .get_item()
        .table_name(&ctx.table)
        .key("leaseKey", s(key))
        .consistent_read(true)
        .send()
        .await?;
    Ok(out.item)
}

/// The `(kind, key)` of every problem in `/status`, and the gauge `metric`'s value.
fn reported(c: &Consumer, metric: &str) -> (BTreeSet<(String, String)>, Option<f64>) {
    let status: serde_json::Value = c
        .get("/status")
        .and_then(|(_, body)| serde_json::from_str(&body).ok())
        .unwrap_or_default();
    let problems = status["problems"].as_array().into_iter().flatten();
    let found = problems
        .map(|p| {
            let field = |f: &str| p[f].as_str().unwrap_or_default().to_owned();
            (field("kind"), field("key"))
        })
        .collect();
    let gauge = c.get("/metrics").and_then(|(_, text)| {
        text.lines().find_map(|line| {
            let value = line.strip_prefix(metric)?.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
    });
    (found, gauge)
}

/// Writes `n` records one by one; returns how many went to a shard other than `bad`.
async fn put_outside(ctx: &Context, n: usize, bad: &[&str]) -> anyhow::Result<f64> {
    let mut kept = 0_u32;
    for (key, data) in records("r", n) {
        let (shard, _) = ctx.put_one(&key, &data).await?;
        if !bad.contains(&shard.as_str()) {
            kept += 1;
        }
    }
    anyhow::ensure!(kept > 0, "every record went to the bad shards");
    Ok(f64::from(kept))
}

/// Records the consumer delivered, over all shards (its `kcl_records_processed_total`).
fn processed(c: &Consumer) -> f64 {
    let metrics = c.get("/metrics").map(|(_, text)| text).unwrap_or_default();
    let series = metrics.lines().filter_map(|line| {
        let rest = line.strip_prefix("kcl_records_processed_total{")?;
        rest.rsplit_once(' ')?.1.trim().parse::<f64>().ok()
    });
    series.sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_kcl_cannot_parse_are_reported_and_left_as_they_were() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("problems-rows").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(bad_rows(ctx))).await
}

async fn bad_rows(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    ctx.store().ensure_table(TableFeatures::ALL).await?;
    let (wrong_type, key_only) = ("shardId-000000000001", "shardId-000000000003");
    let rows: [Item; 2] = [
        HashMap::from([
            ("leaseKey".to_owned(), s(wrong_type)),
            ("leaseCounter".to_owned(), s("seven")),
            ("checkpoint".to_owned(), s("TRIM_HORIZON")),
        ]),
        HashMap::from([("leaseKey".to_owned(), s(key_only))]),
    ];
    for row in &rows {
        let put = ctx.dynamodb.put_item().table_name(&ctx.table);
        put.set_item(Some(row.clone())).send().await?;
    }
    let want = put_outside(&ctx, 60, &[wrong_type, key_only]).await?;
    let c = Consumer::spawn(&ctx, "consumer-a")?;
    let expected: BTreeSet<(String, String)> = [
        ("unreadable_row", wrong_type),
        ("unreadable_row", key_only),
        ("unleased", wrong_type),
        ("unleased", key_only),
    ]
    .into_iter()
    .map(|(k, s)| (k.to_owned(), s.to_owned()))
    .collect();
    wait_until(
        "both rows reported, their gauges at 2, the other shards' records delivered",
        Duration::from_secs(90),
        Duration::from_millis(250),
        async || {
            let (found, unreadable) = reported(&c, "kcl_lease_rows_unreadable");
            let (_, unleased) = reported(&c, "kcl_shards_unleased");
            Ok(found == expected
                && unreadable == Some(2.0)
                && unleased == Some(2.0)
                && processed(&c) == want)
        },
    )
    .await
    .map_err(|e| e.context(diagnose(&c)))?;
    let (_, readyz) = c.get("/readyz").expect("/readyz answers");
    assert!(
        readyz.contains("problem=\"4 shard or row problems"),
        "{readyz}"
    );
    for row in &rows {
        let key = row["leaseKey"].as_s().expect("a string key");
        assert_eq!(
            raw_row(&ctx, key).await?.as_ref(),
            Some(row),
            "{key} untouched"
        );
    }
    let mut c = c;
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_the_stream_does_not_have_is_reported_by_name() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("problems-checkpoint").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(bad_checkpoint(ctx))).await
}

async fn bad_checkpoint(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let store = ctx.store();
    store.ensure_table(TableFeatures::ALL).await?;
    let bad = "shardId-000000000000";
    // A sequence number of the right shape that no record of this stream has.
    let unknown = SequenceNumber::parse("49000000000000000000000000000000000000000000000000000000")
        .expect("digits");
    let checkpoint = Checkpoint::Sequence(ExtendedSequenceNumber::new(unknown));
    store
        .create(&Lease::new(ShardId::new(bad), checkpoint.clone()))
        .await?;
    let want = put_outside(&ctx, 40, &[bad]).await?;
    let c = Consumer::spawn(&ctx, "consumer-a")?;
    let expected = BTreeSet::from([("read_failing".to_owned(), bad.to_owned())]);
    wait_until(
        "the shard reported, its gauge at 1, the other shard's records delivered",
        Duration::from_secs(90),
        Duration::from_millis(250),
        async || {
            let (found, failing) = reported(&c, "kcl_shard_read_failing");
            Ok(found == expected && failing == Some(1.0) && processed(&c) == want)
        },
    )
    .await
    .map_err(|e| e.context(diagnose(&c)))?;
    let (_, status) = c.get("/status").expect("/status answers");
    assert!(
        status.contains(&checkpoint.to_string()) && !status.contains("does not exist ("),
        "names the checkpoint, not a missing shard: {status}"
    );
    let (_, metrics) = c.get("/metrics").expect("/metrics answers");
    assert!(
        metrics.contains("kcl_processor_failures_total 0"),
        "a read failure is not the processor's: {metrics}"
    );
    let row = store.get(&ShardId::new(bad)).await?.expect("the row stays");
    assert_eq!(
        row.checkpoint, checkpoint,
        "the checkpoint is left for a fix"
    );
    let mut c = c;
    c.stop().await
}

/// What the consumer showed, for a failure's message.
fn diagnose(c: &Consumer) -> String {
    let status = c.get("/status").map(|(_, b)| b).unwrap_or_default();
    let metrics = c.get("/metrics").map(|(_, b)| b).unwrap_or_default();
    let gauges: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kcl_") && !l.contains("_bucket"))
        .collect();
    format!(
        "status: {status}\nmetrics:\n{}\n{}",
        gauges.join("\n"),
        c.log_tail()
    )
}

fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_owned())
}

fn history(status_key: &str, status: &str) -> AttributeValue {
    AttributeValue::L(vec![AttributeValue::M(HashMap::from([
        (status_key.to_owned(), s(status)),
        ("mb".to_owned(), s("java-worker-1")),
        ("mts".to_owned(), n("1795000000000")),
    ]))])
}

/// Rows KCL Java 3.5 keeps in the lease table beside its leases (`entityType`; its
/// `WorkerMetricStats`, `LeaderLock`, `MigrationState` and table-migration rows), and one
/// lease it wrote.
fn kcl_java_3_5_rows() -> Vec<Item> {
    let list = |v: &[&str]| AttributeValue::L(v.iter().map(|x| n(x)).collect());
    vec![
        HashMap::from([
            ("leaseKey".to_owned(), s("java-worker-1")),
            ("entityType".to_owned(), s("WORKER_METRIC_STATS")),
            ("lut".to_owned(), n("1795000000")),
            (
                "sts".to_owned(),
                AttributeValue::M(HashMap::from([("C".to_owned(), list(&["10.5", "20"]))])),
            ),
            (
                "opr".to_owned(),
                AttributeValue::M(HashMap::from([("C".to_owned(), list(&["100"]))])),
            ),
            ("properties".to_owned(), AttributeValue::M(HashMap::new())),
            ("sup".to_owned(), n("1")),
            ("slu".to_owned(), n("1795000000")),
        ]),
        HashMap::from([
            ("leaseKey".to_owned(), s("Leader")),
            ("entityType".to_owned(), s("LEADER")),
            ("ownerName".to_owned(), s("java-worker-1")),
            ("leaseDuration".to_owned(), s("10000")),
            (
                "recordVersionNumber".to_owned(),
                s("3c1e7a52-1c3f-4e55-9d1a-6b7f0f6f3f10"),
            ),
        ]),
        HashMap::from([
            ("leaseKey".to_owned(), s("Migration3.0")),
            ("entityType".to_owned(), s("CLIENT_VERSION_MIGRATION")),
            ("cv".to_owned(), s("CLIENT_VERSION_3X")),
            ("mb".to_owned(), s("java-worker-1")),
            ("mts".to_owned(), n("1795000000000")),
            (
                "h".to_owned(),
                history("cv", "CLIENT_VERSION_3X_WITH_ROLLBACK"),
            ),
        ]),
        HashMap::from([
            ("leaseKey".to_owned(), s("TableMigration3.5")),
            ("entityType".to_owned(), s("TABLE_MIGRATION")),
            ("tm".to_owned(), s("TABLE_MIGRATION_STATUS_COMPLETE")),
            ("mb".to_owned(), s("java-worker-1")),
            ("mts".to_owned(), n("1795000000000")),
            (
                "h".to_owned(),
                history("tm", "TABLE_MIGRATION_STATUS_PENDING"),
            ),
        ]),
        HashMap::from([
            ("leaseKey".to_owned(), s("shardId-000000000001")),
            ("entityType".to_owned(), s("LEASE")),
            ("leaseCounter".to_owned(), n("41")),
            ("checkpoint".to_owned(), s("TRIM_HORIZON")),
            ("checkpointSubSequenceNumber".to_owned(), n("0")),
            ("ownerSwitchesSinceCheckpoint".to_owned(), n("0")),
        ]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcl_java_3_5_rows_beside_the_leases_are_skipped_and_left_intact() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("problems-java35").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(java_rows(ctx))).await
}

async fn java_rows(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    ctx.store().ensure_table(TableFeatures::ALL).await?;
    let rows = kcl_java_3_5_rows();
    for row in &rows {
        let put = ctx.dynamodb.put_item().table_name(&ctx.table);
        put.set_item(Some(row.clone())).send().await?;
    }
    let want = put_outside(&ctx, 40, &[]).await?;
    let mut c = Consumer::spawn(&ctx, "consumer-a")?;
    wait_until(
        "every shard's records delivered",
        Duration::from_secs(90),
        Duration::from_millis(250),
        async || Ok(processed(&c) == want),
    )
    .await
    .map_err(|e| e.context(diagnose(&c)))?;
    let (_, status) = c.get("/status").expect("/status answers");
    assert!(status.contains(r#""problems":[]"#), "{status}");
    for row in &rows[..4] {
        let key = row["leaseKey"].as_s().expect("a string key");
        assert_eq!(
            raw_row(&ctx, key).await?.as_ref(),
            Some(row),
            "{key} untouched"
        );
    }
    let lease = raw_row(&ctx, "shardId-000000000001")
        .await?
        .unwrap_or_default();
    assert_eq!(
        lease.get("entityType"),
        Some(&s("LEASE")),
        "kept by kcl's writes"
    );
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_capped_below_the_shard_count_reports_the_unowned_shards() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("problems-capped").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(capped(ctx))).await
}

async fn capped(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(6).await?;
    let args = ["--stream", &ctx.stream, "--max-leases", "2"];
    let mut a = Consumer::spawn_with(&ctx, "consumer-a", &args)?;
    let mut b = Consumer::spawn_with(&ctx, "consumer-b", &args)?;
    let unowned = |c: &Consumer| {
        let (found, gauge) = reported(c, "kcl_shards_unowned");
        let n = found.iter().filter(|(kind, _)| kind == "unowned").count();
        (n, gauge)
    };
    wait_until(
        "each consumer holding 2 leases and the leader reporting 2 shards unowned",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let held = |c: &Consumer| {
                c.get("/status")
                    .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                    .and_then(|s| s["leases"].as_array().map(Vec::len))
            };
            let reports = [unowned(&a), unowned(&b)];
            Ok(held(&a) == Some(2)
                && held(&b) == Some(2)
                && reports.contains(&(2, Some(2.0)))
                && reports.contains(&(0, Some(0.0))))
        },
    )
    .await
    .map_err(|e| e.context(format!("{}\n{}", diagnose(&a), diagnose(&b))))?;
    a.stop().await?;
    b.stop().await
}
