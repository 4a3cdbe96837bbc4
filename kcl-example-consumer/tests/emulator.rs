//! The binary, twice, against the emulators: two processes share a stream, `/readyz` and
//! `/metrics` answer while they run, SIGTERM stops one gracefully, the other takes its shards
//! at once and no record is lost (every partition key shows up in a window line).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::consumer::{Consumer, records};
use kcl_integration_tests::{Context, count_by_owner, wait_until, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sigterm_one_the_other_continues_and_nothing_is_lost() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("example-binary").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let mut written = records("before", 40);
    ctx.put(&written).await?;
    let mut a = Consumer::spawn(&ctx, "consumer-a")?;
    let mut b = Consumer::spawn(&ctx, "consumer-b")?;

    wait_until(
        "both consumers to hold 2 leases",
        Duration::from_secs(40),
        Duration::from_millis(200),
        async || {
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(by.get(&Some("consumer-a".into())) == Some(&2)
                && by.get(&Some("consumer-b".into())) == Some(&2))
        },
    )
    .await
    .map_err(|e| e.context(format!("a:\n{}\nb:\n{}", a.log_tail(), b.log_tail())))?;

    let live = records("live", 40);
    ctx.put(&live).await?;
    written.extend(live);
    // Both answer their probes while they run.
    for c in [&a, &b] {
        wait_until(
            "/readyz",
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || Ok(c.get("/readyz").is_some_and(|(code, _)| code == 200)),
        )
        .await?;
        let (code, metrics) = c.get("/metrics").expect("/metrics answers");
        assert_eq!(code, 200);
        assert!(metrics.contains("kcl_leases_held"), "{metrics}");
        // The lease table's bill is visible: scans counted with the units DynamoDB reported.
        let list = r#"{operation="list"}"#;
        let scans = sample(&metrics, &format!("kcl_lease_store_requests_total{list}"));
        let units = sample(&metrics, &format!("kcl_lease_store_read_units_total{list}"));
        assert!(scans.is_some_and(|n| n >= 1.0), "{metrics}");
        assert!(units.is_some_and(|n| n >= 1.0), "{metrics}");
    }
    wait_until(
        "records processed",
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || {
            Ok(a.get("/metrics")
                .is_some_and(|(_, m)| m.contains("kcl_records_processed_total")))
        },
    )
    .await?;

    b.stop().await?;
    let took = wait_until(
        "consumer-a to hold all 4 leases",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            Ok(count_by_owner(&ctx.owners().await?).get(&Some("consumer-a".into())) == Some(&4))
        },
    )
    .await?;
    eprintln!("consumer-a held all 4 leases {took:?} after consumer-b exited");
    assert!(
        took < Duration::from_secs(3),
        "released leases are taken without waiting for expiry: {took:?}"
    );

    let after = records("after", 40);
    ctx.put(&after).await?;
    written.extend(after);
    let want: BTreeSet<String> = written.iter().map(|(k, _)| k.clone()).collect();
    // Windows close when a later record arrives or at shutdown: stop consumer-a gracefully
    // once it has had time to read everything, then count what both printed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(a.get("/readyz").is_some_and(|(code, _)| code == 200));
    a.stop().await?;
    let got: BTreeSet<String> = a.keys()?.union(&b.keys()?).cloned().collect();
    let lost: Vec<&String> = want.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} of {} records lost: {lost:?}\n{}",
        lost.len(),
        want.len(),
        a.log_tail()
    );
    Ok(())
}

/// The `shard` label values of `metric` in a Prometheus scrape.
fn shards_in(scrape: &str, metric: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter_map(|l| {
            l.split("shard=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_of_a_shard_handed_away_leave_metrics() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("stale-series").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(stale_series(ctx))).await
}

async fn stale_series(ctx: Context) -> anyhow::Result<()> {
    const BEHIND: &str = "kcl_behind_latest_seconds";
    ctx.create_stream(4).await?;
    ctx.put(&records("spread", 80)).await?;
    let a = Consumer::spawn(&ctx, "consumer-a")?;
    wait_until(
        "consumer-a to report all 4 shards",
        Duration::from_secs(40),
        Duration::from_millis(200),
        async || {
            Ok(a.get("/metrics")
                .is_some_and(|(_, m)| shards_in(&m, BEHIND).len() == 4))
        },
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    let b = Consumer::spawn(&ctx, "consumer-b")?;
    wait_until(
        "a handoff of 2 leases to consumer-b",
        Duration::from_secs(40),
        Duration::from_millis(200),
        async || {
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(by.get(&Some("consumer-b".into())) == Some(&2))
        },
    )
    .await
    .map_err(|e| e.context(b.log_tail()))?;
    let owners = ctx.owners().await?;
    let held_by = |who: &str| -> BTreeSet<String> {
        owners
            .iter()
            .filter(|(_, o)| o.as_deref() == Some(who))
            .map(|(s, _)| s.clone())
            .collect()
    };
    let (kept, moved) = (held_by("consumer-a"), held_by("consumer-b"));
    let took = wait_until(
        "consumer-a to stop exporting the series of the shards it handed away",
        Duration::from_secs(40),
        Duration::from_millis(500),
        async || {
            let shown = a
                .get("/metrics")
                .map(|(_, m)| shards_in(&m, BEHIND))
                .unwrap_or_default();
            Ok(shown == kept)
        },
    )
    .await
    .map_err(|e| {
        let shown = a.get("/metrics").map(|(_, m)| shards_in(&m, BEHIND));
        e.context(format!("kept {kept:?}, moved {moved:?}, shown {shown:?}"))
    })?;
    eprintln!("the moved shards' series left consumer-a's /metrics {took:?} after the handoff");
    Ok(())
}

/// The value of the series `series` (name and labels, exactly as exported) in Prometheus text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}
