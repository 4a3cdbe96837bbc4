//! What a deploy costs the fleet: lease moves, the longest time a shard goes without a
//! holder processing it, and the lease table's requests, on the in-memory backends under
//! paused time (simulated seconds: the same on every machine), each against today's
//! behaviour on the same setup.
//!
//! `cargo bench -p kcl-core --features mutation-testing --bench deploys`
//!
//! 1. **Rolling restart, stable ids** (a StatefulSet, an ECS service with fixed names, a
//!    systemd unit): 4 workers × 32 shards; each worker in turn stops gracefully, stays down
//!    for a while, and starts again under the same id; the next one once the fleet holds 8
//!    each again. With `restart_grace` (60 s) against without.
//! 2. **Rolling replace with surge** (a Deployment with `maxSurge: 1, maxUnavailable: 0`): a
//!    new worker with a new id starts; once it completed its first cycle (ready), the worker
//!    it replaces stops gracefully; four times.
//! 3. **Scale-out**: a fifth worker starts and stays, until the five hold their share; against
//!    a leader that balances onto a worker the moment it arrives
//!    (`Mutation::ArrivalsBalancedOnto`), which the surge pays for.
//!
//! `DEPLOY_RUNS=N` (5), `DEPLOY_ONLY=surge` (the surge and scale-out rows only),
//! `DEPLOY_DEBUG=1` (each move: when, which lease, from and to, written by whom).
//!
//! "Today" is the behaviour before issue 38: no grace, and the leader takes released leases
//! itself before balancing them on. It is kept as a deliberate bug of the mutation check
//! (`Mutation::ReleasedViaLeader`), which is why this benchmark needs `mutation-testing`.
//! A move is a change of a lease's owner to another worker (a release and a take back by the
//! same worker is none); the gap is sampled every 100 ms from the first stop until the fleet
//! holds 8 each again after the last start.
#![allow(
    missing_docs,
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::mutation::{self, Mutation};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, ShutdownHandle, Status,
    Worker, WorkerConfig,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const SHARDS: u32 = 32;
const WORKERS: usize = 4;
const GRACE: Duration = Duration::from_secs(60);
/// The readiness probe of `deploy/kubernetes` (`initialDelaySeconds`, `periodSeconds`).
const READINESS_DELAY: Duration = Duration::from_secs(2);
const READINESS_PERIOD: Duration = Duration::from_secs(5);
/// How often the holders are sampled for the gaps.
const SAMPLE: Duration = Duration::from_millis(100);

/// Checkpoints every batch: a move repeats nothing, so what is measured is coordination.
struct Checkpointing;

impl RecordProcessor for Checkpointing {
    async fn process_records(
        &mut self,
        _: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        cp.checkpoint().await?;
        Ok(())
    }
}

struct Member {
    status: watch::Receiver<Status>,
    stop: ShutdownHandle,
    task: JoinHandle<Result<(), kcl_core::Error>>,
}

type Statuses = Arc<Mutex<BTreeMap<String, watch::Receiver<Status>>>>;

struct Fleet {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    config: WorkerConfig,
    live: BTreeMap<String, Member>,
    statuses: Statuses,
}

impl Fleet {
    fn start(&mut self, id: &str) {
        let worker = Worker::new(
            id,
            self.config.clone(),
            self.stream.client(id),
            self.store.client(id),
            |_: &ShardId| Checkpointing,
        )
        .unwrap();
        let status = worker.status();
        self.statuses
            .lock()
            .unwrap()
            .insert(id.to_owned(), status.clone());
        let member = Member {
            status,
            stop: worker.shutdown_handle(),
            task: tokio::spawn(worker.run()),
        };
        self.live.insert(id.to_owned(), member);
    }

    async fn stop(&mut self, id: &str) {
        let member = self.live.remove(id).unwrap();
        member.stop.shutdown();
        member.task.await.unwrap().unwrap();
        self.statuses.lock().unwrap().remove(id);
    }

    fn held(&self) -> Vec<usize> {
        self.live
            .values()
            .map(|m| m.status.borrow().held.len())
            .collect()
    }

    /// Waits until `workers` live workers hold their share each (at most 5 minutes).
    async fn balanced(&self, workers: usize) {
        let (lo, hi) = (
            SHARDS as usize / workers,
            (SHARDS as usize).div_ceil(workers),
        );
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            let held = self.held();
            if held.len() == workers && held.iter().all(|h| (lo..=hi).contains(h)) {
                return;
            }
            sleep(SAMPLE).await;
        }
        panic!("not balanced within 5 minutes: {:?}", self.held());
    }
}

/// Per shard, the longest stretch no live worker held it, sampled until `stop` is set.
async fn sample_gaps(statuses: Statuses, stop: Arc<Mutex<bool>>) -> BTreeMap<ShardId, Duration> {
    let mut since: BTreeMap<ShardId, Instant> = BTreeMap::new();
    let mut longest: BTreeMap<ShardId, Duration> = BTreeMap::new();
    let mut known: Vec<ShardId> = Vec::new();
    while !*stop.lock().unwrap() {
        let now = Instant::now();
        let held: Vec<ShardId> = statuses
            .lock()
            .unwrap()
            .values()
            .flat_map(|s| s.borrow().held.clone())
            .collect();
        for key in &held {
            if !known.contains(key) {
                known.push(key.clone());
            }
        }
        for key in &known {
            if held.contains(key) {
                since.remove(key);
                longest.entry(key.clone()).or_default();
            } else {
                let from = *since.entry(key.clone()).or_insert(now);
                let gap = longest.entry(key.clone()).or_default();
                *gap = (*gap).max(now - from);
            }
        }
        sleep(SAMPLE).await;
    }
    longest
}

/// Owner changes of shard leases to another worker in the store's journal from event `from`.
fn moves(store: &MemoryLeaseStore, from: usize) -> usize {
    // Owners as they were at `from`.
    let journal = store.journal();
    let mut at_start: BTreeMap<ShardId, String> = BTreeMap::new();
    for e in &journal[..from] {
        if let Some(o) = &e.lease.owner {
            at_start.insert(e.lease.key.clone(), o.as_str().to_owned());
        }
    }
    let mut last = at_start;
    let mut moves = 0;
    for e in &journal[from..] {
        if is_coordination_key(&e.lease.key) {
            continue;
        }
        let Some(o) = e.lease.owner.as_ref().map(|o| o.as_str().to_owned()) else {
            continue;
        };
        if last.get(&e.lease.key).is_some_and(|before| *before != o) {
            moves += 1;
            if std::env::var_os("DEPLOY_DEBUG").is_some() {
                println!(
                    "move {:?} {} {} -> {o} by {} ({})",
                    e.at, e.lease.key, last[&e.lease.key], e.client, e.operation
                );
            }
        }
        last.insert(e.lease.key.clone(), o);
    }
    moves
}

/// What one deploy cost.
#[derive(Debug, Clone, Copy)]
struct Cost {
    moves: usize,
    /// The longest gap of any shard.
    longest_gap: Duration,
    /// The median shard's longest gap.
    median_gap: Duration,
    /// Lease-table requests and write units during the deploy.
    requests: u64,
    write_units: f64,
    /// Simulated seconds from the first stop until the fleet held 8 each after the last.
    took: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deploy {
    /// Each worker stops, stays down this long, and starts again under its id.
    Restart(Duration),
    /// A new worker starts, then the one it replaces stops.
    Surge,
    /// A fifth worker starts, and stays.
    ScaleOut,
}

fn run(deploy: Deploy, config: WorkerConfig, today: bool) -> Cost {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let before = match deploy {
        Deploy::ScaleOut => Mutation::ArrivalsBalancedOnto,
        Deploy::Restart(_) | Deploy::Surge => Mutation::ReleasedViaLeader,
    };
    mutation::set(today.then_some(before));
    let cost = rt.block_on(deploy_once(deploy, config));
    mutation::set(None);
    cost
}

async fn deploy_once(deploy: Deploy, config: WorkerConfig) -> Cost {
    let mut fleet = Fleet {
        stream: MemoryStream::new(SHARDS),
        store: MemoryLeaseStore::new(),
        config,
        live: BTreeMap::new(),
        statuses: Statuses::default(),
    };
    for i in 0..WORKERS {
        fleet.start(&format!("w{i}"));
    }
    fleet.balanced(WORKERS).await;
    let producing = tokio::spawn(produce(fleet.stream.clone()));
    sleep(Duration::from_secs(5)).await;
    let stop = Arc::new(Mutex::new(false));
    let sampler = tokio::spawn(sample_gaps(fleet.statuses.clone(), stop.clone()));
    let (from, before) = (
        fleet.store.journal().len(),
        fleet.store.table_usage().total(),
    );
    let began = Instant::now();
    for i in 0..WORKERS {
        let old = format!("w{i}");
        match deploy {
            Deploy::Restart(down) => {
                fleet.stop(&old).await;
                sleep(down).await;
                fleet.start(&old);
            }
            Deploy::Surge => {
                let new = format!("n{i}");
                fleet.start(&new);
                // Kubernetes stops the old pod once the new one is ready: its readiness
                // probe (the manifest's: 2 s after start, then every 5 s) found a cycle
                // completed.
                let ready = fleet.live[&new].status.clone();
                sleep(READINESS_DELAY).await;
                while ready.borrow().last_cycle.is_none() {
                    sleep(READINESS_PERIOD).await;
                }
                fleet.stop(&old).await;
            }
            Deploy::ScaleOut => {
                fleet.start(&format!("n{i}"));
                fleet.balanced(WORKERS + 1).await;
                break;
            }
        }
        fleet.balanced(WORKERS).await;
    }
    let took = began.elapsed();
    *stop.lock().unwrap() = true;
    let gaps = sampler.await.unwrap();
    producing.abort();
    let after = fleet.store.table_usage().total();
    let mut sorted: Vec<Duration> = gaps.values().copied().collect();
    sorted.sort();
    let ids: Vec<String> = fleet.live.keys().cloned().collect();
    for id in ids {
        fleet.stop(&id).await;
    }
    Cost {
        moves: moves(&fleet.store, from),
        longest_gap: sorted.last().copied().unwrap_or_default(),
        median_gap: sorted.get(sorted.len() / 2).copied().unwrap_or_default(),
        requests: after.requests - before.requests,
        write_units: after.write_units - before.write_units,
        took,
    }
}

/// A record on every shard, about every 100 ms each.
async fn produce(stream: MemoryStream) {
    let mut n = 0u64;
    loop {
        for k in 0..64 {
            stream.put(&format!("key-{k}"), format!("record-{n}"));
            n += 1;
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// The median of `runs` runs of each figure (each run on a fresh fleet), and the fewest and
/// most moves of a run.
fn median(runs: usize, mut once: impl FnMut() -> Cost) -> (Cost, (usize, usize)) {
    let costs: Vec<Cost> = (0..runs).map(|_| once()).collect();
    let moves = costs.iter().map(|c| c.moves);
    let range = (moves.clone().min().unwrap_or(0), moves.max().unwrap_or(0));
    let mid = |f: &dyn Fn(&Cost) -> f64| {
        let mut v: Vec<f64> = costs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mid_count = |f: &dyn Fn(&Cost) -> u64| {
        let mut v: Vec<u64> = costs.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let cost = Cost {
        moves: usize::try_from(mid_count(&|c| c.moves as u64)).unwrap_or(usize::MAX),
        longest_gap: Duration::from_secs_f64(mid(&|c| c.longest_gap.as_secs_f64())),
        median_gap: Duration::from_secs_f64(mid(&|c| c.median_gap.as_secs_f64())),
        requests: mid_count(&|c| c.requests),
        write_units: mid(&|c| c.write_units),
        took: Duration::from_secs_f64(mid(&|c| c.took.as_secs_f64())),
    };
    (cost, range)
}

fn row(deploy: &str, how: &str, (c, (fewest, most)): (Cost, (usize, usize))) {
    println!(
        "| {deploy} | {how} | {} ({fewest}–{most}) | {:.2} | {:.1} | {:.1} | {} | {:.0} | {:.0} |",
        c.moves,
        c.moves as f64 / f64::from(SHARDS),
        c.longest_gap.as_secs_f64(),
        c.median_gap.as_secs_f64(),
        c.requests,
        c.write_units,
        c.took.as_secs_f64(),
    );
}

fn main() {
    let runs: usize = std::env::var("DEPLOY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let config = WorkerConfig::default();
    println!(
        "| deploy | behaviour | lease moves (fewest–most of the runs) | moves per lease | longest gap, s | median shard's longest gap, s | table requests | write units | simulated s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let surge_only = std::env::var("DEPLOY_ONLY").is_ok_and(|v| v == "surge");
    let downs = [Duration::from_secs(2), Duration::from_secs(15)];
    for down in downs.into_iter().filter(|_| !surge_only) {
        let deploy = Deploy::Restart(down);
        let name = format!("rolling restart, stable ids, {} s down", down.as_secs());
        let today = median(runs, || run(deploy, config.clone(), true));
        row(&name, "today", today);
        let placed = median(runs, || run(deploy, config.clone(), false));
        row(&name, "no grace (released leases placed directly)", placed);
        let grace = config.clone().restart_grace(GRACE);
        let kept = median(runs, || run(deploy, grace.clone(), false));
        row(&name, "restart_grace 60 s", kept);
    }
    let name = "rolling replace, surge (new ids)";
    if !surge_only {
        let today = median(runs, || run(Deploy::Surge, config.clone(), true));
        row(name, "today", today);
    }
    let placed = median(runs, || run(Deploy::Surge, config.clone(), false));
    row(name, "released leases placed directly", placed);
    let name = "scale-out: a fifth worker";
    let at_once = median(runs, || run(Deploy::ScaleOut, config.clone(), true));
    row(name, "balanced onto at once (before stop 48)", at_once);
    let waits = median(runs, || run(Deploy::ScaleOut, config.clone(), false));
    row(
        name,
        "balanced onto a failover time after it arrived",
        waits,
    );
    println!(
        "(4 workers × 32 shards, coordination leader, per-lease renewals, failover 10 s, taker 1 s; medians of {runs} runs in simulated time)"
    );
}
