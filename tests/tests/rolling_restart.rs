//! A rolling restart of three worker processes with stable ids and a restart grace
//! (`--restart-grace-ms`), as a StatefulSet's would be: each in turn gets SIGTERM, stays down
//! longer than the failover time, and starts again under the same id. No lease ever names
//! another worker (nor nobody), each restarted process resumes its own leases at once, every
//! record is processed, and none is delivered again before the shutdown checkpoint it left.
//! With the leases in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kcl_core::SequenceNumber;
use kcl_integration_tests::journal::{Event, delivered_set};
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, Producer, count_by_owner, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const FAILOVER: Duration = Duration::from_secs(5);
/// Down longer than the failover time: without the grace, the leases would move.
const DOWN: Duration = Duration::from_secs(7);
const IDS: [&str; 3] = ["stable-0", "stable-1", "stable-2"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_stable_ids_moves_no_lease_and_loses_nothing() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("rolling-restart").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), run(ctx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_moves_no_lease_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("rolling-restart-pg").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), run(ctx)).await
}

/// Every owner each lease had while `watch` ran (polled every 100 ms).
type Seen = Arc<Mutex<BTreeMap<String, BTreeSet<Option<String>>>>>;

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(6).await?;
    let initial: Vec<(String, String)> = (0..60)
        .map(|i| (format!("pk-{i}"), format!("init{i}")))
        .collect();
    ctx.put(&initial).await?;
    let args = [
        "--failover-ms",
        "5000",
        "--taker-ms",
        "1000",
        "--restart-grace-ms",
        "30000",
        "--max-steal",
        "2",
    ];
    let producer = Producer::start(&ctx, "live", 6, Duration::from_millis(200));
    let mut workers: Vec<WorkerProcess> = Vec::new();
    for id in IDS {
        workers.push(WorkerProcess::spawn(WORKER, &ctx, id, &args)?);
    }
    wait_until(
        "two leases each, each delivering live records",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            let by = count_by_owner(&owners);
            let even = IDS
                .iter()
                .all(|id| by.get(&Some((*id).to_owned())) == Some(&2));
            let held = workers.iter().all(|w| {
                let live = delivered_live(w);
                keys_of(&owners, &w.id).iter().all(|k| live.contains(k))
            });
            Ok(even && held)
        },
    )
    .await
    .map_err(|e| e.context(logs(&workers)))?;
    let before = ctx.owners().await?;

    // Every owner every lease has from here on.
    let seen = Seen::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let watch = tokio::spawn(watch_owners(ctx.clone(), seen.clone(), stop.clone()));

    let mut earlier: Vec<WorkerProcess> = Vec::new();
    for (i, id) in IDS.iter().enumerate() {
        let mine: Vec<String> = keys_of(&before, id);
        let old = &mut workers[i];
        old.terminate()?;
        assert!(old.wait_exit(Duration::from_secs(20)).await?.success());
        // Its journal goes on in a file of its own; the restarted process starts a new one.
        let kept = ctx.path(&format!("{id}-before-restart.jsonl"));
        std::fs::rename(&old.journal, &kept)?;
        old.journal = kept;
        let rows = ctx.list().await?;
        for key in &mine {
            let row = rows.iter().find(|l| l.key.as_str() == key).unwrap();
            assert_eq!(row.owner.as_ref().map(|o| o.as_str()), Some(*id), "{key}");
            assert_eq!(
                row.restart_grace,
                Some(Duration::from_secs(30)),
                "{key}: {row:?}"
            );
        }
        tokio::time::sleep(DOWN).await;
        let back = Instant::now();
        let new = WorkerProcess::spawn(WORKER, &ctx, id, &args)?;
        let resumed = wait_until(
            "the restarted worker to resume its leases",
            Duration::from_secs(30),
            Duration::from_millis(100),
            async || {
                let inits = initialized(&new);
                Ok(mine.iter().all(|k| inits.contains(k)))
            },
        )
        .await
        .map_err(|e| e.context(new.log_tail()))?;
        eprintln!(
            "{id}: down {DOWN:?} (failover {FAILOVER:?}), resumed its {} leases {resumed:?} after starting again",
            mine.len()
        );
        assert!(back.elapsed() < FAILOVER * 3);
        earlier.push(std::mem::replace(&mut workers[i], new));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut want: Vec<String> = producer.stop().await?;
    want.extend(initial.into_iter().map(|(_, d)| d));
    let journals = || -> anyhow::Result<Vec<Vec<Event>>> {
        workers
            .iter()
            .chain(&earlier)
            .map(WorkerProcess::events)
            .collect()
    };
    wait_until(
        "every record delivered",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let all = journals()?;
            let got = delivered_set(all.iter().map(Vec::as_slice));
            Ok(want.iter().all(|d| got.contains(d)))
        },
    )
    .await
    .map_err(|e| e.context(logs(&workers)))?;
    stop.cancel();
    watch.await??;

    // No lease ever named another worker, or nobody.
    for (key, owners) in seen.lock().unwrap().iter() {
        let first = before.get(key).cloned().flatten();
        assert_eq!(
            owners,
            &BTreeSet::from([first.clone()]),
            "{key}: owned by {owners:?}, not only {first:?}"
        );
    }
    // Checkpoints intact: a restarted process delivers nothing its predecessor's shutdown
    // checkpoint covers.
    for (old, new) in earlier.iter().zip(&workers) {
        // Its last shutdown checkpoint of each lease it kept (the earlier ones were handoffs
        // while the fleet balanced).
        let mine = keys_of(&before, &old.id);
        let mut shutdown_at: BTreeMap<String, SequenceNumber> = BTreeMap::new();
        let events = old.events()?;
        for e in events.iter().filter(|e| e.event == "shutdown_checkpoint") {
            if let (Some(shard), Some(seq)) = (&e.shard, e.sequence())
                && mine.contains(shard)
            {
                shutdown_at.insert(shard.clone(), seq);
            }
        }
        assert_eq!(shutdown_at.len(), 2, "{}: {shutdown_at:?}", old.id);
        let again: Vec<String> = new
            .events()?
            .iter()
            .filter(|e| e.event == "record")
            .filter(|e| {
                let shard = e.shard.as_ref();
                let at = shard.and_then(|s| shutdown_at.get(s));
                at.is_some_and(|at| e.sequence().is_some_and(|s| s <= *at))
            })
            .filter_map(|e| e.data.clone())
            .collect();
        assert!(again.is_empty(), "{}: delivered again {again:?}", new.id);
    }
    for w in &mut workers {
        w.terminate()?;
        assert!(w.wait_exit(Duration::from_secs(20)).await?.success());
    }
    Ok(())
}

/// The shards `worker` started a processor on.
fn initialized(worker: &WorkerProcess) -> BTreeSet<String> {
    let events = worker.events().unwrap_or_default();
    let inits = events.iter().filter(|e| e.event == "init");
    inits.filter_map(|e| e.shard.clone()).collect()
}

/// The shards `worker` delivered a live record of (so that its shutdown checkpoints name a
/// record).
fn delivered_live(worker: &WorkerProcess) -> BTreeSet<String> {
    let events = worker.events().unwrap_or_default();
    let live = events.iter().filter(|e| {
        e.event == "record" && e.data.as_deref().is_some_and(|d| d.starts_with("live"))
    });
    live.filter_map(|e| e.shard.clone()).collect()
}

/// The lease keys `id` owns in `owners`.
fn keys_of(owners: &BTreeMap<String, Option<String>>, id: &str) -> Vec<String> {
    owners
        .iter()
        .filter(|(_, o)| o.as_deref() == Some(id))
        .map(|(k, _)| k.clone())
        .collect()
}

async fn watch_owners(
    ctx: Context,
    seen: Seen,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    while !stop.is_cancelled() {
        for (key, owner) in ctx.owners().await? {
            seen.lock().unwrap().entry(key).or_default().insert(owner);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn logs(workers: &[WorkerProcess]) -> String {
    workers
        .iter()
        .map(|w| format!("--- {}\n{}", w.id, w.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
}
