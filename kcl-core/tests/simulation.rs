//! Deterministic fleet simulation.
//!
//! Each seed runs a whole fleet in one process — up to 5 workers over up to 32 shards on the
//! in-memory backends, on a current-thread runtime with paused time — while a producer keeps
//! writing and a seeded scheduler crashes, pauses, adds and removes workers, makes the store
//! fail, throttle and answer late, partitions single workers, expires iterators, makes
//! processors fail, and splits and merges shards. Then faults stop, the fleet drains, and the
//! run is checked against the invariants in `sim/checks.rs` plus balance.
//!
//! `cargo test -p kcl-core --test simulation` runs 200 seeds; `SIM_SEEDS=N` runs N;
//! `SIM_SEED=S` replays one seed with the same schedule.
#![allow(
    missing_docs,
    unreachable_pub,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod sim;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kcl_core::coordination::{Singleton, SingletonConfig, is_coordination_key};
use kcl_core::lease::sync::Lineage;
use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryStream};
use kcl_core::{LeaseStore, SequenceNumber, ShardId, ShutdownHandle, Status, Worker, WorkerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use sim::checks::{self, Evidence};
use sim::processor::{Factory, INJECTED_PANIC, Log, SingletonRun};
use tokio_util::sync::CancellationToken;

const MAX_SHARDS: usize = 32;
const MAX_WORKERS: usize = 5;

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(3))
        .taker_interval(Duration::from_millis(500))
        .shard_sync_interval(Duration::from_secs(5))
        .lease_cleanup_delay(Duration::from_secs(15))
        .idle_time_between_reads(Duration::from_millis(250))
        .parent_poll_interval(Duration::from_millis(250))
        .max_records(40)
        .max_leases_to_steal(2)
        .min_backoff(Duration::from_millis(50))
        .max_backoff(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(10))
}

struct Member {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    singleton: JoinHandle<Result<(), kcl_core::Error>>,
    singleton_stop: CancellationToken,
    shutdown: ShutdownHandle,
    status: watch::Receiver<Status>,
}

struct Fleet {
    seed: u64,
    stream: MemoryStream,
    store: MemoryLeaseStore,
    faults: Faults,
    log: Log,
    instances: Arc<AtomicU64>,
    live: BTreeMap<String, Member>,
    paused: BTreeMap<String, Instant>,
    next_id: usize,
    failure_rate: f64,
}

impl Fleet {
    fn join(&mut self) {
        let id = format!("w{}", self.next_id);
        self.next_id += 1;
        let factory = Factory {
            worker: id.clone(),
            log: self.log.clone(),
            faults: self.faults.clone(),
            seed: self.seed,
            instances: self.instances.clone(),
            failure_rate: self.failure_rate,
        };
        let worker = Worker::new(
            id.as_str(),
            config(),
            self.stream.client(&id),
            self.store.client(&id),
            move |shard: &ShardId| factory.create(shard),
        )
        .expect("valid config");
        let (singleton, singleton_stop) = self.compete_for_singleton(&id);
        let member = Member {
            shutdown: worker.shutdown_handle(),
            status: worker.status(),
            task: tokio::spawn(worker.run()),
            singleton,
            singleton_stop,
        };
        self.live.insert(id, member);
    }

    /// Every worker is also a candidate for one fleet-wide singleton task.
    fn compete_for_singleton(
        &self,
        id: &str,
    ) -> (JoinHandle<Result<(), kcl_core::Error>>, CancellationToken) {
        let config = SingletonConfig::default()
            .failover_time(config().failover_time)
            .poll_interval(config().taker_interval);
        let singleton =
            Singleton::new("sim", id, self.store.client(id), config).expect("valid config");
        let stop = CancellationToken::new();
        let (log, me, token) = (self.log.clone(), id.to_owned(), stop.clone());
        let task = tokio::spawn(async move {
            singleton
                .run(token, |lost| {
                    let (log, me) = (log.clone(), me.clone());
                    async move {
                        let i = {
                            let mut j = log.lock();
                            j.singleton_runs.push(SingletonRun {
                                worker: me,
                                start: Instant::now(),
                                end: None,
                            });
                            j.singleton_runs.len() - 1
                        };
                        lost.cancelled().await;
                        log.lock().singleton_runs[i].end = Some(Instant::now());
                    }
                })
                .await
        });
        (task, stop)
    }

    fn pick(&self, rng: &mut StdRng) -> Option<String> {
        let ids: Vec<&String> = self.live.keys().collect();
        (!ids.is_empty()).then(|| ids[rng.random_range(0..ids.len())].clone())
    }

    /// Removes a worker: crashed (dropped without releasing anything) or stopped gracefully.
    async fn remove(&mut self, id: &str, crash: bool) {
        let Some(m) = self.live.remove(id) else {
            return;
        };
        self.paused.remove(id);
        self.faults.resume(id);
        if crash {
            m.task.abort();
            m.singleton.abort();
            let _ = m.task.await;
            let _ = m.singleton.await;
            let now = Instant::now();
            for run in self
                .log
                .lock()
                .singleton_runs
                .iter_mut()
                .filter(|r| r.worker == id && r.end.is_none())
            {
                run.end = Some(now); // the process is gone, and its task with it
            }
        } else {
            m.singleton_stop.cancel();
            match m.singleton.await {
                Ok(Ok(())) => {}
                other => panic!(
                    "seed {}: singleton of {id} ended badly: {other:?}",
                    self.seed
                ),
            }
            m.shutdown.shutdown();
            match m.task.await {
                Ok(Ok(())) => {}
                other => panic!("seed {}: worker {id} ended badly: {other:?}", self.seed),
            }
        }
    }
}

struct Outcome {
    violations: Vec<String>,
    records: usize,
    /// Taker cycles after the drain until balance held twice in a row.
    balance_cycles: u32,
    stats: Stats,
}

/// What a run went through, to show the faults really happened.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    crashes: usize,
    pauses: usize,
    joins: usize,
    leaves: usize,
    store_faults: usize,
    partitions: usize,
    splits: usize,
    merges: usize,
    processors: usize,
    refused_checkpoints: usize,
    handoffs: usize,
    deliveries: usize,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Self) {
        self.crashes += o.crashes;
        self.pauses += o.pauses;
        self.joins += o.joins;
        self.leaves += o.leaves;
        self.store_faults += o.store_faults;
        self.partitions += o.partitions;
        self.splits += o.splits;
        self.merges += o.merges;
        self.processors += o.processors;
        self.refused_checkpoints += o.refused_checkpoints;
        self.handoffs += o.handoffs;
        self.deliveries += o.deliveries;
    }
}

async fn simulate(seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = Faults::seeded(seed.wrapping_mul(31).wrapping_add(7));
    let initial_shards = rng.random_range(1..=16u32);
    let stream = MemoryStream::with_faults(initial_shards, faults.clone());
    let store = MemoryLeaseStore::with_faults(faults.clone());
    let mut fleet = Fleet {
        seed,
        stream: stream.clone(),
        store: store.clone(),
        faults: faults.clone(),
        log: Log::default(),
        instances: Arc::new(AtomicU64::new(0)),
        live: BTreeMap::new(),
        paused: BTreeMap::new(),
        next_id: 0,
        failure_rate: if rng.random_bool(0.5) { 0.02 } else { 0.0 },
    };
    for _ in 0..rng.random_range(1..=MAX_WORKERS) {
        fleet.join();
    }

    // The producer writes until told to stop.
    let producing = CancellationToken::new();
    let producer = {
        let stream = stream.clone();
        let stop = producing.clone();
        let mut rng = StdRng::seed_from_u64(seed ^ 0xfeed);
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                sleep(Duration::from_millis(rng.random_range(20..200))).await;
                for _ in 0..rng.random_range(1..=3) {
                    stream.put(
                        &format!("pk-{}", rng.random_range(0..40)),
                        format!("record-{n}"),
                    );
                    n += 1;
                }
            }
        })
    };

    // Faults.
    let fault_end = Instant::now() + Duration::from_secs(rng.random_range(15..45));
    let mut undo: Vec<(Instant, String)> = Vec::new();
    let mut stats = Stats::default();
    while Instant::now() < fault_end {
        sleep(Duration::from_millis(rng.random_range(300..2500))).await;
        let now = Instant::now();
        // Resume pauses and heal partitions that are due.
        undo.retain(|(at, who)| {
            if *at > now {
                return true;
            }
            match who.as_str() {
                "store" => {
                    faults.set_error_rate(0.0);
                    faults.set_throttle_rate(0.0);
                    faults.set_ambiguous_rate(0.0);
                    faults.set_max_latency(Duration::ZERO);
                    faults.set_expired_iterator_rate(0.0);
                }
                id => {
                    faults.resume(id);
                    faults.heal(id);
                }
            }
            false
        });
        fleet.paused.retain(|id, _| faults.is_paused(id));
        match rng.random_range(0..100) {
            0..12 => {
                if fleet.live.len() > 1
                    && let Some(id) = fleet.pick(&mut rng)
                {
                    fleet.remove(&id, true).await;
                    stats.crashes += 1;
                }
            }
            12..24 => {
                if let Some(id) = fleet.pick(&mut rng) {
                    faults.pause(&id);
                    let length =
                        config().failover_time + Duration::from_millis(rng.random_range(100..4000));
                    fleet.paused.insert(id.clone(), now + length);
                    stats.pauses += 1;
                    undo.push((now + length, id));
                }
            }
            24..36 => {
                if fleet.live.len() < MAX_WORKERS {
                    fleet.join();
                    stats.joins += 1;
                }
            }
            36..44 => {
                if fleet.live.len() > 1
                    && let Some(id) = fleet.pick(&mut rng)
                    && !faults.is_paused(&id)
                {
                    fleet.remove(&id, false).await;
                    stats.leaves += 1;
                }
            }
            44..56 => {
                faults.set_error_rate(rng.random_range(0.0..0.2));
                faults.set_throttle_rate(rng.random_range(0.0..0.2));
                faults.set_ambiguous_rate(rng.random_range(0.0..0.1));
                faults.set_max_latency(Duration::from_millis(rng.random_range(0..400)));
                faults.set_expired_iterator_rate(rng.random_range(0.0..0.1));
                undo.push((
                    now + Duration::from_millis(rng.random_range(500..5000)),
                    "store".into(),
                ));
                stats.store_faults += 1;
            }
            56..66 => {
                if let Some(id) = fleet.pick(&mut rng) {
                    faults.partition(&id);
                    stats.partitions += 1;
                    undo.push((now + Duration::from_millis(rng.random_range(500..6000)), id));
                }
            }
            66..83 => {
                let open = stream.open_shards();
                if open.len() < MAX_SHARDS
                    && !open.is_empty()
                    && stream.split(&open[rng.random_range(0..open.len())]).is_ok()
                {
                    stats.splits += 1;
                }
            }
            _ => {
                let shards = stream.shards();
                let mut open: Vec<_> = shards.iter().filter(|s| !s.closed).collect();
                open.sort_by_key(|s| s.hash_key_range.start);
                if open.len() > 1 {
                    let i = rng.random_range(0..open.len() - 1);
                    if stream.merge(&open[i].id, &open[i + 1].id).is_ok() {
                        stats.merges += 1;
                    }
                }
            }
        }
    }
    faults.clear();
    fleet.paused.clear();
    if fleet.live.is_empty() {
        fleet.join();
    }

    // Drain: stop producing, then wait until everything written was delivered.
    sleep(Duration::from_secs(2)).await;
    producing.cancel();
    let _ = producer.await;
    let mut violations = Vec::new();
    let written = written(&stream);
    let total: usize = written.values().map(Vec::len).sum();
    let drain_deadline = Instant::now() + Duration::from_secs(120);
    while delivered_count(&fleet.log, &written) < total && Instant::now() < drain_deadline {
        sleep(Duration::from_millis(500)).await;
    }

    // 6. Balance: every live worker holds floor(S/W) or ceil(S/W), for two cycles running.
    let mut cycles = 0;
    let mut streak = 0;
    let mut last = Vec::new();
    while streak < 2 {
        if cycles == BALANCE_CYCLES {
            violations.push(format!(
                "balance: not reached within {BALANCE_CYCLES} taker cycles of the drain"
            ));
            violations.extend(last);
            break;
        }
        sleep(config().taker_interval).await;
        cycles += 1;
        last = balance(&fleet, &store).await;
        streak = if last.is_empty() { streak + 1 } else { 0 };
    }

    let ids: Vec<String> = fleet.live.keys().cloned().collect();
    for id in ids {
        fleet.remove(&id, false).await;
    }

    let journal = fleet.log.lock();
    let store_events = store.journal();
    stats.refused_checkpoints = journal.attempts.iter().filter(|a| !a.ok).count();
    stats.processors = journal.instances.len();
    stats.deliveries = journal.deliveries.len();
    stats.handoffs = store_events
        .iter()
        .filter(|e| {
            e.operation == "take"
                && e.lease
                    .owner
                    .as_ref()
                    .is_some_and(|o| o.as_str() != e.client)
        })
        .count();
    let shards = stream.shards();
    violations.extend(checks::check(&Evidence {
        journal: &journal,
        store: &store_events,
        shards: &shards,
        written: &written,
        failover: config().failover_time,
    }));
    Outcome {
        violations,
        records: total,
        balance_cycles: cycles,
        stats,
    }
}

fn written(stream: &MemoryStream) -> BTreeMap<ShardId, Vec<SequenceNumber>> {
    stream
        .shards()
        .into_iter()
        .map(|s| {
            let seqs = stream
                .records(&s.id)
                .into_iter()
                .map(|r| r.sequence_number)
                .collect();
            (s.id, seqs)
        })
        .collect()
}

fn delivered_count(log: &Log, written: &BTreeMap<ShardId, Vec<SequenceNumber>>) -> usize {
    let journal = log.lock();
    let delivered: std::collections::BTreeSet<(&ShardId, &SequenceNumber)> = journal
        .deliveries
        .iter()
        .map(|d| (&d.shard, &d.sequence))
        .collect();
    written
        .iter()
        .map(|(shard, seqs)| {
            seqs.iter()
                .filter(|s| delivered.contains(&(shard, *s)))
                .count()
        })
        .sum()
}

/// How many taker cycles after the drain the fleet may take to balance.
const BALANCE_CYCLES: u32 = 20;

/// What is unbalanced now (empty if balanced).
async fn balance(fleet: &Fleet, store: &MemoryLeaseStore) -> Vec<String> {
    let mut violations = Vec::new();
    let leases = store.list().await.unwrap_or_default();
    let lineage = Lineage::new(&leases);
    let ready = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key) && lineage.is_ready(l))
        .count();
    let workers = fleet.live.len();
    let (lo, hi) = (ready / workers, ready.div_ceil(workers));
    let counts: BTreeMap<&String, usize> = fleet
        .live
        .iter()
        .map(|(id, m)| (id, m.status.borrow().held.len()))
        .collect();
    if counts.values().any(|c| !(lo..=hi).contains(c)) {
        violations.push(format!(
            "balance: {ready} ready leases over {workers} workers, held {counts:?}"
        ));
        for l in &leases {
            violations.push(format!(
                "  lease {} owner {:?} counter {} checkpoint {} parents {:?} handoff {:?}",
                l.key, l.owner, l.counter, l.checkpoint, l.parent_shard_ids, l.handoff_to
            ));
        }
    }
    violations
}

fn run_seed(seed: u64) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(simulate(seed))
}

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|s| s == INJECTED_PANIC);
        if !injected {
            default_hook(info);
        }
    }));

    if std::env::var_os("SIM_LOG").is_some() {
        // Replaying one seed with SIM_LOG=debug (an EnvFilter) shows what the workers did.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("SIM_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match (env("SIM_SEED"), env("SIM_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, n) => (0..n.unwrap_or(200)).collect(),
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(seeds.len().max(1));
    let results: Vec<(u64, Outcome)> = std::thread::scope(|scope| {
        let chunks: Vec<Vec<u64>> = (0..threads)
            .map(|t| seeds.iter().copied().skip(t).step_by(threads).collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|s| (s, run_seed(s)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("simulation thread"))
            .collect()
    });

    let mut violations = 0;
    let mut records = 0;
    let mut stats = Stats::default();
    for (seed, outcome) in &results {
        records += outcome.records;
        stats += outcome.stats;
        if !outcome.violations.is_empty() {
            violations += outcome.violations.len();
            eprintln!("seed {seed}: {} violations", outcome.violations.len());
            for v in outcome.violations.iter().take(60) {
                eprintln!("  {v}");
            }
            eprintln!("  replay: SIM_SEED={seed} cargo test -p kcl-core --test simulation");
        }
    }
    let mut cycles: Vec<u32> = results.iter().map(|(_, o)| o.balance_cycles).collect();
    cycles.sort_unstable();
    if let (Some(median), Some(max)) = (cycles.get(cycles.len() / 2), cycles.last()) {
        eprintln!("taker cycles to a stable balance after the drain: median {median}, max {max}");
    }
    eprintln!("faults and events over all seeds: {stats:?}");
    println!(
        "simulation: {} seeds, {violations} violations, {records} records",
        results.len()
    );
    if violations > 0 {
        std::process::exit(1);
    }
}
