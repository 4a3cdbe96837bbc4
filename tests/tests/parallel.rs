//! Two worker processes under `Parallel` (10 records of a shard at once, in order per
//! partition key); one is SIGKILLed with records in flight. Nothing is lost, each key goes in
//! order within each tenure, and no record below the new owner's starting checkpoint was
//! left unfinished by the old one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kcl_core::SequenceNumber;
use kcl_integration_tests::journal::{Event, delivered_set};
use kcl_integration_tests::{
    Context, Producer, balanced_pair, count_by_owner, wait_until, with_timeout,
};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const SHARDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_parallel_worker_leaves_nothing_unfinished_below_the_next_checkpoint()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("parallel").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(i32::try_from(SHARDS)?).await?;
    let initial: Vec<(String, String)> = (0..120)
        .map(|i| (format!("pk-{}", i % 24), format!("init{i}")))
        .collect();
    ctx.put(&initial).await?;
    // Up to 200 ms a record, 1 s for one in ten, 10 at once: records are in flight whenever
    // the stream flows, and slow ones hold the watermark back while later ones finish.
    let args = [
        "--parallel",
        "10",
        "--record-delay-ms",
        "100",
        "--failover-ms",
        "3000",
        "--max-steal",
        "4",
        // Checkpoints while records run: the watermark must hold each back.
        "--ack-checkpoint-every",
        "5",
        "--ack-checkpoint-ms",
        "200",
    ];
    let (a, b, _) = balanced_pair(WORKER, &ctx, SHARDS, 20, &args).await?;
    let producer = Producer::start(&ctx, "live", 8, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = kcl_integration_tests::process::coordination() == "leader";
    let (mut victim, mut survivor) = if leader { (a, b) } else { (b, a) };
    // Killed while a slow record has run for a while: records after it finished meanwhile,
    // so a checkpoint that ignored it would have passed it.
    wait_until(
        "a record in flight for 600 ms in the victim",
        Duration::from_secs(20),
        Duration::from_millis(20),
        async || Ok(oldest_in_flight(&victim.events()?) >= 600),
    )
    .await?;
    victim.kill()?;
    let cut = in_flight(&victim.events()?);
    eprintln!("{} killed with {cut} records in flight", victim.id);
    assert!(cut > 0, "the kill came with records in flight");
    wait_until(
        "the survivor to own every lease",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let by = count_by_owner(&ctx.owners().await?);
            Ok(by.get(&Some(survivor.id.clone())) == Some(&SHARDS))
        },
    )
    .await
    .map_err(|e| e.context(survivor.log_tail()))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Checked before waiting for every record: a checkpoint past an unfinished record shows
    // here, by name, rather than as a record missing at the end.
    nothing_unfinished_below_starts(&ctx, &[victim.events()?, survivor.events()?]).await?;
    let mut want = producer.stop().await?;
    want.extend(initial.into_iter().map(|(_, d)| d));
    wait_until(
        "every record finished by one of them",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let got = delivered_set([victim.events()?.as_slice(), survivor.events()?.as_slice()]);
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await
    .map_err(|e| e.context(survivor.log_tail()))?;
    let journals = [victim.events()?, survivor.events()?];
    for journal in &journals {
        key_order(journal);
    }
    let most = journals.iter().map(|j| most_at_once(j)).max().unwrap_or(0);
    eprintln!("at most {most} records of a shard in flight at once");
    assert!(
        (2..=10).contains(&most),
        "parallel, within the limit: {most}"
    );
    nothing_unfinished_below_starts(&ctx, &journals).await?;
    survivor.terminate()?;
    assert!(survivor.wait_exit(Duration::from_secs(20)).await?.success());
    Ok(())
}

/// Records whose handler started and did not finish.
fn in_flight(events: &[Event]) -> usize {
    let started = events.iter().filter(|e| e.event == "record_start").count();
    let finished = events.iter().filter(|e| e.event == "record").count();
    started.saturating_sub(finished)
}

/// How long, in milliseconds, the oldest record still in flight has run.
fn oldest_in_flight(events: &[Event]) -> i64 {
    let mut started: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for e in events {
        let (Some(shard), Some(seq)) = (e.shard.as_deref(), e.seq.as_deref()) else {
            continue;
        };
        match e.event.as_str() {
            "record_start" => {
                started.insert((shard, seq), e.ms);
            }
            "record" => {
                started.remove(&(shard, seq));
            }
            _ => {}
        }
    }
    let now = chrono::Utc::now().timestamp_millis();
    started.values().map(|ms| now - ms).max().unwrap_or(0)
}

/// The most records of one shard whose handlers ran at once.
fn most_at_once(events: &[Event]) -> usize {
    let mut running: BTreeMap<&str, usize> = BTreeMap::new();
    let mut most = 0;
    for e in events {
        let Some(shard) = e.shard.as_deref() else {
            continue;
        };
        let n = running.entry(shard).or_default();
        match e.event.as_str() {
            "record_start" => *n += 1,
            "record" => *n = n.saturating_sub(1),
            "init" | "lease_lost" => *n = 0,
            _ => {}
        }
        most = most.max(*n);
    }
    most
}

/// Within each tenure (from one `init` of a shard to the next), the records of a key start in
/// sequence order, each after the one before it finished.
fn key_order(events: &[Event]) {
    // Per (shard, key): the last record started, and whether it finished.
    let mut last: BTreeMap<(&str, &str), (SequenceNumber, bool)> = BTreeMap::new();
    for e in events {
        let (Some(shard), seq) = (e.shard.as_deref(), e.sequence()) else {
            continue;
        };
        let key = e.pk.as_deref().unwrap_or_default();
        match e.event.as_str() {
            "init" => last.retain(|(s, _), _| *s != shard),
            "record_start" => {
                let seq = seq.expect("a sequence number");
                if let Some((previous, finished)) = last.get(&(shard, key)) {
                    assert!(
                        *previous < seq,
                        "{} {shard} {key}: {seq} after {previous}",
                        e.worker
                    );
                    assert!(
                        *finished,
                        "{} {shard} {key}: {seq} overlapped {previous}",
                        e.worker
                    );
                }
                last.insert((shard, key), (seq, false));
            }
            "record" => {
                if let Some(entry) = last.get_mut(&(shard, key))
                    && Some(&entry.0) == seq.as_ref()
                {
                    entry.1 = true;
                }
            }
            _ => {}
        }
    }
}

/// Every `init` at a sequence number: each record of its shard up to that number finished
/// (a `record` line) before it.
async fn nothing_unfinished_below_starts(
    ctx: &Context,
    journals: &[Vec<Event>],
) -> anyhow::Result<()> {
    let finished: BTreeMap<String, i64> = journals
        .iter()
        .flatten()
        .filter(|e| e.event == "record")
        .filter_map(|e| Some((e.data.clone()?, e.ms)))
        .fold(BTreeMap::new(), |mut m, (d, ms)| {
            let at = m.entry(d).or_insert(ms);
            *at = (*at).min(ms);
            m
        });
    let mut checked = BTreeSet::new();
    for init in journals.iter().flatten().filter(|e| e.event == "init") {
        let (Some(shard), Some(from)) = (&init.shard, init.checkpoint.as_deref()) else {
            continue;
        };
        let Some(from) = SequenceNumber::parse(from) else {
            continue; // TRIM_HORIZON
        };
        for (seq, data) in ctx.read_shard(shard).await? {
            if SequenceNumber::parse(&seq).is_some_and(|s| s <= from) {
                let done = finished.get(&data);
                assert!(
                    done.is_some_and(|ms| *ms <= init.ms),
                    "{} started {shard} at {from}, but {data} ({seq}) below it had not finished",
                    init.worker
                );
                checked.insert(data);
            }
        }
    }
    eprintln!(
        "{} records below a new owner's starting checkpoint, each finished before it",
        checked.len()
    );
    assert!(!checked.is_empty(), "some tenure started at a checkpoint");
    Ok(())
}
