//! `kcl-admin` against the emulators while two worker processes consume: `leases` shows every
//! shard, `reset` replays a shard from TRIM_HORIZON and no worker goes on from the old
//! checkpoint after it returns, `release` drains a worker, `copy` carries checkpoints to a
//! new table, and
//! `remove-kcl-rows` refuses while the fleet runs and removes kcl's rows once it stopped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::admin;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::process::test_worker_bin;
use kcl_integration_tests::{Context, Event, Producer, balanced_pair, wait_until, with_timeout};

const SHARD: &str = "shardId-000000000000";

fn ms_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_while_two_workers_run_replays_and_nothing_goes_on_from_the_old_checkpoint()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let producer = Producer::start(&ctx, "r", 4, Duration::from_millis(200));
    let bin = test_worker_bin()?;
    let extra = ["--liveness", "per-lease", "--failover-ms", "3000"];
    let (mut a, mut b, _) = balanced_pair(bin.to_str().unwrap(), &ctx, 2, 10, &extra).await?;

    // `leases`: both shards, their owners, open, caught up or close to it.
    let leases = [
        "leases",
        "--application-name",
        &ctx.table,
        "--stream",
        &ctx.stream,
    ];
    let out = admin(&ctx, &[&leases[..], &["--observe", "2s"]].concat())?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let table = String::from_utf8(out.stdout)?;
    let owners = ["worker-a", "worker-b", "open"];
    for needle in ["SHARD", SHARD, "shardId-000000000001"]
        .iter()
        .chain(&owners)
    {
        anyhow::ensure!(table.contains(needle), "`{needle}` missing from:\n{table}");
    }
    let out = admin(
        &ctx,
        &[&leases[..], &["--observe", "0s", "--json"]].concat(),
    )?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    anyhow::ensure!(doc["shards"].as_array().map(Vec::len) == Some(2), "{doc}");

    // A checkpoint well past the start, then the reset.
    let journals = |a: &kcl_integration_tests::WorkerProcess,
                    b: &kcl_integration_tests::WorkerProcess|
     -> anyhow::Result<Vec<Event>> {
        let mut all = a.events()?;
        all.extend(b.events()?);
        Ok(all)
    };
    wait_until(
        "20 records of the shard delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let n = journals(&a, &b)?
                .iter()
                .filter(|e| e.event == "record" && e.shard.as_deref() == Some(SHARD))
                .count();
            Ok(n >= 20)
        },
    )
    .await?;
    let first = ctx
        .read_shard(SHARD)
        .await?
        .first()
        .map(|(seq, _)| seq.clone())
        .expect("records");
    let started_ms = ms_now();
    let out = admin(
        &ctx,
        &[
            "reset",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--shard",
            SHARD,
            "--to",
            "TRIM_HORIZON",
            "--failover-time",
            "3s",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "reset failed");
    let returned_ms = ms_now();

    wait_until(
        "the shard's first record delivered again",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            Ok(journals(&a, &b)?.iter().any(|e| {
                e.event == "record"
                    && e.shard.as_deref() == Some(SHARD)
                    && e.ms >= started_ms
                    && e.seq.as_deref() == Some(&first)
            }))
        },
    )
    .await?;
    // Every delivery of the shard after the command returned belongs to a processor started
    // after the reset began (its `init` line), from TRIM_HORIZON.
    for worker in [&a, &b] {
        let events = worker.events()?;
        let mut init: Option<&Event> = None;
        for e in events.iter().filter(|e| e.shard.as_deref() == Some(SHARD)) {
            if e.event == "init" {
                init = Some(e);
            }
            if e.event == "record" && e.ms > returned_ms {
                let tenure = init.expect("a record after an init");
                anyhow::ensure!(
                    tenure.ms >= started_ms
                        && tenure.checkpoint.as_deref() == Some(Checkpoint::TRIM_HORIZON),
                    "{} delivered {:?} after the reset returned from a processor started at {} from {:?}",
                    e.worker,
                    e.seq,
                    tenure.ms,
                    tenure.checkpoint
                );
            }
        }
    }

    // release: worker-a hands its shard to worker-b and takes nothing back while it runs.
    let release = [
        "release",
        "--application-name",
        &ctx.table,
        "--worker",
        "worker-a",
    ];
    let out = admin(&ctx, &release)?;
    anyhow::ensure!(out.status.success(), "release failed");
    let held_by_b = async || {
        let owners = ctx.owners().await?;
        anyhow::Ok(owners.values().all(|o| o.as_deref() == Some("worker-b")))
    };
    anyhow::ensure!(held_by_b().await?, "{:?}", ctx.owners().await?);
    tokio::time::sleep(Duration::from_secs(6)).await; // two failover times
    anyhow::ensure!(held_by_b().await?, "given back: {:?}", ctx.owners().await?);

    // copy: the checkpoints, unowned, in a new table; the fleet runs, so only with --force
    // (a snapshot; admin_fleet_guard.rs sees it refused without).
    let renamed = format!("{}-renamed", ctx.table);
    let out = admin(
        &ctx,
        &[
            "copy",
            "--from-application",
            &ctx.table,
            "--to-application",
            &renamed,
            "--force",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "copy failed");
    let rows = |store: kcl_aws::DynamoDbLeaseStore| async move {
        let leases = store.list().await?;
        let shards = leases.into_iter().filter(|l| !is_coordination_key(&l.key));
        anyhow::Ok(
            shards
                .map(|l| (l.key.to_string(), l))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let copied = rows(kcl_aws::DynamoDbLeaseStore::from_client(
        ctx.dynamodb.clone(),
        renamed,
    ))
    .await?;
    let source = rows(ctx.store()).await?;
    anyhow::ensure!(copied.keys().eq(source.keys()), "{copied:?}");
    for (key, row) in &copied {
        // The fleet goes on checkpointing: the copy is at or behind the source.
        let behind = row.checkpoint.progress_cmp(&source[key].checkpoint);
        anyhow::ensure!(
            row.owner.is_none() && behind.is_some_and(std::cmp::Ordering::is_le),
            "{key}: copied {row:?}, source {:?}",
            source[key]
        );
    }

    // remove-kcl-rows: refused while the fleet runs; done once it stopped.
    let remove = [
        "remove-kcl-rows",
        "--application-name",
        &ctx.table,
        "--failover-time",
        "3s",
    ];
    let out = admin(&ctx, &remove)?;
    anyhow::ensure!(
        !out.status.success(),
        "removing kcl's rows while the fleet runs must fail"
    );
    anyhow::ensure!(String::from_utf8_lossy(&out.stderr).contains("still running"));
    producer.stop().await?;
    for w in [&mut a, &mut b] {
        w.terminate()?;
        anyhow::ensure!(w.wait_exit(Duration::from_secs(30)).await?.success());
    }
    let out = admin(&ctx, &remove)?;
    anyhow::ensure!(out.status.success(), "remove-kcl-rows failed");
    let left = ctx.store().list().await?;
    anyhow::ensure!(
        left.iter().all(|l| !is_coordination_key(&l.key)) && left.len() == 2,
        "{left:?}"
    );
    Ok(())
}
