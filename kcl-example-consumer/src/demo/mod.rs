//! `demo`: a small fleet on the in-memory backends, narrated.
//!
//! A producer writes numbered records to an 8-shard stream while three workers share it. The
//! demo prints the lease table whenever it changes, stops one worker gracefully (its leases
//! move at once), splits a shard (its children start once the parent is read to its end),
//! adds a worker (leases rebalance through handoffs), crashes one (its leases move after the
//! failover time), and ends with a ledger of every record: produced, processed, unique,
//! duplicates (at least once allows them) and lost (must be zero; the exit code says so).
//! Every worker is also a candidate for the fleet's summary job, a periodic singleton on the
//! same lease table: it runs on one worker at a time and moves when its holder stops (at
//! once) or crashes (after the failover time), never running a period twice.
//! `--endpoints` runs the same script on Kinesis and DynamoDB or their emulators
//! (`aws.rs`).

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl_core::WorkerConfig;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;

#[cfg(feature = "aws")]
mod aws;
mod backend;
mod fleet;
mod ledger;
mod summary;

pub(crate) use backend::Backend;
use backend::Memory;
use fleet::{Clock, Fleet, distribution, render, short};
use ledger::{Ledger, lock};
use summary::summarize;

/// Distinct partition keys the producer writes.
const PARTITION_KEYS: u64 = 64;
/// Window length of the demo's processors.
const WINDOW: Duration = Duration::from_secs(2);

/// Runs the demo; the exit code is non-zero if a record was lost or a worker failed.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.shards >= 1,
        "invalid setting `shards`: must be at least 1"
    );
    anyhow::ensure!(
        args.workers >= 1,
        "invalid setting `workers`: must be at least 1"
    );
    anyhow::ensure!(args.rate >= 1, "invalid setting `rate`: must be at least 1");
    if args.endpoints {
        return endpoints(args).await;
    }
    let backend = Memory {
        stream: MemoryStream::new(args.shards),
        store: MemoryLeaseStore::new(),
    };
    run_on(args, Arc::new(backend)).await
}

#[cfg(feature = "aws")]
async fn endpoints(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let backend = Arc::new(aws::Endpoints::create(args.shards).await?);
    let result = run_on(args, backend.clone()).await;
    for problem in backend.delete().await {
        println!("cleanup: {problem}");
    }
    result
}

#[cfg(not(feature = "aws"))]
#[allow(clippy::unused_async, clippy::needless_pass_by_value)]
async fn endpoints(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("this build has no AWS backends: build with `--features aws`")
}

/// The demo's script, on any backend.
async fn run_on<B: Backend>(args: DemoArgs, backend: Arc<B>) -> anyhow::Result<ExitCode> {
    let clock = Arc::new(Clock(Instant::now()));
    let mut fleet = Fleet {
        backend: backend.clone(),
        config: worker_config(&args)?,
        ledger: Arc::new(Ledger::default()),
        members: Vec::new(),
        clock: clock.clone(),
    };
    println!(
        "kcl demo: {}, {} workers, {} records/s, failover time {}",
        backend.describe(),
        args.workers,
        args.rate,
        humantime::format_duration(args.failover_time)
    );
    println!(
        "lease table lines show owner[shards]; (free) = nobody holds it. Worker logs: --log-filter info\n"
    );
    let producer = Producer::start(&backend, &clock, args.rate);
    let watcher = LeaseWatcher::start(&backend, &clock);

    let names: Vec<String> = (1..=args.workers).map(|i| format!("worker-{i}")).collect();
    for name in &names {
        fleet.start(name)?;
    }
    clock.say(&format!("started {}", names.join(", ")));
    script(&args, &mut fleet, &names).await?;

    // Stop producing, let the fleet catch up.
    sleep_until(clock.0 + Duration::from_secs(19)).await;
    let total = producer.stop().await;
    clock.say(&format!(
        "producer stopped after {total} records; waiting for the fleet to catch up"
    ));
    if caught_up(&fleet, total).await {
        clock.say("every record was delivered");
    } else {
        clock.say("gave up waiting after 8s");
    }

    let final_leases = distribution(&backend.leases().await.unwrap_or_default());
    for name in fleet.running() {
        fleet.stop(&name).await;
    }
    clock.say("stopped every worker");
    sleep(Duration::from_millis(150)).await;
    watcher.stop().await;

    Ok(summarize(&fleet, total, &final_leases, clock.0.elapsed()))
}

/// The workers' configuration: fast enough to show everything in 20 seconds.
fn worker_config(args: &DemoArgs) -> anyhow::Result<WorkerConfig> {
    let config = WorkerConfig::default()
        .failover_time(args.failover_time)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(100))
        .parent_poll_interval(Duration::from_millis(200))
        .shard_sync_interval(Duration::from_secs(5))
        .shutdown_timeout(Duration::from_secs(5));
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid setting `{}`: {}", e.key, e.reason))?;
    Ok(config)
}

/// What happens to the running fleet, second by second: a graceful stop, a split, a worker
/// joining, a crash.
async fn script<B: Backend>(
    args: &DemoArgs,
    fleet: &mut Fleet<B>,
    names: &[String],
) -> anyhow::Result<()> {
    let (backend, clock) = (fleet.backend.clone(), fleet.clock.clone());
    let at = |secs: f64| clock.0 + Duration::from_secs_f64(secs);

    // A graceful stop: leases are released and taken by the others at once.
    sleep_until(at(5.0)).await;
    let leaving = names.last().cloned().unwrap_or_default();
    let leases = backend.leases().await.unwrap_or_default();
    let held = distribution(&leases).get(&leaving).map_or(0, Vec::len);
    clock.say(&format!(
        "stopping {leaving} gracefully (it holds {held} leases): processors checkpoint, leases are released"
    ));
    if let Some(took) = fleet.stop(&leaving).await {
        clock.say(&format!("{leaving} stopped in {} ms", took.as_millis()));
    }

    // A split: the parent is read to its end, then its children start.
    sleep_until(at(8.0)).await;
    if !args.no_split {
        match backend.split().await {
            Ok((parent, children)) => clock.say(&format!(
                "split shard {} into {}: the children start once the parent is processed to its end",
                short(&parent),
                children.iter().map(short).collect::<Vec<_>>().join(" and ")
            )),
            Err(e) => clock.say(&format!("split failed: {e:#}")),
        }
    }

    // A new worker: leases rebalance through handoffs.
    sleep_until(at(10.0)).await;
    let joining = format!("worker-{}", args.workers + 1);
    fleet.start(&joining)?;
    clock.say(&format!(
        "started {joining}: it asks busier workers to hand leases over"
    ));

    // A crash: the leases stay owned until they expire after the failover time.
    sleep_until(at(14.0)).await;
    let victim = names.first().cloned().unwrap_or_default();
    if !args.no_crash && fleet.running().len() > 1 && fleet.running().contains(&victim) {
        fleet.crash(&victim);
        clock.say(&format!(
            "crashed {victim} (no release, no checkpoint): its leases move once they expire, after {}",
            humantime::format_duration(args.failover_time)
        ));
    }
    Ok(())
}

/// Whether the fleet delivered `total` records within 8 seconds.
async fn caught_up<B>(fleet: &Fleet<B>, total: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        if lock(&fleet.ledger.deliveries).len() as u64 >= total {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The producer: `rate` records a second over [`PARTITION_KEYS`] keys, each carrying its id.
struct Producer {
    task: tokio::task::JoinHandle<()>,
    produced: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Producer {
    fn start<B: Backend>(backend: &Arc<B>, clock: &Arc<Clock>, rate: u32) -> Self {
        let produced = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (backend, counted, stopped, said) = (
            backend.clone(),
            produced.clone(),
            stop.clone(),
            clock.clone(),
        );
        let per_tick = u64::from(rate).div_ceil(50);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stopped.is_cancelled() {
                tick.tick().await;
                let first = counted.load(Ordering::Relaxed);
                let batch = (first..first + per_tick)
                    .map(|id| {
                        let user = format!("user-{:02}", id % PARTITION_KEYS);
                        let data = format!("{id} {{\"user\":\"{user}\",\"amount\":{}}}", id % 100);
                        (user, data)
                    })
                    .collect();
                // Ids count as produced once written; a failed batch is written again.
                match backend.put(batch).await {
                    Ok(()) => {
                        counted.fetch_add(per_tick, Ordering::Relaxed);
                    }
                    Err(e) => said.say(&format!("producer: put failed, retrying: {e:#}")),
                }
            }
        });
        clock.say(&format!(
            "producer started: {rate} records/s over {PARTITION_KEYS} partition keys"
        ));
        Self {
            task,
            produced,
            stop,
        }
    }

    /// Stops producing; the records produced.
    async fn stop(self) -> u64 {
        self.stop.cancel();
        let _ = self.task.await;
        self.produced.load(Ordering::Relaxed)
    }
}

/// The lease table, printed whenever it changes.
struct LeaseWatcher {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

impl LeaseWatcher {
    fn start<B: Backend>(backend: &Arc<B>, clock: &Arc<Clock>) -> Self {
        let stop = CancellationToken::new();
        let (backend, clock, stopped) = (backend.clone(), clock.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut last = BTreeMap::new();
            while !stopped.is_cancelled() {
                let now = match backend.leases().await {
                    Ok(leases) => distribution(&leases),
                    Err(_) => last.clone(),
                };
                if now != last {
                    clock.say(&format!("leases  {}", render(&now)));
                    last = now;
                }
                sleep(Duration::from_millis(100)).await;
            }
        });
        Self { task, stop }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
