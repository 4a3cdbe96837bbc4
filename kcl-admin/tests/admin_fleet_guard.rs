//! Issue 50, items 1 and 3b: `remove-kcl-rows` and `copy` tell a running fleet from a stopped
//! one whatever mode it runs in, by watching every row of the table. Against the emulators,
//! with worker processes: a fleet in leader mode (its roles carried by its shard leases, so
//! the leader's and standby's rows stand still: the command once deleted them and said
//! done), in every-worker mode, and under heartbeats; `remove-kcl-rows` deletes nothing and
//! fails while each runs, and removes kcl's rows once the fleet stopped. `copy` refuses a
//! running fleet's table unless `--force`, and copies a stopped one's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::admin;
use kcl_core::singleton::{COORDINATION_PREFIX, is_coordination_key};
use kcl_core::{LeaseStore, ShardId};
use kcl_integration_tests::process::{WorkerProcess, test_worker_bin};
use kcl_integration_tests::{Context, wait_until, with_timeout};

/// The modes a fleet runs in: coordination, liveness.
const MODES: [(&str, &str); 3] = [
    ("leader", "per-lease"),
    ("every-worker", "per-lease"),
    ("leader", "heartbeat"),
];

/// A worker in `mode` with a 3 s failover time, once it holds both shards of the stream.
async fn fleet(
    ctx: &Context,
    id: &str,
    (mode, liveness): (&str, &str),
) -> anyhow::Result<WorkerProcess> {
    let bin = test_worker_bin()?;
    let extra = ["--liveness", liveness, "--failover-ms", "3000"];
    let worker = WorkerProcess::spawn_in(mode, bin.to_str().unwrap(), ctx, id, &extra)?;
    wait_until(
        &format!("{id} ({mode}, {liveness}) holds both shards"),
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            Ok(owners.len() == 2 && owners.values().all(|o| o.as_deref() == Some(id)))
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    // Settled: the leader's row, carried by a row the worker renews anyway, stands still
    // (written only when its carrier changes), as in any fleet past its start.
    wait_until(
        "the leader's row stands still",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let leader = || async {
                let key = ShardId::new(format!("{COORDINATION_PREFIX}worker-leader"));
                anyhow::Ok(ctx.store().get(&key).await?.map(|l| l.counter))
            };
            let before = leader().await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(leader().await? == before)
        },
    )
    .await?;
    Ok(worker)
}

async fn coordination_keys(ctx: &Context) -> anyhow::Result<BTreeSet<String>> {
    Ok(ctx
        .store()
        .list()
        .await?
        .into_iter()
        .filter(|l| is_coordination_key(&l.key))
        .map(|l| l.key.to_string())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_kcl_rows_refuses_a_running_fleet_in_every_mode() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-remove-modes").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), Box::pin(remove_run(ctx))).await
}

async fn remove_run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let remove = [
        "remove-kcl-rows",
        "--application-name",
        &ctx.table,
        "--failover-time",
        "3s",
    ];
    for (n, mode) in MODES.into_iter().enumerate() {
        let mut worker = fleet(&ctx, &format!("worker-{n}"), mode).await?;
        let before = coordination_keys(&ctx).await?;
        let out = admin(&ctx, &remove)?;
        let after = coordination_keys(&ctx).await?;
        worker.terminate()?;
        worker.wait_exit(Duration::from_secs(30)).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success(),
            "{mode:?}: removed the rows of a running fleet"
        );
        anyhow::ensure!(
            stderr.contains("still running") && stderr.contains("stop every worker"),
            "{mode:?}: the refusal does not name what moved: {stderr}"
        );
        anyhow::ensure!(
            before.is_subset(&after),
            "{mode:?}: rows deleted: {:?}",
            before.difference(&after).collect::<Vec<_>>()
        );
    }
    // Every worker stopped: kcl's rows go, the leases stay.
    anyhow::ensure!(
        !coordination_keys(&ctx).await?.is_empty(),
        "no kcl rows to remove"
    );
    let out = admin(&ctx, &remove)?;
    anyhow::ensure!(
        out.status.success(),
        "remove-kcl-rows of a stopped fleet failed"
    );
    let left = ctx.store().list().await?;
    anyhow::ensure!(
        left.iter().all(|l| !is_coordination_key(&l.key)) && left.len() == 2,
        "{left:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_refuses_a_running_fleet_unless_forced() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-copy-running").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(copy_run(ctx))).await
}

async fn copy_run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let mut worker = fleet(&ctx, "worker-a", MODES[0]).await?;
    let copy = |to: &str, extra: &[&str]| {
        let args = [
            "copy",
            "--from-application",
            &ctx.table,
            "--to-application",
            to,
        ];
        admin(&ctx, &[&args[..], extra].concat())
    };
    let renamed = format!("{}-renamed", ctx.table);
    let refused = copy(&renamed, &["--failover-time", "3s"]);
    let forced = format!("{}-forced", ctx.table);
    let forced_out = copy(&forced, &["--force"]);
    worker.terminate()?;
    worker.wait_exit(Duration::from_secs(30)).await?;
    let out = refused?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "copied a running fleet's table");
    anyhow::ensure!(
        stderr.contains("still running") && stderr.contains("--force"),
        "{stderr}"
    );
    let table = |name: &str| {
        kcl_aws::DynamoDbLeaseStore::from_client(ctx.dynamodb.clone(), name.to_owned())
    };
    let copied = table(&renamed).list().await.unwrap_or_default();
    anyhow::ensure!(copied.is_empty(), "rows copied: {copied:?}");
    anyhow::ensure!(forced_out?.status.success(), "copy --force failed");
    anyhow::ensure!(
        table(&forced).list().await?.len() == 2,
        "copy --force copied not both leases"
    );
    // The fleet stopped: copied.
    let out = copy(&renamed, &["--failover-time", "3s"])?;
    anyhow::ensure!(
        out.status.success(),
        "copy of a stopped fleet's table failed"
    );
    anyhow::ensure!(
        table(&renamed).list().await?.len() == 2,
        "not both leases copied"
    );
    Ok(())
}
