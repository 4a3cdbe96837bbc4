//! Failover: kill or stop one of two workers, time until the survivor delivers from each of
//! the victim's shards.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use kcl_core::LeaseStore;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, Producer, count_by_owner, wait_until};

use crate::{median, seconds};

const SHARDS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Leader,
    Follower,
    /// Under `every-worker`, where there is no leader.
    Either,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Kill,
    Term,
}

struct Case {
    mode: &'static str,
    liveness: &'static str,
    victim: Victim,
    signal: Signal,
    failover_ms: u64,
}

const fn case(mode: &'static str, victim: Victim, signal: Signal, failover_ms: u64) -> Case {
    Case {
        mode,
        liveness: "per-lease",
        victim,
        signal,
        failover_ms,
    }
}

const fn heartbeat(victim: Victim, signal: Signal, failover_ms: u64) -> Case {
    Case {
        liveness: "heartbeat",
        ..case("leader", victim, signal, failover_ms)
    }
}

const CASES: [Case; 13] = [
    case("leader", Victim::Leader, Signal::Kill, 10_000),
    case("leader", Victim::Follower, Signal::Kill, 10_000),
    case("leader", Victim::Leader, Signal::Term, 10_000),
    case("leader", Victim::Leader, Signal::Kill, 3_000),
    case("leader", Victim::Follower, Signal::Kill, 3_000),
    case("leader", Victim::Follower, Signal::Term, 3_000),
    case("every-worker", Victim::Either, Signal::Kill, 10_000),
    case("every-worker", Victim::Either, Signal::Kill, 3_000),
    case("every-worker", Victim::Either, Signal::Term, 3_000),
    heartbeat(Victim::Leader, Signal::Kill, 10_000),
    heartbeat(Victim::Follower, Signal::Kill, 10_000),
    heartbeat(Victim::Leader, Signal::Kill, 3_000),
    heartbeat(Victim::Follower, Signal::Term, 3_000),
];

pub(crate) async fn table(worker: &str, runs: usize) -> anyhow::Result<()> {
    println!();
    println!(
        "| coordination | liveness | victim | signal | failover time | to the survivor's first record on each of the victim's shards (median) | runs |"
    );
    println!("|---|---|---|---|---:|---:|---|");
    for case in &CASES {
        let mut took = Vec::new();
        for i in 0..runs {
            // Runs signal at phases spread over one taker interval: the fleet's cycles are
            // periodic, and a fixed delay would measure the same phase every time.
            let phase = Duration::from_millis(1000 * u64::try_from(i)? / u64::try_from(runs)?);
            took.push(run(worker, case, phase).await?);
        }
        let all: Vec<String> = took.iter().map(|d| seconds(*d)).collect();
        println!(
            "| {} | {} | {} | {} | {} s | {} s | {} |",
            case.mode,
            case.liveness,
            match case.victim {
                Victim::Leader => "leader",
                Victim::Follower => "follower",
                Victim::Either => "one of two",
            },
            match case.signal {
                Signal::Kill => "SIGKILL",
                Signal::Term => "SIGTERM",
            },
            case.failover_ms / 1000,
            seconds(median(&mut took)),
            all.join(", ")
        );
    }
    Ok(())
}

/// One run: the time from the signal to the survivor's first record on the last of the
/// victim's shards to resume.
async fn run(worker: &str, case: &Case, phase: Duration) -> anyhow::Result<Duration> {
    let ctx = Context::new("bench-failover")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(i32::try_from(SHARDS)?).await?;
    let failover = case.failover_ms.to_string();
    let args = [
        "--taker-ms",
        "1000",
        "--failover-ms",
        &failover,
        "--max-steal",
        "4",
        "--liveness",
        case.liveness,
    ];
    let a = WorkerProcess::spawn_in(case.mode, worker, &ctx, "worker-a", &args)?;
    owns(&ctx, &[("worker-a", SHARDS)]).await?;
    let b = WorkerProcess::spawn_in(case.mode, worker, &ctx, "worker-b", &args)?;
    owns(&ctx, &[("worker-a", SHARDS / 2), ("worker-b", SHARDS / 2)]).await?;
    let producer = Producer::start(&ctx, "live", 8, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(2) + phase).await;

    let leader = leader_of(&ctx).await?;
    let a_leads = leader.as_deref() == Some("worker-a");
    let victim_is_a = match case.victim {
        Victim::Leader => a_leads,
        Victim::Follower => !a_leads,
        Victim::Either => false,
    };
    let (mut victim, survivor) = if victim_is_a { (a, b) } else { (b, a) };
    let orphaned: BTreeSet<String> = ctx
        .owners()
        .await?
        .into_iter()
        .filter(|(_, owner)| owner.as_deref() == Some(victim.id.as_str()))
        .map(|(key, _)| key)
        .collect();
    anyhow::ensure!(!orphaned.is_empty(), "{} held nothing", victim.id);
    let signalled = chrono::Utc::now().timestamp_millis();
    match case.signal {
        Signal::Kill => victim.kill()?,
        Signal::Term => victim.terminate()?,
    }
    let mut resumed: BTreeMap<String, i64> = BTreeMap::new();
    wait_until(
        "the survivor to deliver from every orphaned shard",
        Duration::from_secs(90),
        Duration::from_millis(50),
        async || {
            for e in survivor.events()? {
                if let (true, Some(shard)) = (e.event == "record" && e.ms > signalled, &e.shard)
                    && orphaned.contains(shard)
                {
                    resumed.entry(shard.clone()).or_insert(e.ms);
                }
            }
            Ok(resumed.len() == orphaned.len())
        },
    )
    .await
    .map_err(|e| e.context(survivor.log_tail()))?;
    producer.stop().await?;
    survivor.terminate()?;
    let last = resumed.values().max().copied().unwrap_or(signalled);
    Ok(Duration::from_millis(u64::try_from(last - signalled)?))
}

/// Waits until each named worker owns its number of leases.
async fn owns(ctx: &Context, want: &[(&str, usize)]) -> anyhow::Result<()> {
    wait_until(
        "the leases to be held as wanted",
        Duration::from_secs(60),
        Duration::from_millis(50),
        async || {
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(want
                .iter()
                .all(|(w, n)| by.get(&Some((*w).to_owned())) == Some(n)))
        },
    )
    .await
    .map(drop)
}

/// The holder of the leader row, if any.
async fn leader_of(ctx: &Context) -> anyhow::Result<Option<String>> {
    let rows = ctx.store().list().await?;
    Ok(rows
        .into_iter()
        .find(|l| l.key.as_str().ends_with("/worker-leader"))
        .and_then(|l| l.owner)
        .map(|o| o.as_str().to_owned()))
}
