//! A lease row for a shard the stream does not have (a parent that aged out of retention
//! while the fleet was down) is treated as ended on the real backends: kinesis-mock answers
//! GetShardIterator with ResourceNotFoundException, the worker checks that the stream still
//! lists shards, writes SHARD_END, and the shard that waited on it as its parent proceeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_core::{Checkpoint, Lease, LeaseStore, ShardId, TableFeatures};
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_parent_ends_and_its_child_proceeds() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("vanished").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let records: Vec<(String, String)> = (0..10)
        .map(|i| (format!("key-{i}"), format!("r{i}")))
        .collect();
    ctx.put(&records).await?;
    // What a previous run left: the stream's shard waits on a parent that no longer exists.
    let store = ctx.store();
    store.ensure_table(TableFeatures::NONE).await?;
    let gone = ShardId::new("shardId-000000000099");
    store
        .create(&Lease::new(gone.clone(), Checkpoint::TrimHorizon))
        .await?;
    let mut child = Lease::new(
        ShardId::new("shardId-000000000000"),
        Checkpoint::TrimHorizon,
    );
    child.parent_shard_ids = vec![gone.clone()];
    store.create(&child).await?;

    let mut w = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &[])?;
    let want: BTreeSet<String> = records.iter().map(|(_, d)| d.clone()).collect();
    wait_until(
        "the child shard's records to be delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(delivered_set([w.events()?.as_slice()]).is_superset(&want)),
    )
    .await
    .map_err(|e| e.context(w.log_tail()))?;
    let row = store.get(&gone).await?;
    assert!(
        row.as_ref().is_none_or(Lease::is_finished),
        "the vanished shard's row ends (or is cleaned up): {row:?}"
    );
    w.terminate()?;
    assert!(w.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}
