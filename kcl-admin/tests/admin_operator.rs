//! `kcl-admin` against the emulators, on rows the test writes itself (issue 34): `release` of
//! a worker the table does not know is refused naming the known ones, `reset` prints the
//! checkpoint it replaced, and `remove-kcl-rows` deletes nothing of a fleet whose failover
//! time is 30 s (its rows renewed every 15 s); `leases` and `reset` on a multi-stream table's
//! keys, `leases`' MOVING under heartbeats (a worker process with `--liveness heartbeat`), and
//! kcl-aws's warnings in kcl-admin's output.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::{admin, admin_with};
use kcl_core::multi_stream::StreamId;
use kcl_core::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseStore, SequenceNumber, ShardId, WorkerId,
};
use kcl_integration_tests::process::{WorkerProcess, test_worker_bin};
use kcl_integration_tests::{Context, wait_until, with_timeout};

const SHARD: &str = "shardId-000000000000";
const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

async fn held(ctx: &Context, key: &str, owner: &str, checkpoint: Checkpoint) -> anyhow::Result<()> {
    let store = ctx.store();
    store
        .ensure_table(kcl_core::lease::TableFeatures::default())
        .await?;
    store
        .create(&Lease::new(ShardId::new(key), checkpoint))
        .await?;
    let row = store.get(&ShardId::new(key)).await?.expect("created");
    store.take(&row, &WorkerId::new(owner)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_an_unknown_worker_is_refused_naming_the_known_ones() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-release-unknown").await? else {
        return Ok(());
    };
    held(
        &ctx,
        "shardId-000000000000",
        "worker-a",
        Checkpoint::TrimHorizon,
    )
    .await?;
    held(
        &ctx,
        "shardId-000000000001",
        "worker-b",
        Checkpoint::TrimHorizon,
    )
    .await?;
    let out = admin(
        &ctx,
        &[
            "release",
            "--application-name",
            &ctx.table,
            "--worker",
            "worker-c",
            "--timeout",
            "2s",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        !out.status.success(),
        "release of an unknown worker succeeded"
    );
    anyhow::ensure!(
        stderr.contains("worker-a") && stderr.contains("worker-b"),
        "the known workers are not named: {stderr}"
    );
    let rows = ctx.store().list().await?;
    anyhow::ensure!(
        rows.iter().all(|l| !l.key.as_str().contains("worker-c")),
        "a drain row was written: {rows:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prints_the_checkpoint_it_replaced() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-reset-prints").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    // A record of the stream's own: a checkpoint of another stream's is refused.
    let (_, recorded) = ctx.put_one("pk", "a record").await?;
    let seq = Checkpoint::Sequence(ExtendedSequenceNumber::new(
        SequenceNumber::parse(recorded.clone()).unwrap(),
    ));
    held(&ctx, SHARD, "worker-a", seq).await?;
    let reset = [
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
        "1s",
    ];
    let out = admin(&ctx, &[&reset[..], &["--dry-run"]].concat())?;
    anyhow::ensure!(out.status.success(), "reset --dry-run failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        stdout.contains(&recorded),
        "--dry-run does not show the checkpoint: {stdout}"
    );
    let out = admin(&ctx, &reset)?;
    anyhow::ensure!(out.status.success(), "reset failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        stdout.contains(&recorded),
        "reset does not show what it replaced: {stdout}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_kcl_rows_deletes_nothing_of_a_fleet_with_a_30s_failover_time() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("admin-remove-30s").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(remove_run(ctx))).await
}

async fn remove_run(ctx: Context) -> anyhow::Result<()> {
    // The leader's row of a fleet with a 30 s failover time: renewed every 15 s.
    let key = format!("{}worker-leader", kcl_core::singleton::COORDINATION_PREFIX);
    held(&ctx, &key, "worker-a", Checkpoint::TrimHorizon).await?;
    let store = ctx.store();
    let renewer = {
        let key = ShardId::new(key.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(15)).await;
                let Ok(Some(row)) = store.get(&key).await else {
                    continue;
                };
                let _ = store.renew(&row).await;
            }
        })
    };
    let out = admin(
        &ctx,
        &[
            "remove-kcl-rows",
            "--application-name",
            &ctx.table,
            "--failover-time",
            "30s",
        ],
    );
    renewer.abort();
    let out = out?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "removed the rows of a running fleet");
    anyhow::ensure!(stderr.contains("still running"), "{stderr}");
    let left = ctx.store().get(&ShardId::new(key)).await?;
    anyhow::ensure!(left.is_some(), "the leader's row was deleted");
    Ok(())
}

/// Issue 34, item 6: a multi-stream table's lease (`account:stream:creationEpoch:shardId`) is
/// shown against its stream's shard by `leases`, and `reset --shard` takes it, by its full
/// key or by the shard id of the stream named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_reset_take_multi_stream_lease_keys() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-multi-stream").await? else {
        return Ok(());
    };
    ctx.create_stream(1).await?;
    let id = StreamId::new("000000000000", ctx.stream.clone(), 1_700_000_000);
    let key = id.lease_key(&ShardId::new(SHARD));
    let seq = Checkpoint::Sequence(ExtendedSequenceNumber::new(
        SequenceNumber::parse(SEQ.to_owned()).unwrap(),
    ));
    held(&ctx, key.as_str(), "worker-a", seq).await?;
    // A lease of another stream of the same table: not the named stream's, not "gone".
    let other = StreamId::new("000000000000", "another-stream", 1_700_000_000);
    let other_key = other.lease_key(&ShardId::new(SHARD));
    held(
        &ctx,
        other_key.as_str(),
        "worker-a",
        Checkpoint::TrimHorizon,
    )
    .await?;

    let out = admin(
        &ctx,
        &[
            "leases",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--observe",
            "0s",
            "--json",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let shards = doc["shards"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(
        shards.len() == 2,
        "want the stream's shard on its lease's line and the other stream's lease: {doc}"
    );
    let line = shards
        .iter()
        .find(|s| s["shard"] == key.as_str())
        .ok_or_else(|| anyhow::anyhow!("no line for {key}: {doc}"))?;
    anyhow::ensure!(line["leased"] == true && line["stream"] == "open", "{line}");
    anyhow::ensure!(
        line["stream_id"] == id.to_string().as_str() && line["shard_id"] == SHARD,
        "{line}"
    );
    let other_line = shards
        .iter()
        .find(|s| s["shard"] == other_key.as_str())
        .ok_or_else(|| anyhow::anyhow!("no line for {other_key}: {doc}"))?;
    anyhow::ensure!(
        other_line["stream"].is_null() || other_line["stream"] == "-",
        "{other_line}"
    );

    let reset = |shard: &str| {
        admin(
            &ctx,
            &[
                "reset",
                "--application-name",
                &ctx.table,
                "--stream",
                &ctx.stream,
                "--shard",
                shard,
                "--to",
                "TRIM_HORIZON",
                "--failover-time",
                "1s",
            ],
        )
    };
    let out = reset(key.as_str())?;
    anyhow::ensure!(out.status.success(), "reset by the full lease key failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(stdout.contains(SEQ), "{stdout}");
    let row = ctx.store().get(&key).await?.expect("the lease");
    anyhow::ensure!(row.checkpoint == Checkpoint::TrimHorizon, "{row:?}");

    // By the shard id of the stream named: the same lease.
    let out = reset(SHARD)?;
    anyhow::ensure!(out.status.success(), "reset by shard id failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(stdout.contains(key.as_str()), "{stdout}");
    let row = ctx.store().get(&ShardId::new(SHARD)).await?;
    anyhow::ensure!(row.is_none(), "a single-stream lease was made: {row:?}");

    // Another stream's lease, with this stream named: refused.
    let out = reset(other_key.as_str())?;
    anyhow::ensure!(!out.status.success(), "another stream's lease was reset");

    // --all: this stream's leases only (it once reset every stream's of the table).
    let out = admin(
        &ctx,
        &[
            "reset",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--all",
            "--to",
            "LATEST",
            "--failover-time",
            "1s",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "reset --all failed");
    let row = ctx.store().get(&key).await?.expect("the lease");
    anyhow::ensure!(row.checkpoint == Checkpoint::Latest, "{row:?}");
    let other_row = ctx.store().get(&other_key).await?.expect("the other lease");
    anyhow::ensure!(
        other_row.checkpoint == Checkpoint::TrimHorizon,
        "another stream's lease was reset by --all: {other_row:?}"
    );

    // A sequence number the shard does not have is refused before anything is written.
    ctx.put(&[("pk".to_owned(), "a record".to_owned())]).await?;
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
            "123",
            "--failover-time",
            "1s",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "a reset to a record the shard lacks");
    anyhow::ensure!(stderr.contains("has no such record"), "{stderr}");
    let row = ctx.store().get(&key).await?.expect("the lease");
    anyhow::ensure!(row.checkpoint == Checkpoint::Latest, "written: {row:?}");
    Ok(())
}

/// Issue 34, item 6: under heartbeats a worker renews its heartbeat row, not its leases:
/// `leases` shows its lease moving by its heartbeat (`yes (heartbeat)`), not standing still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_shows_a_heartbeat_workers_lease_moving() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-moving-heartbeat").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(moving_run(ctx))).await
}

async fn moving_run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let bin = test_worker_bin()?;
    let extra = ["--liveness", "heartbeat", "--failover-ms", "3000"];
    let worker = WorkerProcess::spawn(bin.to_str().unwrap(), &ctx, "worker-a", &extra)?;
    wait_until(
        "worker-a holds the shard",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            // The worker makes the table: not there at first.
            let owners = ctx.owners().await.unwrap_or_default();
            Ok(owners.get(SHARD).and_then(Option::as_deref) == Some("worker-a"))
        },
    )
    .await?;
    let out = admin(
        &ctx,
        &[
            "leases",
            "--application-name",
            &ctx.table,
            "--stream",
            &ctx.stream,
            "--observe",
            "4s",
        ],
    );
    worker.terminate()?;
    let out = out?;
    anyhow::ensure!(out.status.success(), "leases failed");
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table
        .lines()
        .find(|l| l.starts_with(SHARD))
        .ok_or_else(|| anyhow::anyhow!("no line for {SHARD}:\n{table}"))?;
    anyhow::ensure!(
        line.contains("worker-a") && line.contains("yes (heartbeat)"),
        "the heartbeat worker's lease is not shown moving:\n{table}"
    );
    Ok(())
}

/// Issue 34, item 6: kcl-aws's warnings reach kcl-admin's output: `leases` on a disabled
/// DynamoDB stream says it is disabled (kcl-aws warns, and reads on). moto cannot describe a
/// disabled stream (it answers 500), so the DynamoDB Streams endpoint is a stub answering
/// `DescribeStream` with a disabled stream of no shards; the lease table is the emulator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcl_aws_warnings_show_in_kcl_admin_output() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-warnings").await? else {
        return Ok(());
    };
    ctx.store()
        .ensure_table(kcl_core::lease::TableFeatures::default())
        .await?;
    let arn = format!(
        "arn:aws:dynamodb:us-east-1:123456789012:table/{}-orders/stream/2026-01-01T00:00:00.000",
        ctx.table
    );
    let endpoint = disabled_stream_stub(arn.clone()).await?;
    let out = tokio::task::spawn_blocking(move || {
        admin_with(
            &ctx,
            &[
                "leases",
                "--application-name",
                &ctx.table,
                "--source",
                "dynamodb-streams",
                "--stream",
                &arn,
                "--observe",
                "0s",
            ],
            &[("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", &endpoint)],
        )
    })
    .await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "leases failed: {stderr}");
    anyhow::ensure!(
        stderr.contains("the stream is disabled"),
        "kcl-aws's warning is not in kcl-admin's output: {stderr}"
    );
    Ok(())
}

/// A DynamoDB Streams endpoint whose every answer is a `DescribeStream` of `arn`, disabled,
/// with no shards. Returns its URL.
async fn disabled_stream_stub(arn: String) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let body = serde_json::json!({
        "StreamDescription": {
            "StreamArn": arn,
            "StreamLabel": "2026-01-01T00:00:00.000",
            "StreamStatus": "DISABLED",
            "StreamViewType": "NEW_IMAGE",
            "TableName": "orders",
            "Shards": [],
        }
    })
    .to_string();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut socket = BufReader::new(socket);
                loop {
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut request = vec![0; length];
                    if socket.read_exact(&mut request).await.is_err() {
                        return;
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n\
                         content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(url)
}

/// Issue 34, item 5: `release` onto a worker started with `--max-leases 1` leaves it within
/// its cap. worker-a holds the stream's four shards, worker-b (capped at one) and worker-c
/// join and the leader balances; `release --worker worker-a` asks the least loaded worker
/// first (worker-b, by name among equals), which gives back what it has no room for, and
/// worker-a's leases end with worker-c. worker-b's journal shows it never processed two
/// shards at once; the table, once settled, names it on one lease at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_onto_a_capped_worker_leaves_it_within_its_cap() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-release-capped").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(capped_run(ctx))).await
}

/// How many leases `owners` names `worker` on.
fn count(owners: &std::collections::BTreeMap<String, Option<String>>, worker: &str) -> usize {
    owners
        .values()
        .filter(|o| o.as_deref() == Some(worker))
        .count()
}

/// A 4-shard stream read by worker-a alone, then by worker-b too, started with
/// `--max-leases 1`, once it holds its one shard.
async fn a_and_capped_b(ctx: &Context) -> anyhow::Result<(WorkerProcess, WorkerProcess)> {
    ctx.create_stream(4).await?;
    let bin = test_worker_bin()?;
    let bin = bin.to_str().unwrap();
    let a = WorkerProcess::spawn(bin, ctx, "worker-a", &[])?;
    wait_until(
        "worker-a holds all four shards",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(count(&ctx.owners().await.unwrap_or_default(), "worker-a") == 4),
    )
    .await?;
    let b = WorkerProcess::spawn(bin, ctx, "worker-b", &["--max-leases", "1"])?;
    wait_until(
        "worker-b holds one shard",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(count(&ctx.owners().await?, "worker-b") == 1),
    )
    .await?;
    Ok((a, b))
}

async fn capped_run(ctx: Context) -> anyhow::Result<()> {
    let (a, b) = a_and_capped_b(&ctx).await?;
    let bin = test_worker_bin()?;
    let c = WorkerProcess::spawn(bin.to_str().unwrap(), &ctx, "worker-c", &[])?;
    wait_until(
        "worker-c holds a shard",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(count(&ctx.owners().await?, "worker-c") >= 1),
    )
    .await?;
    let out = admin(
        &ctx,
        &[
            "release",
            "--application-name",
            &ctx.table,
            "--worker",
            "worker-a",
            "--timeout",
            "60s",
            "--failover-time",
            "3s",
        ],
    )?;
    anyhow::ensure!(out.status.success(), "release failed");
    // Settled: every shard with worker-b (one at most) or worker-c, still so after worker-b
    // has read which leases name it twice (every failover time / 2, 1.5 s).
    let settled = async || -> anyhow::Result<bool> {
        let owners = ctx.owners().await?;
        let (b, c) = (count(&owners, "worker-b"), count(&owners, "worker-c"));
        Ok(b <= 1 && b + c == 4)
    };
    wait_until(
        "worker-a's leases settle on worker-b and worker-c",
        Duration::from_secs(60),
        Duration::from_millis(250),
        settled,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let owners = ctx.owners().await?;
    let still = settled().await?;
    let journal = b.events()?;
    for w in [a, b, c] {
        w.terminate()?;
    }
    anyhow::ensure!(still, "not settled: {owners:?}");
    let (mut now, mut most) = (0_i64, 0_i64);
    for e in &journal {
        match e.event.as_str() {
            "init" => now += 1,
            "shard_end" | "shutdown_checkpoint" | "lease_lost" => now -= 1,
            _ => {}
        }
        most = most.max(now);
    }
    anyhow::ensure!(most <= 1, "worker-b processed {most} shards at once");
    Ok(())
}

/// Issue 34, item 5 (found from outside): draining the only worker with room onto a worker at
/// its `--max-leases` left three shards with nobody, and `release` said all was well; then
/// draining that worker handed its shard to the drained one. Now the first fails, naming the
/// shards nobody holds, and the second is refused, naming the drained worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_says_when_nobody_has_room() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-release-no-room").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(no_room_run(ctx))).await
}

async fn no_room_run(ctx: Context) -> anyhow::Result<()> {
    let (a, b) = a_and_capped_b(&ctx).await?;
    let release = |worker: &str| {
        admin(
            &ctx,
            &[
                "release",
                "--application-name",
                &ctx.table,
                "--worker",
                worker,
                "--timeout",
                "10s",
                "--failover-time",
                "3s",
            ],
        )
    };
    let out = release("worker-a")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let drained_a = !out.status.success() && stderr.contains("nobody holds");
    let out = release("worker-b")?;
    let stderr_b = String::from_utf8_lossy(&out.stderr).into_owned();
    let owners = ctx.owners().await?;
    a.terminate()?;
    b.terminate()?;
    anyhow::ensure!(
        drained_a,
        "release onto a full fleet did not fail: {stderr}"
    );
    anyhow::ensure!(
        !out.status.success(),
        "release onto a drained worker succeeded"
    );
    anyhow::ensure!(
        stderr_b.contains("worker-a drained already"),
        "the drained worker is not named: {stderr_b}"
    );
    anyhow::ensure!(count(&owners, "worker-b") <= 1, "{owners:?}");
    Ok(())
}

/// Issue 34, item 6 (found from outside): `remove-kcl-rows --failover-time 0s` watched for a
/// second and deleted a running fleet's rows. The watch is never shorter than kcl's default
/// failover time: a worker with the default timing (rows renewed every 5 s) is seen running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_kcl_rows_with_a_zero_failover_time_deletes_nothing_of_a_live_fleet()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-remove-zero").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(remove_zero_run(ctx))).await
}

async fn remove_zero_run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let bin = test_worker_bin()?;
    let worker = WorkerProcess::spawn(
        bin.to_str().unwrap(),
        &ctx,
        "worker-a",
        &["--failover-ms", "10000"],
    )?;
    wait_until(
        "worker-a holds the shard",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(count(&ctx.owners().await.unwrap_or_default(), "worker-a") == 1),
    )
    .await?;
    let out = admin(
        &ctx,
        &[
            "remove-kcl-rows",
            "--application-name",
            &ctx.table,
            "--failover-time",
            "0s",
        ],
    );
    let rows = ctx.store().list().await;
    worker.terminate()?;
    let out = out?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(!out.status.success(), "removed the rows of a running fleet");
    anyhow::ensure!(stderr.contains("still running"), "{stderr}");
    let leader = format!("{}worker-leader", kcl_core::singleton::COORDINATION_PREFIX);
    anyhow::ensure!(
        rows?.iter().any(|l| l.key.as_str() == leader),
        "the leader's row was deleted"
    );
    Ok(())
}
