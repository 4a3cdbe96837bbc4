//! What the leader and the standby read each taker interval, counted by a request meter
//! standing in front of the emulator, with worker processes: a small lease table is read whole
//! (an eventually consistent `Scan` each interval each, no stream reads: it costs less than a
//! `GetRecords`); once the table is over 12 KB they follow its stream instead (`GetRecords`,
//! no `Scan`); and following the stream, the standby still takes the dead leader's leases
//! within failover + a cycle + a second.

#![allow(clippy::print_stderr)]

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kcl_core::{Checkpoint, Lease, LeaseStore as _, ShardId};
use kcl_integration_tests::meter::{Cost, Meter};
use kcl_integration_tests::{Context, WorkerProcess, count_by_owner, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const FAILOVER: Duration = Duration::from_secs(3);
const TAKER: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_secs(6);
const LEADER_ROW: &str = "kcl-coordination/worker-leader";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_read_a_small_table_whole_and_follow_a_large_one() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("observers").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(run(ctx))).await
}

/// Scans of the lease table and stream reads over the next window.
async fn window(ctx: &Context, meter: &Meter) -> (u64, u64) {
    let from = tokio::time::Instant::now();
    tokio::time::sleep(WINDOW).await;
    let (mut scans, mut stream_reads) = (0, 0);
    for ((operation, on, _), Cost { requests, .. }) in meter.since(from) {
        match operation.as_str() {
            "Scan" if on == ctx.table => scans += requests,
            "GetRecords" => stream_reads += requests,
            _ => {}
        }
    }
    (scans, stream_reads)
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let meter = Meter::start(&ctx.endpoints.dynamodb, 0).await?;
    let mut metered = ctx.clone();
    metered.endpoints.dynamodb = meter.url();
    let args = ["--taker-ms", "1000", "--failover-ms", "3000"];
    let mut workers = Vec::new();
    for id in ["worker-a", "worker-b", "worker-c"] {
        workers.push(WorkerProcess::spawn_in(
            "leader", WORKER, &metered, id, &args,
        )?);
    }
    wait_until(
        "three workers holding the 4 leases",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(by.values().sum::<usize>() == 4 && by.keys().all(Option::is_some) && by.len() == 3)
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (scans, stream_reads) = window(&ctx, &meter).await;
    eprintln!("small table: {scans} scans, {stream_reads} stream reads in {WINDOW:?}");
    assert_eq!(
        stream_reads, 0,
        "a small table is not followed through its stream"
    );
    assert!(
        scans >= 8,
        "the leader and the standby read it whole: {scans} scans"
    );

    // Over 12 KB: rows the workers skip (coordination rows of nobody) with long keys.
    let store = ctx.store();
    for i in 0..60 {
        let key = format!("kcl-coordination/ballast-{i:03}-{}", "x".repeat(200));
        store
            .create(&Lease::new(ShardId::new(key), Checkpoint::TrimHorizon))
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (scans, stream_reads) = window(&ctx, &meter).await;
    eprintln!("large table: {scans} scans, {stream_reads} stream reads in {WINDOW:?}");
    assert!(
        stream_reads >= 8,
        "the leader and the standby follow the stream: {stream_reads}"
    );
    assert_eq!(scans, 0, "and do not read the table whole");

    // The leader dies; the standby, following the stream, takes over its role and leases.
    let leader = store
        .get(&ShardId::new(LEADER_ROW))
        .await?
        .and_then(|l| l.owner)
        .context("no leader")?;
    let at = workers
        .iter()
        .position(|w| w.id == leader.as_str())
        .context("the leader is not one of ours")?;
    let mut victim = workers.remove(at);
    let held = count_by_owner(&ctx.owners().await?)
        .get(&Some(victim.id.clone()))
        .copied()
        .unwrap_or(0);
    victim.kill()?;
    let killed = Instant::now();
    let took = wait_until(
        "the dead leader's leases held by the others",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let owners = ctx.owners().await?;
            let by = count_by_owner(&owners);
            Ok(!by.contains_key(&Some(victim.id.clone())) && by.keys().all(Option::is_some))
        },
    )
    .await?;
    eprintln!("the dead leader's {held} leases moved {took:?} after the kill");
    // The chain: the standby sees the row's last change up to a taker tick late, waits the
    // failover time, takes the leader role on its next tick, assigns on the one after, and the
    // assignee takes on its own tick; a second for the processes and the 100 ms poll.
    let bound = FAILOVER + 4 * TAKER + Duration::from_secs(1);
    assert!(
        killed.elapsed() >= took && took <= bound,
        "took {took:?} > {bound:?}"
    );
    for worker in &workers {
        worker.terminate()?;
    }
    for worker in &mut workers {
        worker.wait_exit(Duration::from_secs(20)).await?;
    }
    Ok(())
}
