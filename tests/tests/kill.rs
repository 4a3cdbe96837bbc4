//! SIGKILL one of two worker processes mid-stream (under a leader, the leader): the survivor
//! owns all 8 shards within the failover time plus one taker cycle, and together they
//! delivered every record. With the leases in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::{Duration, Instant};

use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::{
    Context, Producer, balanced_pair, count_by_owner, wait_until, with_timeout,
};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const FAILOVER: Duration = Duration::from_secs(3);
const TAKER: Duration = Duration::from_secs(1);
const LEADER_ROW: &str = "kcl-coordination/worker-leader";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivor_takes_over_and_nothing_is_lost() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kill").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivor_takes_over_and_nothing_is_lost_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("kill-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(8).await?;
    let initial: Vec<(String, String)> = (0..40)
        .map(|i| (format!("pk-{i}"), format!("init{i}")))
        .collect();
    ctx.put(&initial).await?;
    let args = [
        "--taker-ms",
        "1000",
        "--failover-ms",
        "3000",
        "--max-steal",
        "4",
    ];
    let (a, b, _) = balanced_pair(WORKER, &ctx, 8, 40, &args).await?;

    let producer = Producer::start(&ctx, "live", 8, Duration::from_millis(200));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Under a leader, the leader is killed (worker-a, the first to start, leads): the standby
    // must take over its role and its leases as fast as any survivor takes a dead worker's.
    let leader = kcl_integration_tests::process::coordination() == "leader";
    let (mut victim, mut survivor) = if leader { (a, b) } else { (b, a) };
    if leader {
        let rows = ctx.list().await?;
        let row = rows.iter().find(|l| l.key.as_str() == LEADER_ROW);
        let holder = row.and_then(|l| l.owner.as_ref()).map(|o| o.as_str());
        assert_eq!(holder, Some(victim.id.as_str()), "the leader row: {row:?}");
    }
    assert!(
        victim.events()?.iter().any(|e| e.event == "record"),
        "{} delivered nothing before the kill",
        victim.id
    );
    victim.kill()?;
    let killed = Instant::now();
    let took = wait_until(
        "the survivor to own all 8 leases",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let by = count_by_owner(&ctx.owners().await?);
            Ok(by.get(&Some(survivor.id.clone())) == Some(&8))
        },
    )
    .await
    .map_err(|e| e.context(survivor.log_tail()))?;
    eprintln!("{} owned all 8 leases {took:?} after the kill", survivor.id);
    // Failover time plus one taker cycle, plus a second for the emulators' latency.
    let bound = FAILOVER + TAKER + Duration::from_secs(1);
    assert!(
        killed.elapsed() >= took && took <= bound,
        "took {took:?} > {bound:?}"
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut want: Vec<String> = producer.stop().await?;
    want.extend(initial.into_iter().map(|(_, d)| d));
    wait_until(
        "every record delivered by one of them",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got = delivered_set([victim.events()?.as_slice(), survivor.events()?.as_slice()]);
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await
    .map_err(|e| {
        let got = delivered_set([
            victim.events().unwrap_or_default().as_slice(),
            survivor.events().unwrap_or_default().as_slice(),
        ]);
        let missing: Vec<&String> = want.iter().filter(|d| !got.contains(*d)).collect();
        e.context(format!(
            "missing {}: {missing:?}\n{}",
            missing.len(),
            survivor.log_tail()
        ))
    })?;
    survivor.terminate()?;
    assert!(survivor.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}
