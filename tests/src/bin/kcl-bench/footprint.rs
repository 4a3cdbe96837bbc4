//! Footprint and end-to-end throughput of one worker process (leader mode, the default).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_kinesis::types::ShardIteratorType;
use kcl_integration_tests::journal::Event;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, count_by_owner, wait_until};

use crate::{median, seconds};

/// Records written for the CPU figure, 100 bytes each.
const RECORDS: usize = 20_000;
/// Records written for the end-to-end figures by default (`--e2e-records`). Start-up
/// (process, table, leases) is part of the worker's time, so more records favour it; but
/// filling kinesis-local with 100,000 took over 3 minutes a run here; a whole run with 30,000
/// takes about 30 s. kinesalite fills ten times faster.
pub(crate) const E2E_RECORDS: usize = 30_000;

pub(crate) async fn table(worker: &str, runs: usize) -> anyhow::Result<()> {
    let (mut first, mut cpu, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        first.push(first_record(worker).await?);
        cpu.push(cpu_for_records(worker).await?);
        rss.push(peak_rss(worker, 100).await?);
    }
    println!();
    println!("| footprint (one worker process, coordination = leader) | median | runs |");
    println!("|---|---:|---|");
    let list = |v: &[Duration]| v.iter().map(|d| seconds(*d)).collect::<Vec<_>>().join(", ");
    println!(
        "| start → first record, fresh lease table (created by the worker) | {} s | {} |",
        seconds(median(&mut first.clone())),
        list(&first)
    );
    println!(
        "| CPU to consume {RECORDS} records of 100 B from 4 shards | {} s | {} |",
        seconds(median(&mut cpu.clone())),
        list(&cpu)
    );
    let (median, all) = mebibytes(&mut rss);
    println!("| peak RSS holding 100 shards | {median} MiB | {all} |");
    Ok(())
}

/// Sizes in KiB as MiB: the median and every value, sorted (`values` is sorted in place).
fn mebibytes(values: &mut [u64]) -> (String, String) {
    values.sort_unstable();
    let mib: Vec<String> = values
        .iter()
        .map(|k| format!("{:.1}", *k as f64 / 1024.0))
        .collect();
    let median = mib.get(mib.len() / 2).cloned().unwrap_or_default();
    (median, mib.join(", "))
}

/// The end-to-end table (also alone: `--only e2e`). Each run's ratio compares the worker
/// with bare loops over the same records just before and just after it (their mean), and
/// the table shows the median of those paired ratios: the emulator's speed drifts between
/// runs by more than the difference measured, less within one.
pub(crate) async fn e2e_table(worker: &str, runs: usize, records: usize) -> anyhow::Result<()> {
    println!();
    println!(
        "| end to end, {records} × 100 B | shards | worker records/s | bare GetRecords loop records/s | worker / bare (median of paired runs) | every run's ratio |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    for shards in [8, 32] {
        for existing in [false, true] {
            let mut measured = Vec::new();
            for _ in 0..runs {
                measured.push(end_to_end(worker, shards, existing, records).await?);
            }
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let ratios: Vec<f64> = measured.iter().map(|(w, b)| w / b).collect();
            let every = ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "| {} lease table | {shards} | {:.0} | {:.0} | {:.2} | {every} |",
                if existing { "existing" } else { "fresh" },
                median(measured.iter().map(|m| m.0).collect()),
                median(measured.iter().map(|m| m.1).collect()),
                median(ratios),
            );
        }
    }
    Ok(())
}

fn payloads(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("pk-{}", i % 64), format!("{prefix}{i:0>96}")))
        .collect()
}

/// Records delivered so far, from a `--journal-batches` journal.
fn delivered(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| e.event == "batch")
        .filter_map(|e| e.count)
        .sum()
}

async fn wait_delivered(w: &WorkerProcess, n: usize) -> anyhow::Result<()> {
    wait_until(
        "every record delivered",
        Duration::from_secs(300),
        Duration::from_millis(20),
        async || Ok(delivered(&w.events()?) >= n as u64),
    )
    .await
    .map(drop)
    .map_err(|e| e.context(w.log_tail()))
}

/// Process start → first record on a fresh table, from the journal.
async fn first_record(worker: &str) -> anyhow::Result<Duration> {
    let ctx = Context::new("bench-first")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(4).await?;
    ctx.put(&payloads("f", 100)).await?;
    let spawned = chrono::Utc::now().timestamp_millis();
    let w = WorkerProcess::spawn_in("leader", worker, &ctx, "worker-a", &["--journal-batches"])?;
    wait_delivered(&w, 1).await?;
    let first = w
        .events()?
        .iter()
        .find(|e| e.event == "batch")
        .map(|e| e.ms)
        .context("no batch line")?;
    w.terminate()?;
    Ok(Duration::from_millis(u64::try_from(first - spawned)?))
}

/// Peak RSS by the number of shards held (`--only rss`): what a worker costs at rest and
/// what each shard adds.
pub(crate) async fn rss_table(worker: &str, runs: usize) -> anyhow::Result<()> {
    println!();
    println!("| shards held | peak RSS (median) | runs |");
    println!("|---:|---:|---|");
    for shards in [1, 25, 100] {
        let mut kib = Vec::new();
        for _ in 0..runs {
            kib.push(peak_rss(worker, shards).await?);
        }
        let (median, all) = mebibytes(&mut kib);
        println!("| {shards} | {median} MiB | {all} |");
    }
    Ok(())
}

/// CPU seconds (user + system) the worker spent until it had consumed every record.
async fn cpu_for_records(worker: &str) -> anyhow::Result<Duration> {
    let ctx = Context::new("bench-cpu")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(4).await?;
    ctx.put(&payloads("c", RECORDS)).await?;
    let w = WorkerProcess::spawn_in("leader", worker, &ctx, "worker-a", &["--journal-batches"])?;
    wait_delivered(&w, RECORDS).await?;
    let cpu = cpu_time(w.pid())?;
    w.terminate()?;
    Ok(cpu)
}

/// Peak RSS in KiB of a worker that holds `shards` leases and ran 10 s with them.
async fn peak_rss(worker: &str, shards: usize) -> anyhow::Result<u64> {
    let ctx = Context::new("bench-rss")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(i32::try_from(shards)?).await?;
    let w = WorkerProcess::spawn_in("leader", worker, &ctx, "worker-a", &["--journal-batches"])?;
    wait_until(
        "the worker to hold every lease",
        Duration::from_secs(120),
        Duration::from_millis(200),
        async || {
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(by.get(&Some("worker-a".to_owned())) == Some(&shards))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let hwm = crate::memory(w.pid(), "VmHWM").context("no VmHWM in /proc/PID/status")?;
    w.terminate()?;
    Ok(hwm)
}

/// Records per second through a worker (process start → last record: start-up, table and
/// leases included) and through a bare loop reading every shard from `TRIM_HORIZON` with the
/// same batch size (10,000), same records, just before and just after the worker (the mean
/// of the two); neither checkpoints.
async fn end_to_end(
    worker: &str,
    shards: usize,
    existing: bool,
    records: usize,
) -> anyhow::Result<(f64, f64)> {
    let ctx = Context::new("bench-e2e")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(i32::try_from(shards)?).await?;
    if existing {
        // A fleet ran before: the table and its leases exist (at TRIM_HORIZON).
        let w = WorkerProcess::spawn_in(
            "leader",
            worker,
            &ctx,
            "worker-0",
            &["--journal-batches", "--no-batch-checkpoint"],
        )?;
        wait_until(
            "the leases to exist",
            Duration::from_secs(60),
            Duration::from_millis(50),
            async || Ok(ctx.owners().await.unwrap_or_default().len() == shards),
        )
        .await?;
        w.terminate()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ctx.put(&payloads("e", records)).await?;
    // Warm the emulator: its first read after a fill is slower.
    bare_loop(&ctx).await?;
    let bare = bare_loop(&ctx).await?;
    let started = Instant::now();
    // Same batch size as the bare loop, no checkpoint per batch (the bare loop writes none).
    let args = [
        "--journal-batches",
        "--max-records",
        "10000",
        "--no-batch-checkpoint",
    ];
    let w = WorkerProcess::spawn_in("leader", worker, &ctx, "worker-a", &args)?;
    wait_delivered(&w, records).await?;
    let through_worker = started.elapsed();
    w.terminate()?;
    let after = bare_loop(&ctx).await?;
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    Ok((rate(through_worker), rate((bare + after) / 2)))
}

/// Reads every shard to its current end, shards concurrently: the time it took.
async fn bare_loop(ctx: &Context) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let shards = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut tasks = tokio::task::JoinSet::new();
    for shard in shards.shards() {
        let (client, stream, id) = (
            ctx.kinesis.clone(),
            ctx.stream.clone(),
            shard.shard_id().to_owned(),
        );
        tasks.spawn(async move {
            let mut it = client
                .get_shard_iterator()
                .stream_name(&stream)
                .shard_id(&id)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await?
                .shard_iterator
                .context("no iterator")?;
            loop {
                let out = client
                    .get_records()
                    .shard_iterator(&it)
                    .limit(10_000)
                    .send()
                    .await?;
                if out.records().is_empty() && out.millis_behind_latest() == Some(0) {
                    return anyhow::Ok(());
                }
                match out.next_shard_iterator {
                    Some(next) => it = next,
                    None => return Ok(()),
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

/// User + system CPU time of process `pid` so far.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("odd /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
    };
    // utime and stime are fields 14 and 15: indexes 11 and 12 after the command name.
    let total = ticks(11)? + ticks(12)?;
    let per_second = clock_ticks()?;
    Ok(Duration::from_secs_f64(total as f64 / per_second as f64))
}

fn clock_ticks() -> anyhow::Result<u64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}
