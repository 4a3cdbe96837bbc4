//! Two worker processes share 8 shards 4/4 within two taker cycles of the second one
//! starting, and stay balanced; a capped worker settles without churn. Each with the leases
//! in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::{Context, balanced_pair, count_by_owner, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const TAKER: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_split_eight_shards_evenly() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("balance").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), run(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_split_eight_shards_evenly_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("balance-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(8).await?;
    let records: Vec<(String, String)> = (0..80)
        .map(|i| (format!("pk-{i}"), format!("b{i}")))
        .collect();
    ctx.put(&records).await?;
    // worker-b starts once worker-a is idle: checkpoints move lease counters, and a handoff
    // request is conditional on the counter it observed.
    let (mut a, mut b, took) = balanced_pair(
        WORKER,
        &ctx,
        8,
        80,
        &[
            "--taker-ms",
            "1000",
            "--max-steal",
            "4",
            "--failover-ms",
            "10000",
        ],
    )
    .await?;
    eprintln!("4/4 split {took:?} after worker-b started");
    // Two taker cycles, plus the time the old owner's processors take to checkpoint and hand
    // over (a few emulator calls) and worker-b's start-up. Under a leader, an owner that is
    // not the leader learns of a request at its next renewal: a third of the failover time.
    let renewal = if kcl_integration_tests::process::coordination() == "leader" {
        Duration::from_millis(10_000 / 3)
    } else {
        Duration::ZERO
    };
    let bound = 2 * TAKER + Duration::from_millis(1500) + renewal;
    assert!(took <= bound, "split took {took:?}, more than {bound:?}");

    // Stable: nobody steals back and forth.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let by = count_by_owner(&ctx.owners().await?);
        assert_eq!(by.get(&Some("worker-a".into())), Some(&4), "{by:?}");
        assert_eq!(by.get(&Some("worker-b".into())), Some(&4), "{by:?}");
    }

    // And every record was delivered by one or the other.
    let want: Vec<String> = records.iter().map(|(_, d)| d.clone()).collect();
    wait_until(
        "all records delivered",
        Duration::from_secs(30),
        Duration::from_millis(250),
        async || {
            let got = delivered_set([a.events()?.as_slice(), b.events()?.as_slice()]);
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await?;
    a.terminate()?;
    b.terminate()?;
    assert!(a.wait_exit(Duration::from_secs(20)).await?.success());
    assert!(b.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}

/// A worker started with `--max-leases 1` beside one without a cap, on 4 shards: the fleet
/// settles at 3 and 1 and stays there. The leader once balanced towards 2 and 2 every cycle:
/// it handed the capped worker a lease, which gave it back, which the leader took again, a
/// new processor each way every second (issue 34). Judged from the workers' journals: ten
/// seconds in a row without a processor starting, soon after worker-b holds its one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_worker_settles_without_churn() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("balance-capped").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), capped(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_worker_settles_without_churn_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("balance-capped-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), capped(ctx)).await
}

async fn capped(ctx: Context) -> anyhow::Result<()> {
    use kcl_integration_tests::process::WorkerProcess;
    ctx.create_stream(4).await?;
    let a = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &[])?;
    let held = |owners: &std::collections::BTreeMap<String, Option<String>>, w: &str| {
        owners.values().filter(|o| o.as_deref() == Some(w)).count()
    };
    wait_until(
        "worker-a holds the four shards",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(held(&ctx.owners().await.unwrap_or_default(), "worker-a") == 4),
    )
    .await?;
    let b = WorkerProcess::spawn(WORKER, &ctx, "worker-b", &["--max-leases", "1"])?;
    wait_until(
        "worker-b holds one shard",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(held(&ctx.owners().await?, "worker-b") == 1),
    )
    .await?;
    // The leader may try worker-b once more and learn its cap from the refusal (under
    // heartbeats a follower reads its leases only when flagged, a few seconds later); then
    // nothing moves. Wanted: 10 s in a row with no processor started, within 45 s (the churn
    // started 9 in every 10 s).
    let starts = |w: &WorkerProcess| -> anyhow::Result<usize> {
        Ok(w.events()?.iter().filter(|e| e.event == "init").count())
    };
    let began = std::time::Instant::now();
    let (mut quiet_since, mut last) = (began, (starts(&a)?, starts(&b)?));
    while quiet_since.elapsed() < Duration::from_secs(10) {
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(45),
            "churn: never 10 s without a processor starting ({} and {} started so far)",
            last.0,
            last.1
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = (starts(&a)?, starts(&b)?);
        if now != last {
            (quiet_since, last) = (std::time::Instant::now(), now);
        }
    }
    eprintln!(
        "quiet for 10 s after {:?}: processors started by worker-a {}, worker-b {}",
        began.elapsed() - Duration::from_secs(10),
        last.0,
        last.1
    );
    let owners = ctx.owners().await?;
    a.terminate()?;
    b.terminate()?;
    anyhow::ensure!(
        held(&owners, "worker-a") == 3 && held(&owners, "worker-b") == 1,
        "{owners:?}"
    );
    Ok(())
}
