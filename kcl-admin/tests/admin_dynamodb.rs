//! `kcl-admin` on a DynamoDB table's stream (`--source dynamodb-streams`), against moto:
//! `leases` shows the shard behind its checkpoint, `reset` moves it to a sequence number of
//! the stream and refuses a shard the stream does not have.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::admin;
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::items::{self, Writer};
use kcl_integration_tests::process::test_worker_bin;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_reset_read_a_table_stream() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-ddb").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(90), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let table = format!("{}-items", ctx.table);
    items::create(&ctx, &table, true).await?;
    let mut writer = Writer::new(&ctx, &table, 3);
    writer.write_n(10).await?;
    // A worker reads the 10 changes, checkpoints, and hands its lease back at SIGTERM.
    let bin = test_worker_bin()?;
    let mut worker = WorkerProcess::spawn(
        bin.to_str().unwrap(),
        &ctx,
        "worker-a",
        &["--dynamodb-streams-table", &table, "--idle-ms", "200"],
    )?;
    let records = |w: &WorkerProcess| -> anyhow::Result<Vec<(String, String)>> {
        Ok(w.events()?
            .into_iter()
            .filter(|e| e.event == "record")
            .filter_map(|e| Some((e.shard?, e.seq?)))
            .collect())
    };
    wait_until(
        "worker-a to read the 10 changes",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(records(&worker)?.len() >= 10),
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    worker.terminate()?;
    worker.wait_exit(Duration::from_secs(20)).await?;
    let read = records(&worker)?;
    let (shard, third) = read[2].clone();
    writer.write_n(5).await?;

    let source = [
        "--application-name",
        ctx.table.as_str(),
        "--source",
        "dynamodb-streams",
        "--table",
        table.as_str(),
    ];
    let out = admin(
        &ctx,
        &[&["leases"][..], &source, &["--observe", "0s", "--json"]].concat(),
    )?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let line = doc["shards"]
        .as_array()
        .and_then(|s| s.iter().find(|l| l["shard"] == shard.as_str()))
        .expect("the stream's shard");
    assert_eq!(line["checkpoint"], read[9].1.as_str(), "{line}");
    assert_eq!(line["stream"], "open", "{line}");
    assert!(
        line["next_record_arrived"].is_string(),
        "5 changes after the checkpoint: {line}"
    );

    let reset = [
        &["reset"][..],
        &source,
        &["--failover-time", "1s", "--to", &third],
    ]
    .concat();
    let out = admin(&ctx, &[&reset[..], &["--shard", &shard]].concat())?;
    anyhow::ensure!(out.status.success(), "reset failed");
    let lease = ctx
        .store()
        .list()
        .await?
        .into_iter()
        .find(|l| l.key.as_str() == shard)
        .expect("the lease");
    assert!(
        matches!(&lease.checkpoint, Checkpoint::Sequence(s) if s.sequence.as_str() == third),
        "{:?}",
        lease.checkpoint
    );
    let out = admin(&ctx, &[&reset[..], &["--shard", "shardId-nope"]].concat())?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no such shard"));
    Ok(())
}
