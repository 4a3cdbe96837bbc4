//! One worker consumes every record of a 4-shard stream from TRIM_HORIZON and checkpoints;
//! a second run resumes from those checkpoints and re-delivers nothing checkpointed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::journal::delivered;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");

fn records(from: usize, to: usize) -> Vec<(String, String)> {
    (from..to)
        .map(|i| (format!("key-{}", i % 16), format!("r{i}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_run_resumes_after_the_checkpoints() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("resume").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let first = records(0, 80);
    ctx.put(&first).await?;

    // Run 1: everything is delivered, then a graceful stop.
    let mut w1 = WorkerProcess::spawn(WORKER, &ctx, "run-1", &[])?;
    let want: BTreeSet<String> = first.iter().map(|(_, d)| d.clone()).collect();
    wait_until(
        "run 1 to deliver all 80 records",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got: BTreeSet<String> = delivered(&w1.events()?).into_iter().collect();
            Ok(got.is_superset(&want))
        },
    )
    .await
    .map_err(|e| e.context(w1.log_tail()))?;
    // Every delivered batch was checkpointed; let the last checkpoint land, then stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w1.terminate()?;
    let status = w1.wait_exit(Duration::from_secs(20)).await?;
    assert!(
        status.success(),
        "run 1 exited with {status}: {}",
        w1.log_tail()
    );

    let run1 = w1.events()?;
    let mut leases = ctx.store().list().await?;
    // The leader and standby rows (coordination = leader) are not shard leases.
    leases.retain(|l| !kcl_core::singleton::is_coordination_key(&l.key));
    assert_eq!(leases.len(), 4, "one lease per shard");
    for lease in &leases {
        assert!(
            matches!(lease.checkpoint, Checkpoint::Sequence(_)),
            "lease {} has checkpoint {}",
            lease.key,
            lease.checkpoint
        );
        assert_eq!(lease.owner, None, "released at shutdown: {lease:?}");
        // The checkpoint is the last record the shard delivered.
        let last = run1
            .iter()
            .filter(|e| e.event == "record" && e.shard.as_deref() == Some(lease.key.as_str()))
            .filter_map(|e| e.sequence())
            .max()
            .unwrap();
        assert_eq!(lease.checkpoint.as_str(), last.as_str());
    }

    // Run 2: only the new records arrive.
    let second = records(80, 120);
    ctx.put(&second).await?;
    let mut w2 = WorkerProcess::spawn(WORKER, &ctx, "run-2", &[])?;
    let want2: BTreeSet<String> = second.iter().map(|(_, d)| d.clone()).collect();
    wait_until(
        "run 2 to deliver the 40 new records",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got: BTreeSet<String> = delivered(&w2.events()?).into_iter().collect();
            Ok(got.is_superset(&want2))
        },
    )
    .await
    .map_err(|e| e.context(w2.log_tail()))?;
    // Give a re-delivery time to show up, had there been one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    w2.terminate()?;
    w2.wait_exit(Duration::from_secs(20)).await?;
    let redelivered: Vec<String> = delivered(&w2.events()?)
        .into_iter()
        .filter(|d| want.contains(d))
        .collect();
    assert!(
        redelivered.is_empty(),
        "run 2 re-delivered checkpointed records: {redelivered:?}"
    );
    let inits: Vec<_> = w2
        .events()?
        .into_iter()
        .filter(|e| e.event == "init")
        .collect();
    assert!(
        inits
            .iter()
            .all(|e| e.checkpoint.as_deref() != Some(Checkpoint::TRIM_HORIZON))
    );
    Ok(())
}
