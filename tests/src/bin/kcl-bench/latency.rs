//! Delivery latency, put → `process_records`, by retrieval mode: one worker on 4 shards, a
//! writer putting one record every 50 ms stamped with the time of its put. Polling runs at the
//! default pause after an empty read (1 s) and at 200 ms; fan-out has no pause to choose.

use std::time::Duration;

use anyhow::Context as _;
use kcl_integration_tests::journal::Event;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, wait_until};

use crate::median;

/// Records timed per run.
const RECORDS: usize = 200;

pub(crate) async fn table(worker: &str, runs: usize) -> anyhow::Result<()> {
    let modes: [(&str, &[&str]); 3] = [
        (
            "polling, idle 1 s (default)",
            &["--retrieval", "polling", "--idle-ms", "1000"],
        ),
        (
            "polling, idle 200 ms",
            &["--retrieval", "polling", "--idle-ms", "200"],
        ),
        ("fan-out", &["--retrieval", "fan-out"]),
    ];
    println!();
    println!("| put → process latency (kinesis-local) | median | p90 | run medians |");
    println!("|---|---:|---:|---|");
    for (name, args) in modes {
        let (mut medians, mut p90s) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let mut run = latencies(worker, args).await?;
            medians.push(median(&mut run));
            p90s.push(percentile(&mut run, 0.9));
        }
        let list = medians
            .iter()
            .map(|d| format!("{}", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "| {name} | {} ms | {} ms | {list} |",
            median(&mut medians).as_millis(),
            median(&mut p90s).as_millis()
        );
    }
    Ok(())
}

/// The `p`-th quantile of `values` (sorted in place), nearest rank.
pub(crate) fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    values.get(at).copied().unwrap_or_default()
}

/// One run: every record's latency, from its put to its journal line.
async fn latencies(worker: &str, args: &[&str]) -> anyhow::Result<Vec<Duration>> {
    let ctx = Context::new("bench-latency")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(4).await?;
    let w = WorkerProcess::spawn_in("leader", worker, &ctx, "worker-a", args)?;
    // Reading every shard (a first record delivered from each) before timing starts.
    let warm: Vec<(String, String)> = (0..16)
        .map(|i| (format!("pk-{i}"), "warm".to_owned()))
        .collect();
    ctx.put(&warm).await?;
    wait_until(
        "the warm-up records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        async || Ok(stamped(&w.events()?).len() + count_warm(&w.events()?) >= 16),
    )
    .await
    .map_err(|e| e.context(w.log_tail()))?;
    for i in 0..RECORDS {
        let at = chrono::Utc::now().timestamp_millis();
        ctx.put_one(&format!("pk-{}", i % 16), &format!("t{at}"))
            .await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until(
        "every timed record",
        Duration::from_secs(60),
        Duration::from_millis(50),
        async || Ok(stamped(&w.events()?).len() >= RECORDS),
    )
    .await
    .map_err(|e| e.context(w.log_tail()))?;
    let lat = stamped(&w.events()?);
    w.terminate()?;
    Ok(lat)
}

fn count_warm(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| e.event == "record" && e.data.as_deref() == Some("warm"))
        .count()
}

/// The latency of each timed record delivered.
fn stamped(events: &[Event]) -> Vec<Duration> {
    events
        .iter()
        .filter(|e| e.event == "record")
        .filter_map(|e| {
            let put: i64 = e.data.as_deref()?.strip_prefix('t')?.parse().ok()?;
            u64::try_from(e.ms - put).ok().map(Duration::from_millis)
        })
        .collect()
}
