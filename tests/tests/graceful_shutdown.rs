//! SIGTERM one of two worker processes: its leases are handed back and the survivor resumes
//! them within one taker cycle (no expiry wait), after the `shutdown_requested` checkpoints.
//! With the leases in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kcl_core::SequenceNumber;
use kcl_integration_tests::journal::delivered_set;
use kcl_integration_tests::{
    Context, Producer, balanced_pair, count_by_owner, wait_until, with_timeout,
};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
/// Long, so that an expiry-based takeover could not pass the bound below.
const FAILOVER: Duration = Duration::from_secs(10);
const TAKER: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_handed_back_and_resumed_after_the_shutdown_checkpoints() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("sigterm").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), run(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_handed_back_and_resumed_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("sigterm-pg").await? else {
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
        "10000",
        "--max-steal",
        "4",
    ];
    let (mut a, mut b, _) = balanced_pair(WORKER, &ctx, 8, 40, &args).await?;

    let producer = Producer::start(&ctx, "live", 8, Duration::from_millis(200));
    let held_by_b: Vec<String> = ctx
        .owners()
        .await?
        .into_iter()
        .filter(|(_, o)| o.as_deref() == Some("worker-b"))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(held_by_b.len(), 4);
    // Until worker-b delivers live records on each of its shards (under fan-out a shard
    // handed over may wait up to 5 s: one subscription per shard and consumer every 5 s).
    wait_until(
        "worker-b to deliver live records on its 4 shards",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let events = b.events()?;
            Ok(held_by_b.iter().all(|shard| {
                events.iter().any(|e| {
                    e.event == "record"
                        && e.shard.as_ref() == Some(shard)
                        && e.data.as_deref().is_some_and(|d| d.starts_with("live"))
                })
            }))
        },
    )
    .await
    .map_err(|e| e.context(b.log_tail()))?;
    b.terminate()?;
    let termed = Instant::now();
    let took = wait_until(
        "worker-a to own all 8 leases",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let by = count_by_owner(&ctx.owners().await?);
            Ok(by.get(&Some("worker-a".to_owned())) == Some(&8))
        },
    )
    .await
    .map_err(|e| e.context(format!("{}\n---\n{}", a.log_tail(), b.log_tail())))?;
    eprintln!("worker-a owned all 8 leases {took:?} after SIGTERM");
    let status = b.wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "worker-b exited with {status}");
    // worker-b's shutdown (checkpoint, release) plus one taker cycle, well below the
    // failover time an expiry would need.
    let bound = TAKER + Duration::from_millis(1500);
    assert!(
        took <= bound && termed.elapsed() >= took,
        "took {took:?} > {bound:?}"
    );
    assert!(took < FAILOVER);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut want: Vec<String> = producer.stop().await?;
    want.extend(initial.into_iter().map(|(_, d)| d));
    wait_until(
        "every record delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got = delivered_set([a.events()?.as_slice(), b.events()?.as_slice()]);
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await?;

    // worker-b's shutdown checkpoints, by shard.
    let b_events = b.events()?;
    let mut shutdown_at: BTreeMap<String, SequenceNumber> = BTreeMap::new();
    for e in b_events.iter().filter(|e| e.event == "shutdown_checkpoint") {
        if let (Some(shard), Some(seq)) = (&e.shard, e.sequence()) {
            shutdown_at.insert(shard.clone(), seq);
        }
    }
    assert_eq!(
        shutdown_at.len(),
        4,
        "a shutdown checkpoint for each of worker-b's shards: {shutdown_at:?}"
    );
    // After resuming a shard, worker-a delivers only records after that checkpoint.
    let a_events = a.events()?;
    for (shard, checkpoint) in &shutdown_at {
        assert!(held_by_b.contains(shard));
        let resumed = a_events
            .iter()
            .filter(|e| e.event == "init" && e.shard.as_ref() == Some(shard))
            .map(|e| e.n)
            .max()
            .unwrap();
        let redelivered: Vec<&str> = a_events
            .iter()
            .filter(|e| e.event == "record" && e.shard.as_ref() == Some(shard) && e.n > resumed)
            .filter(|e| e.sequence().is_some_and(|s| s <= *checkpoint))
            .filter_map(|e| e.data.as_deref())
            .collect();
        assert!(
            redelivered.is_empty(),
            "{shard}: re-delivered before its shutdown checkpoint {checkpoint}: {redelivered:?}"
        );
    }
    a.terminate()?;
    assert!(a.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}
