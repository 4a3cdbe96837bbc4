//! Enhanced fan-out on the emulator, beyond the fleet tests that `scripts/test` also runs with
//! `KCL_TEST_RETRIEVAL=fan-out` (kill, graceful shutdown, balance, KPL, LATEST, the KCL Java
//! table): a subscription that the emulator ends after its 5 minutes, as Kinesis does, is
//! renewed after its continuation sequence number — records keep flowing, none is lost and
//! none delivered twice. kinesis-mock's lifetime is fixed at 5 minutes, so this test takes
//! that long (it runs beside the other tests of this binary).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use kcl_integration_tests::journal::delivered;
use kcl_integration_tests::{Context, Producer, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
/// kinesis-mock ends every subscription after 5 minutes.
const LIFETIME: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_subscription_loses_and_repeats_nothing() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("fan-out-renewal").await? else {
        return Ok(());
    };
    with_timeout(LIFETIME + Duration::from_secs(150), renewal(ctx)).await
}

async fn renewal(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let worker = WorkerProcess::spawn(
        WORKER,
        &ctx,
        "worker-a",
        &["--retrieval", "fan-out", "--failover-ms", "10000"],
    )?;
    let producer = Producer::start(&ctx, "r", 2, Duration::from_millis(500));
    // Both shards' first subscriptions end, and each is renewed.
    wait_until(
        "both subscriptions to be renewed",
        LIFETIME + Duration::from_secs(60),
        Duration::from_secs(1),
        async || {
            Ok(std::fs::read_to_string(&worker.log)?
                .matches("subscription ended; renewing it")
                .count()
                >= 2)
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    // Records keep flowing after the renewal.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let want = producer.stop().await?;
    wait_until(
        "every record delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || Ok(delivered(&worker.events()?).len() >= want.len()),
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    let events = worker.events()?;
    let got = delivered(&events);
    let mut times: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &got {
        *times.entry(d.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let missing: Vec<_> = want
        .iter()
        .filter(|d| !times.contains_key(d.as_str()))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    // In order per partition key (the producer numbers records in write order).
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event == "record") {
        let n: u64 = e.data.as_deref().unwrap()[1..].parse()?;
        let key = e.pk.clone().unwrap();
        if let Some(&before) = last.get(&key) {
            assert!(n > before, "{key}: r{n} after r{before}");
        }
        last.insert(key, n);
    }
    eprintln!(
        "{} records over a renewal of both subscriptions",
        want.len()
    );
    worker.terminate()?;
    Ok(())
}
